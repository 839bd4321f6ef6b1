# shellcheck shell=bash
# Helpers sourced by the run_*.sh recipes: early checks with messages that say what to set, the data-prep
# step, and DRY_RUN=1 (print the final command instead of running it; checks and data prep are skipped).

gigpo_fail() {
    echo "error: $*" >&2
    exit 1
}

gigpo_dry_run() {
    [[ "${DRY_RUN:-0}" != "0" ]]
}

# gigpo_check_gpus N: at least N NVIDIA GPUs are visible.
gigpo_check_gpus() {
    gigpo_dry_run && return 0
    command -v nvidia-smi >/dev/null 2>&1 || gigpo_fail "no NVIDIA GPU found (nvidia-smi is missing). These recipes \
train with verl on GPUs (vLLM + FSDP, see requirements-gpu.txt). On a CPU or to try things out use \`make demo\` or \
\`python -m verl_gigpo.local.train\`. To only print the command, set DRY_RUN=1."
    local visible
    visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    if (( visible < $1 )); then
        gigpo_fail "N_GPUS=$1 but $visible GPU(s) are visible; set N_GPUS=$visible (or CUDA_VISIBLE_DEVICES)"
    fi
}

# gigpo_check_model PATH_OR_ID: a local path must exist; a hub id (org/name) is left to verl to download.
gigpo_check_model() {
    gigpo_dry_run && return 0
    local model=$1
    if [[ "$model" == /* || "$model" == ./* || "$model" == ~* || "$model" == ../* ]]; then
        [[ -d "$model" ]] || gigpo_fail "MODEL_PATH=$model does not exist; set MODEL_PATH to a local model \
folder or a Hugging Face id such as Qwen/Qwen2.5-1.5B-Instruct"
    elif [[ "${HF_HUB_OFFLINE:-0}" == "1" && ! -d "$model" ]]; then
        gigpo_fail "MODEL_PATH=$model is a hub id but HF_HUB_OFFLINE=1; set MODEL_PATH to a local model folder"
    fi
}

# gigpo_prepare_data ENV OUT_DIR TRAIN_SIZE [extra prepare args...]: write OUT_DIR/{train,val}.parquet unless present.
gigpo_prepare_data() {
    local env_name=$1 out=$2 train_size=$3
    shift 3
    local cmd=("${PYTHON:-python3}" -m verl_gigpo.data.prepare --env "$env_name" --train-size "$train_size" --out "$out" "$@")
    if gigpo_dry_run; then
        printf '# data prep (runs when %s/train.parquet or val.parquet is missing):\n# ' "$out"
        printf '%q ' "${cmd[@]}"
        printf '\n'
    elif [[ -f "$out/train.parquet" && -f "$out/val.parquet" ]]; then
        echo "using task files in $out" >&2
    else
        "${cmd[@]}"
    fi
}

# gigpo_run CMD...: run the command, or print it (one argument per line) when DRY_RUN is set.
gigpo_run() {
    if gigpo_dry_run; then
        if [[ "${2:-}" == "-m" ]]; then
            printf '%q -m %q' "$1" "$3"
            shift 3
        else
            printf '%q' "$1"
            shift
        fi
        local arg
        for arg in "$@"; do
            printf ' \\\n    %q' "$arg"
        done
        printf '\n'
    else
        exec "$@"
    fi
}

# gigpo_verl_overrides: fill the array GIGPO_VERL_OVERRIDES with the settings every recipe shares, one Hydra
# override per line: the model, the paper's actor settings (lr 1e-6, KL loss 0.01 low_var_kl, entropy 0.001),
# the vLLM rollout, the reference policy and the trainer. Reads MODEL_PATH, GROUP_SIZE, N_GPUS, TOTAL_ITERS,
# TEST_FREQ and EXPERIMENT. Recipes put these after their own settings; the user's "$@" comes last and wins.
gigpo_verl_overrides() {
    GIGPO_VERL_OVERRIDES=(
        actor_rollout_ref.model.path="$MODEL_PATH"
        actor_rollout_ref.model.use_remove_padding=true
        actor_rollout_ref.model.enable_gradient_checkpointing=true
        actor_rollout_ref.actor.optim.lr=1e-6
        # verl counts mini-batches in tasks: one optimizer step per 16 tasks x n trajectories' step rows
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
    )
}
