#!/usr/bin/env bash
# GPU install check (< 8 minutes on one GPU): a few GiGPO iterations of recipes/run_sokoban.sh with a small model
# through verl's real pipeline (Ray, vLLM rollout server, FSDP actor), then the metrics that prove each part ran.
#
#   pip install -r requirements-gpu.txt && pip install -e ".[test]"
#   MODEL_PATH=/path/to/Qwen2.5-0.5B-Instruct bash tests/gpu/check_gpu.sh
#
# MODEL_PATH: a local folder (or hub id when the machine has network). N_GPUS defaults to the visible GPU count.
# Exit status 0 = verl trained with adv_estimator=gigpo and logged gigpo/*, env/* and actor metrics.
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
N_GPUS=${N_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0)}
ITERS=${ITERS:-3}
OUT=${OUT:-$(mktemp -d /tmp/gigpo-gpu-check.XXXXXX)}
LOG="$OUT/train.log"

if (( N_GPUS < 1 )); then
    echo "error: no GPU visible (nvidia-smi -L lists none); this check needs one" >&2
    exit 1
fi
python3 -c "import vllm, verl_gigpo" || {
    echo "error: vllm or verl_gigpo is not importable: pip install -r requirements-gpu.txt && pip install -e ." >&2
    exit 1
}
echo "checking verl-gigpo on $N_GPUS GPU(s) with $MODEL_PATH; logs in $LOG"

MODEL_PATH="$MODEL_PATH" N_GPUS="$N_GPUS" DATA_DIR="$OUT/data" TOTAL_ITERS="$ITERS" TEST_FREQ="$ITERS" \
    TRAIN_TASKS_PER_ITER=8 GROUP_SIZE=4 VAL_SIZE=16 EXPERIMENT=gpu_check \
    timeout 450 bash recipes/run_sokoban.sh \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    trainer.save_freq=-1 \
    trainer.default_local_dir="$OUT/ckpt" 2>&1 | tee "$LOG"

status=0
for metric in "gigpo/step_group_size_mean" "gigpo/frac_singleton_step_groups" "env/success_rate" \
    "env/invalid_action_rate" "actor/pg_loss" "val-core/sokoban"; do
    if grep -q "$metric" "$LOG"; then
        echo "ok    $metric: $(grep -o "$metric[^ ,]*[: ]*[-0-9.e]*" "$LOG" | tail -1)"
    else
        echo "MISSING $metric" >&2
        status=1
    fi
done
exit $status
