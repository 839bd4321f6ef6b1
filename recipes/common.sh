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
