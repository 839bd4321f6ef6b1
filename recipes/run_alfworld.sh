#!/usr/bin/env bash
# GiGPO on ALFWorld as the paper's reference implementation runs it (verl-agent examples/gigpo_trainer/
# run_alfworld.sh, Qwen2.5-1.5B-Instruct): group size 8, 16 tasks per iteration, at most 50 steps, gamma 0.95, w = 1,
# mean_std, history 2, lr 1e-6, KL loss 0.01 (low_var_kl), entropy 0.001, invalid-action penalty 0.1, 256 step rows
# per optimizer step, 150 iterations, validation every 5 iterations on valid_seen (temperature 0.4, sampled).
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md).
#
#   ALFWORLD_DATA=~/.cache/alfworld bash recipes/run_alfworld.sh
#   ADV_ESTIMATOR=grpo bash recipes/run_alfworld.sh        # the paper's GRPO baseline on the same settings
#   ADV_ESTIMATOR=hgpo bash recipes/run_alfworld.sh        # HGPO as its authors ran it (also graphgpo, g2po)
#   DYNAMIC=episode bash recipes/run_alfworld.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_alfworld.sh   # verl's pipeline on this CPU, tiny model
#   LORA_RANK=64 MODEL_PATH=Qwen/Qwen2.5-7B-Instruct bash recipes/run_alfworld.sh   # the reference's LoRA run (7B)
#   DRY_RUN=1 bash recipes/run_alfworld.sh                 # print the final command only
#   bash recipes/run_alfworld.sh trainer.total_training_steps=10   # extra Hydra overrides go last
#   LOGGER=console,file,wandb bash recipes/run_alfworld.sh   # also log to wandb (or tensorboard)
#
# Metrics: one JSON line per iteration in checkpoints/verl_gigpo/$EXPERIMENT/metrics.jsonl (the path is printed at
# start; a resumed launch continues it). A second launch with the same EXPERIMENT resumes from its last
# checkpoint and says so; see docs/runs.md.
#
# ALFWORLD_DATA: the real games (`alfworld-download` on a machine with GitHub access), or synthetic ones from
# `python -m environments.alfworld.synth --out DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
# DEVICE=cpu: verl's pipeline on this CPU with small defaults (see gigpo_device_setup in common.sh)
gigpo_device_setup alfworld

# PYTHON: as given, else the repository's .venv/ when no environment is active, else python3 (common.sh)
gigpo_python_setup
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}
ALFWORLD_DATA=${ALFWORLD_DATA:-}
if gigpo_dry_run; then ALFWORLD_DATA=${ALFWORLD_DATA:-/path/to/alfworld_data}; fi
DATA_DIR=${DATA_DIR:-$HOME/data/verl-gigpo/alfworld}
# GPUs per node; default: the GPUs this machine shows (nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES)
N_GPUS=${N_GPUS:-$(gigpo_default_n_gpus)}
# Ray nodes to train on, N_GPUS GPUs each; NNODES > 1 joins the running Ray cluster at RAY_ADDRESS
# (docs/multi-node.md)
NNODES=${NNODES:-1}
ADV_ESTIMATOR=${ADV_ESTIMATOR:-gigpo}
# hgpo, graphgpo, g2po: their authors' settings for alfworld wherever a variable is not set (common.sh)
gigpo_estimator_setup alfworld
# prompt tokens (data.max_prompt_length) and the advantage normalisation of the step-credit estimators
PROMPT_LENGTH=${PROMPT_LENGTH:-2048}
ADV_NORM=${ADV_NORM:-mean_std}
MAX_STEPS=${MAX_STEPS:-50}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-512}
# a prompt over data.max_prompt_length: fail_episode = the reference's rule, as near as a run that goes on allows
# (recipes/reference_settings.yaml); drop_history or cut_left shorten it instead (docs/environments.md, "Prompts")
PROMPT_OVERLONG=${PROMPT_OVERLONG:-fail_episode}
# training tasks: 3,553 = every game of ALFWorld's training split (json_2.1.1/train as alfworld-download fetches it),
# which the reference samples from; seeds map to games so that any TRAIN_SIZE draws every task type (data prep
# reports the counts it wrote); a larger split than 3,553 games needs a larger TRAIN_SIZE to cover it
TRAIN_SIZE=${TRAIN_SIZE:-3553}
# validation tasks: empty = every game of VAL_SPLIT
VAL_SIZE=${VAL_SIZE:-}
VAL_SPLIT=${VAL_SPLIT:-valid_seen}
GROUP_SIZE=${GROUP_SIZE:-8}
TRAIN_TASKS_PER_ITER=${TRAIN_TASKS_PER_ITER:-16}
TOTAL_ITERS=${TOTAL_ITERS:-150}
TEST_FREQ=${TEST_FREQ:-5}
# step rows per optimizer step: the reference's ppo_mini_batch_size (256 rows, as its rollout.n is 1)
MINI_BATCH_ROWS=${MINI_BATCH_ROWS:-256}
MICRO_BATCH_PER_GPU=${MICRO_BATCH_PER_GPU:-32}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-32}
KL_COEF=${KL_COEF:-0.01}
ENTROPY_COEF=${ENTROPY_COEF:-0.001}
VAL_TEMPERATURE=${VAL_TEMPERATURE:-0.4}
VAL_DO_SAMPLE=${VAL_DO_SAMPLE:-true}
# checkpoints (every 50 iterations) kept on disk; trainer.max_actor_ckpt_to_keep=null as an override keeps all
MAX_CKPTS_TO_KEEP=${MAX_CKPTS_TO_KEEP:-2}
# EXPERIMENT (the experiment folder): alfworld_<estimator>_<model folder>[_lora<R>][_think<0|1>] (common.sh)
gigpo_experiment_setup alfworld

# EVAL_ONLY=1: evaluate CKPT (a verl checkpoint or a Hugging Face folder) on VAL_SPLIT instead of training
gigpo_eval_setup alfworld
gigpo_check_gpus "$N_GPUS"
gigpo_check_model "$MODEL_PATH"
if ! gigpo_dry_run; then
    # the data folder: json_2.1.1/<split>/.../game.tw-pddl (the games) and logic/ (docs/environments.md, "ALFWorld")
    get_games="\`alfworld-download\` fills ~/.cache/alfworld on a machine with GitHub access (copy that folder to \
this machine), or \`$PYTHON -m environments.alfworld.synth --out DIR\` writes synthetic games offline"
    [[ -n "$ALFWORLD_DATA" ]] || gigpo_fail "ALFWORLD_DATA is not set: set it to the ALFWorld data folder, which \
holds json_2.1.1/ (the games) and logic/; $get_games"
    [[ -d "$ALFWORLD_DATA" ]] || gigpo_fail "ALFWORLD_DATA=$ALFWORLD_DATA does not exist (or is not a folder): set it \
to the ALFWorld data folder, which holds json_2.1.1/ (the games) and logic/; $get_games"
    [[ -d "$ALFWORLD_DATA/json_2.1.1" ]] || gigpo_fail "ALFWORLD_DATA=$ALFWORLD_DATA has no json_2.1.1/ folder: \
set it to the ALFWorld data folder, which holds json_2.1.1/ (the games) and logic/; $get_games"
fi
# the shared settings (their checks run here, before data prep), then what this launch resumes: a run that has
# already trained TOTAL_ITERS iterations stops here (common.sh)
gigpo_verl_overrides
gigpo_check_resume "$@"
gigpo_prepare_data alfworld "$DATA_DIR" "$TRAIN_SIZE" --val-split "$VAL_SPLIT" ${VAL_SIZE:+--val-size "$VAL_SIZE"} \
    --env-kwargs "{\"data_path\": $(gigpo_json_string "$ALFWORLD_DATA")}"

cmd=(
    "$PYTHON" -m verl_gigpo.main
    algorithm.adv_estimator="$ADV_ESTIMATOR"
    algorithm.gamma=0.95
    algorithm.gigpo.step_advantage_w=1.0
    algorithm.gigpo.norm="$ADV_NORM"
    algorithm.gigpo.key_mode=observation
    algorithm.norm_adv_by_std_in_grpo=true
    algorithm.use_kl_in_reward=false
    env.name=alfworld
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
    # the reference's prompt (recipes/reference_settings.yaml): one quoted admissible action per line; a prompt over
    # data.max_prompt_length ends its episode (the reference's data.truncation=error stops the run)
    env.prompt.admissible_actions=lines
    env.prompt.overlong="$PROMPT_OVERLONG"
    +env.kwargs.data_path="$(gigpo_hydra_quote "$ALFWORLD_DATA")"
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
