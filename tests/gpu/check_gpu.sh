#!/usr/bin/env bash
# GPU install check (< 8 minutes on one GPU): first the attention backend the FSDP workers will use (flash-attn,
# or the recipes' sdpa fallback), then a few GiGPO iterations of recipes/run_sokoban.sh with a small model through
# verl's real pipeline (Ray, vLLM rollout server, FSDP actor), then the metrics that prove each part ran.
#
#   pip install -r requirements-gpu.txt && pip install -e ".[test]"                       (docs/gpu.md#install)
#   MODEL_PATH=/path/to/Qwen2.5-0.5B-Instruct bash tests/gpu/check_gpu.sh
#
# MODEL_PATH: a local folder (or hub id when the machine has network). N_GPUS defaults to the visible GPU count.
# PYTHON: chosen as the recipes choose it (recipes/common.sh, gigpo_python_setup).
# REQUIRE_FLASH_ATTN=1: a flash_attn that does not import is an error (default: a warning, the run uses sdpa).
# Exit status 0 = verl trained with adv_estimator=gigpo, with the attention backend reported at the start, and
# logged gigpo/*, env/* and actor metrics. The summary is printed whether or not the run finished.
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/common.sh

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
ITERS=${ITERS:-3}

command -v nvidia-smi >/dev/null 2>&1 || gigpo_fail "nvidia-smi is not on PATH: this check needs an NVIDIA GPU \
and its driver (580 or newer for torch 2.11's CUDA 13 wheels; docs/gpu.md#install). Without a GPU, check the CPU \
path instead: make e2e"
N_GPUS=${N_GPUS:-$(gigpo_visible_gpus)}
if [[ ! "$N_GPUS" =~ ^[1-9][0-9]*$ ]]; then
    gigpo_fail "N_GPUS=$N_GPUS: this check needs at least one GPU (the default is the GPUs nvidia-smi -L lists, \
limited by CUDA_VISIBLE_DEVICES)"
fi
gigpo_python_setup
OUT=${OUT:-$(mktemp -d /tmp/gigpo-gpu-check.XXXXXX)}
mkdir -p "$OUT"
LOG="$OUT/train.log"

# 1. the attention backend: verl's model config defaults to flash_attention_2 (verl/workers/config/model.py)
if version=$("$PYTHON" -c "import flash_attn; print(flash_attn.__version__)" 2>"$OUT/flash_attn.err"); then
    ATTN=flash_attention_2
    echo "ok    attention: flash_attention_2 (flash_attn $version)"
elif [[ "${REQUIRE_FLASH_ATTN:-0}" == 1 ]]; then
    gigpo_fail "flash_attn does not import with $PYTHON ($(tail -1 "$OUT/flash_attn.err")); add it as \
docs/gpu.md#flash-attn says"
else
    ATTN=sdpa
    echo "WARN  attention: flash_attn does not import ($(tail -1 "$OUT/flash_attn.err")): the recipes fall back to" \
        "sdpa (docs/gpu.md#flash-attn); REQUIRE_FLASH_ATTN=1 makes this an error"
fi

"$PYTHON" -c "import vllm" 2>"$OUT/vllm.err" || gigpo_fail "vllm does not import with $PYTHON \
($(tail -1 "$OUT/vllm.err")): install requirements-gpu.txt as docs/gpu.md#install says"
echo "checking verl-gigpo on $N_GPUS GPU(s) with $MODEL_PATH and $PYTHON; logs in $LOG"

# the run's exit status is kept (not fatal under set -e) so that the summary below is printed either way
run_status=0
# OBSERVATION=text: the text Sokoban, for the small text model (the recipe's default is the image run)
PYTHON="$PYTHON" ATTN_IMPLEMENTATION="$ATTN" MODEL_PATH="$MODEL_PATH" N_GPUS="$N_GPUS" DATA_DIR="$OUT/data" \
    OBSERVATION=text TOTAL_ITERS="$ITERS" TEST_FREQ="$ITERS" \
    TRAIN_TASKS_PER_ITER=8 GROUP_SIZE=4 VAL_SIZE=16 EXPERIMENT=gpu_check \
    timeout 450 bash recipes/run_sokoban.sh \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    trainer.save_freq=-1 \
    trainer.default_local_dir="$OUT/ckpt" 2>&1 | tee "$LOG" || run_status=$?

status=0
# the run's config (verl's main_ppo prints it) holds the backend reported above
if grep -q "'attn_implementation': '$ATTN'" "$LOG"; then
    echo "ok    attn_implementation: $ATTN"
else
    echo "MISSING attn_implementation=$ATTN in the run's printed config" >&2
    status=1
fi
for metric in "gigpo/step_group_size_mean" "gigpo/frac_singleton_step_groups" "env/success_rate" \
    "env/invalid_action_rate" "actor/pg_loss" "val-core/sokoban"; do
    if grep -q "$metric" "$LOG"; then
        echo "ok    $metric: $(grep -o "$metric[^ ,]*[: ]*[-0-9.e]*" "$LOG" | tail -1)"
    else
        echo "MISSING $metric" >&2
        status=1
    fi
done
if ((run_status != 0)); then
    limit=""
    if ((run_status == 124)); then limit=" (timeout: stopped after 450 s)"; fi
    echo "FAILED recipes/run_sokoban.sh exited with status $run_status$limit; its output is above and in $LOG" >&2
    status=1
fi
exit $status
