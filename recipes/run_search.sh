#!/usr/bin/env bash
# GiGPO on search-augmented QA with the settings of the reference implementation's run (verl-agent
# examples/gigpo_trainer/run_search.sh): group size 5, 256 questions per iteration, at most 4 turns, history 4,
# similarity anchor keys at threshold 0.9 (observations are free text: retrieved passages), gamma 0.95, w = 1,
# mean_std, lr 1e-6 with 10% warm-up, KL loss 0.001, no entropy bonus, invalid-action penalty 0.01, 512 step rows
# per optimizer step, greedy validation every 50 iterations.
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md).
#
#   bash recipes/run_search.sh                                    # embedded BM25 over the generated corpus
#   RETRIEVER_URL=http://127.0.0.1:8000 bash recipes/run_search.sh   # a Search-R1-style retrieval server
#   ADV_ESTIMATOR=grpo bash recipes/run_search.sh
#   DYNAMIC=episode bash recipes/run_search.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_search.sh   # verl's pipeline on this CPU, tiny model
#   DRY_RUN=1 bash recipes/run_search.sh
#   LOGGER=console,file,wandb bash recipes/run_search.sh   # also log to wandb (or tensorboard)
#
# Metrics: one JSON line per iteration in checkpoints/verl_gigpo/$EXPERIMENT/metrics.jsonl (the path is printed at
# start; a resumed launch continues it). A second launch with the same EXPERIMENT resumes from its last
# checkpoint and says so; see docs/runs.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
# DEVICE=cpu: verl's pipeline on this CPU with small defaults (see gigpo_device_setup in common.sh)
gigpo_device_setup search

# PYTHON: as given, else the repository's .venv/ when no environment is active, else python3 (common.sh)
gigpo_python_setup
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl-gigpo/search}
# GPUs per node; default: the GPUs this machine shows (nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES)
N_GPUS=${N_GPUS:-$(gigpo_default_n_gpus)}
# Ray nodes to train on, N_GPUS GPUs each; NNODES > 1 joins the running Ray cluster at RAY_ADDRESS
# (docs/multi-node.md)
NNODES=${NNODES:-1}
ADV_ESTIMATOR=${ADV_ESTIMATOR:-gigpo}
# hgpo, graphgpo, g2po: their authors' settings for search wherever a variable is not set (common.sh)
gigpo_estimator_setup search
# prompt tokens (data.max_prompt_length) and the advantage normalisation of the step-credit estimators
PROMPT_LENGTH=${PROMPT_LENGTH:-4096}
ADV_NORM=${ADV_NORM:-mean_std}
MAX_STEPS=${MAX_STEPS:-4}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-512}
TRAIN_SIZE=${TRAIN_SIZE:-4096}
VAL_SIZE=${VAL_SIZE:-256}
RETRIEVER_URL=${RETRIEVER_URL:-}
GROUP_SIZE=${GROUP_SIZE:-5}
TRAIN_TASKS_PER_ITER=${TRAIN_TASKS_PER_ITER:-256}
TOTAL_ITERS=${TOTAL_ITERS:-200}
TEST_FREQ=${TEST_FREQ:-50}
# step rows per optimizer step: the reference's ppo_mini_batch_size (512 rows, as its rollout.n is 1)
MINI_BATCH_ROWS=${MINI_BATCH_ROWS:-512}
MICRO_BATCH_PER_GPU=${MICRO_BATCH_PER_GPU:-16}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-32}
KL_COEF=${KL_COEF:-0.001}
ENTROPY_COEF=${ENTROPY_COEF:-0}
# greedy validation: the reference leaves verl's val_kwargs (temperature 0, do_sample false)
VAL_TEMPERATURE=${VAL_TEMPERATURE:-0}
VAL_DO_SAMPLE=${VAL_DO_SAMPLE:-false}
# checkpoints (every 50 iterations) kept on disk; trainer.max_actor_ckpt_to_keep=null as an override keeps all
MAX_CKPTS_TO_KEEP=${MAX_CKPTS_TO_KEEP:-2}
# the evaluation split (every validation task comes from it): test
VAL_SPLIT=${VAL_SPLIT:-test}
# EXPERIMENT (the experiment folder): search_<estimator>_<model folder>[_lora<R>][_think<0|1>] (common.sh)
gigpo_experiment_setup search

# EVAL_ONLY=1: evaluate CKPT (a verl checkpoint or a Hugging Face folder) on VAL_SPLIT instead of training
gigpo_eval_setup search
gigpo_check_gpus "$N_GPUS"
gigpo_check_model "$MODEL_PATH"
# the shared settings (their checks run here, before data prep), then what this launch resumes: a run that has
# already trained TOTAL_ITERS iterations stops here (common.sh)
gigpo_verl_overrides
gigpo_check_resume "$@"
gigpo_prepare_data search "$DATA_DIR" "$TRAIN_SIZE" --val-size "$VAL_SIZE" --val-split "$VAL_SPLIT"

retriever=()
if [[ -n "$RETRIEVER_URL" ]]; then
    retriever=(+env.kwargs.retriever_url="$(gigpo_hydra_quote "$RETRIEVER_URL")")
fi

cmd=(
    "$PYTHON" -m verl_gigpo.main
    algorithm.adv_estimator="$ADV_ESTIMATOR"
    algorithm.gamma=0.95
    algorithm.gigpo.step_advantage_w=1.0
    algorithm.gigpo.norm="$ADV_NORM"
    algorithm.gigpo.key_mode=similarity
    algorithm.gigpo.similarity_threshold=0.9
    # the reference's grouping: difflib's ratio, greedy first-fit in row order (docs/estimators.md)
    algorithm.gigpo.similarity_grouping=difflib_first_fit
    algorithm.norm_adv_by_std_in_grpo=true
    algorithm.use_kl_in_reward=false
    env.name=search
    env.max_steps="$MAX_STEPS"
    env.history_length=4
    env.invalid_action_penalty=0.01
    # the reference's rule: only a broken reply format is invalid (penalised); a well-formed command goes to the
    # environment even when it is not an action there (docs/environments.md, "The format rule of each environment")
    env.invalid_action=format
    # the reference's prompt (recipes/reference_settings.yaml): a reply without a search or answer block shows an
    # empty action in the history; a prompt over data.max_prompt_length is cut from the left (data.truncation=left)
    env.prompt.invalid_reply_tail=0
    env.prompt.overlong=cut_left
    "${retriever[@]}"
    data.train_files="$(gigpo_hydra_quote "$DATA_DIR/train.parquet")"
    data.val_files="$(gigpo_hydra_quote "$DATA_DIR/val.parquet")"
    data.train_batch_size="$TRAIN_TASKS_PER_ITER"
    data.max_prompt_length="$PROMPT_LENGTH"
    data.max_response_length="$RESPONSE_LENGTH"
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
    data.filter_overlong_prompts=false
    data.return_raw_chat=true
    # the estimator's own options (gigpo_estimator_setup)
    "${GIGPO_ESTIMATOR_OVERRIDES[@]}"
    "${GIGPO_VERL_OVERRIDES[@]}"
    "$@"
)
gigpo_launch "${cmd[@]}"
