#!/usr/bin/env bash
# GiGPO on Sokoban (6x6 rooms, 1 box, as in the paper's appendix), text observations, state anchor keys
# (the grid). Group size 8, 32 tasks per iteration, at most 15 steps, gamma 0.95, w = 1, mean_std, history 2.
#
#   bash recipes/run_sokoban.sh
#   ADV_ESTIMATOR=grpo bash recipes/run_sokoban.sh
#   MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct N_GPUS=1 TOTAL_ITERS=3 bash recipes/run_sokoban.sh   # quick GPU check
#   DRY_RUN=1 bash recipes/run_sokoban.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh

PYTHON=${PYTHON:-python3}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl-gigpo/sokoban}
N_GPUS=${N_GPUS:-2}
ADV_ESTIMATOR=${ADV_ESTIMATOR:-gigpo}
GROUP_SIZE=${GROUP_SIZE:-8}
TRAIN_TASKS_PER_ITER=${TRAIN_TASKS_PER_ITER:-32}
TOTAL_ITERS=${TOTAL_ITERS:-200}
TEST_FREQ=${TEST_FREQ:-10}
VAL_SIZE=${VAL_SIZE:-128}
EXPERIMENT=${EXPERIMENT:-sokoban_${ADV_ESTIMATOR}_$(basename "$MODEL_PATH")}

gigpo_check_gpus "$N_GPUS"
gigpo_check_model "$MODEL_PATH"
gigpo_prepare_data sokoban "$DATA_DIR" 4096 --val-size "$VAL_SIZE" --val-split test

cmd=(
    "$PYTHON" -m verl_gigpo.main
    algorithm.adv_estimator="$ADV_ESTIMATOR"
    algorithm.gamma=0.95
    algorithm.gigpo.step_advantage_w=1.0
    algorithm.gigpo.norm=mean_std
    algorithm.gigpo.key_mode=state
    algorithm.norm_adv_by_std_in_grpo=true
    env.name=sokoban
    env.max_steps=15
    env.history_length=2
    env.invalid_action_penalty=0.1
    data.train_files="$DATA_DIR/train.parquet"
    data.val_files="$DATA_DIR/val.parquet"
    data.train_batch_size="$TRAIN_TASKS_PER_ITER"
    data.max_prompt_length=1024
    data.max_response_length=256
    data.filter_overlong_prompts=false
    data.return_raw_chat=true
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=true
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.actor.use_kl_loss=true
    actor_rollout_ref.actor.kl_loss_coef=0.01
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0.001
    actor_rollout_ref.actor.fsdp_config.param_offload=false
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n="$GROUP_SIZE"
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.do_sample=true
    actor_rollout_ref.rollout.val_kwargs.temperature=0.4
    actor_rollout_ref.rollout.val_kwargs.n=1
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.ref.fsdp_config.param_offload=true
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.nnodes=1
    trainer.total_training_steps="$TOTAL_ITERS"
    trainer.total_epochs=1000
    trainer.test_freq="$TEST_FREQ"
    trainer.save_freq=50
    trainer.val_before_train=true
    trainer.critic_warmup=0
    trainer.logger='["console"]'
    trainer.project_name=verl_gigpo
    trainer.experiment_name="$EXPERIMENT"
    "$@"
)
gigpo_run "${cmd[@]}"
