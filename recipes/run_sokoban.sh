#!/usr/bin/env bash
# GiGPO on Sokoban (6x6 rooms, 1 box) with the settings of the reference implementation's run (verl-agent
# examples/gigpo_trainer/run_sokoban.sh), on text observations with state anchor keys (the grid): group size 8,
# 32 tasks per iteration, at most 15 steps, gamma 0.95, w = 1, norm "mean", history 2, lr 1e-6, KL loss 0.01,
# entropy 0.001, invalid-action penalty 0.1, 64 step rows per optimizer step, 150 iterations, validation every 5.
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md).
#
#   bash recipes/run_sokoban.sh
#   ADV_ESTIMATOR=grpo bash recipes/run_sokoban.sh
#   DYNAMIC=episode bash recipes/run_sokoban.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct N_GPUS=1 TOTAL_ITERS=3 bash recipes/run_sokoban.sh   # quick GPU check
#   MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_sokoban.sh   # verl's pipeline on this CPU, tiny model
#   DRY_RUN=1 bash recipes/run_sokoban.sh
#   LOGGER=console,file,wandb bash recipes/run_sokoban.sh   # also log to wandb (or tensorboard)
#
# Metrics: one JSON line per iteration in checkpoints/verl_gigpo/$EXPERIMENT/metrics.jsonl (the path is printed at
# start; a resumed launch continues it). A second launch with the same EXPERIMENT resumes from its last
# checkpoint and says so; see docs/runs.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
# DEVICE=cpu: verl's pipeline on this CPU with small defaults (see gigpo_device_setup in common.sh)
gigpo_device_setup sokoban

# PYTHON: as given, else the repository's .venv/ when no environment is active, else python3 (common.sh)
gigpo_python_setup
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl-gigpo/sokoban}
# GPUs per node; default: the GPUs this machine shows (nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES)
N_GPUS=${N_GPUS:-$(gigpo_default_n_gpus)}
# Ray nodes to train on, N_GPUS GPUs each; NNODES > 1 joins the running Ray cluster at RAY_ADDRESS
# (docs/multi-node.md)
NNODES=${NNODES:-1}
ADV_ESTIMATOR=${ADV_ESTIMATOR:-gigpo}
# hgpo, graphgpo, g2po: their authors' settings for sokoban wherever a variable is not set (common.sh)
gigpo_estimator_setup sokoban
# prompt tokens (data.max_prompt_length) and the advantage normalisation of the step-credit estimators
PROMPT_LENGTH=${PROMPT_LENGTH:-1024}
ADV_NORM=${ADV_NORM:-mean}
MAX_STEPS=${MAX_STEPS:-15}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-512}
# a prompt over data.max_prompt_length: fail_episode = the reference's rule, as near as a run that goes on allows
# (recipes/reference_settings.yaml); drop_history or cut_left shorten it instead (docs/environments.md, "Prompts")
PROMPT_OVERLONG=${PROMPT_OVERLONG:-fail_episode}
TRAIN_SIZE=${TRAIN_SIZE:-4096}
GROUP_SIZE=${GROUP_SIZE:-8}
TRAIN_TASKS_PER_ITER=${TRAIN_TASKS_PER_ITER:-32}
TOTAL_ITERS=${TOTAL_ITERS:-150}
TEST_FREQ=${TEST_FREQ:-5}
# step rows per optimizer step: the reference's ppo_mini_batch_size (64 rows, as its rollout.n is 1); micro-batches of
# 8 keep 64-row mini-batches on up to 8 GPUs (gigpo_check_mini_batch)
MINI_BATCH_ROWS=${MINI_BATCH_ROWS:-64}
MICRO_BATCH_PER_GPU=${MICRO_BATCH_PER_GPU:-8}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-8}
KL_COEF=${KL_COEF:-0.01}
ENTROPY_COEF=${ENTROPY_COEF:-0.001}
VAL_TEMPERATURE=${VAL_TEMPERATURE:-0.4}
VAL_DO_SAMPLE=${VAL_DO_SAMPLE:-true}
VAL_SIZE=${VAL_SIZE:-128}
# checkpoints (every 50 iterations) kept on disk; trainer.max_actor_ckpt_to_keep=null as an override keeps all
MAX_CKPTS_TO_KEEP=${MAX_CKPTS_TO_KEEP:-2}
# the evaluation split (every validation task comes from it): test
VAL_SPLIT=${VAL_SPLIT:-test}
# EXPERIMENT (the experiment folder): sokoban_<estimator>_<model folder>[_lora<R>][_think<0|1>] (common.sh)
gigpo_experiment_setup sokoban

# EVAL_ONLY=1: evaluate CKPT (a verl checkpoint or a Hugging Face folder) on VAL_SPLIT instead of training
gigpo_eval_setup sokoban
gigpo_check_gpus "$N_GPUS"
gigpo_check_model "$MODEL_PATH"
# the shared settings (their checks run here, before data prep), then what this launch resumes: a run that has
# already trained TOTAL_ITERS iterations stops here (common.sh)
gigpo_verl_overrides
gigpo_check_resume "$@"
gigpo_prepare_data sokoban "$DATA_DIR" "$TRAIN_SIZE" --val-size "$VAL_SIZE" --val-split "$VAL_SPLIT"

cmd=(
    "$PYTHON" -m verl_gigpo.main
    algorithm.adv_estimator="$ADV_ESTIMATOR"
    algorithm.gamma=0.95
    algorithm.gigpo.step_advantage_w=1.0
    algorithm.gigpo.norm="$ADV_NORM"
    algorithm.gigpo.key_mode=state
    algorithm.norm_adv_by_std_in_grpo=true
    env.name=sokoban
    env.max_steps="$MAX_STEPS"
    env.history_length=2
    env.invalid_action_penalty=0.1
    # the reference's rule: only a broken reply format is invalid (penalised); a well-formed command goes to the
    # environment even when it is not an action there (docs/environments.md, "The format rule of each environment")
    env.invalid_action=format
    # the reference's reply parsing: the command is read from the lower-cased reply and matched to an action as written
    # (docs/environments.md, "Reply parsing")
    env.parse.lowercase=true
    env.parse.collapse_whitespace=false
    # the reference's prompt (recipes/reference_settings.yaml): the four moves on one line; a prompt over
    # data.max_prompt_length ends its episode (the reference's data.truncation=error stops the run)
    env.prompt.admissible_actions=comma
    env.prompt.overlong="$PROMPT_OVERLONG"
    data.train_files="$(gigpo_hydra_quote "$DATA_DIR/train.parquet")"
    data.val_files="$(gigpo_hydra_quote "$DATA_DIR/val.parquet")"
    data.train_batch_size="$TRAIN_TASKS_PER_ITER"
    data.max_prompt_length="$PROMPT_LENGTH"
    data.max_response_length="$RESPONSE_LENGTH"
    data.filter_overlong_prompts=false
    data.return_raw_chat=true
    # the estimator's own options (gigpo_estimator_setup)
    "${GIGPO_ESTIMATOR_OVERRIDES[@]}"
    "${GIGPO_VERL_OVERRIDES[@]}"
    "$@"
)
gigpo_launch "${cmd[@]}"
