# shellcheck shell=bash
# Helpers sourced by the run_*.sh recipes: early checks with messages that say what to set, the data-prep
# step, and DRY_RUN=1: print the data-prep and final commands instead of running them. A dry run still checks the
# values of the variables (and stops on a bad one before printing anything); it skips the checks of the machine
# (GPUs, the Python's packages, the model folder, the data) and data prep (it says whether data prep would run:
# gigpo_prepare_data), and only notes an experiment that has already finished (gigpo_check_resume).

gigpo_fail() {
    echo "error: $*" >&2
    exit 1
}

# gigpo_dry_run: succeed when DRY_RUN=1, fail when DRY_RUN is 0, empty or unset; any other value stops the recipe
# naming it (DRY_RUN=false or DRY_RUN=yes would otherwise be taken one way or the other without a word).
gigpo_dry_run() {
    case "${DRY_RUN:-0}" in
        0) return 1 ;;
        1) return 0 ;;
        *) gigpo_fail "DRY_RUN=$DRY_RUN: use DRY_RUN=1 (print the data-prep and training commands, run nothing) or \
DRY_RUN=0 (run; the same as leaving it unset)" ;;
    esac
}

# --- Experiment: the default EXPERIMENT ----------------------------------------------------------------------------

# gigpo_experiment_setup ENV_NAME: set EXPERIMENT, unless the user set it, to
# <ENV_NAME>_<ADV_ESTIMATOR>_<model folder name>[_lora<R>][_think<0|1>]: a setting that changes what a checkpoint is
# gets its own experiment folder, so that a launch never resumes (or refuses to resume) a run of another kind. The
# suffixes: _lora<R> with LORA_RANK=R > 0 (the checkpoint holds a rank-R adapter; gigpo_lora_rank checks LORA_RANK),
# _think0 / _think1 with THINKING=0 / 1 (the prompts differ). Reads ADV_ESTIMATOR, MODEL_PATH, LORA_RANK, THINKING.
gigpo_experiment_setup() {
    [[ -n "${EXPERIMENT:-}" ]] && return 0
    gigpo_lora_rank
    EXPERIMENT="$1_${ADV_ESTIMATOR}${DYNAMIC:+_dynamic_$DYNAMIC}_$(basename "$MODEL_PATH")"
    if ((LORA_RANK > 0)); then EXPERIMENT+="_lora$LORA_RANK"; fi
    if [[ "${THINKING:-}" == [01] ]]; then EXPERIMENT+="_think$THINKING"; fi
}

# --- Python: the interpreter every step runs (data prep, the attention probe, verl) ------------------------------

# gigpo_python_setup: set PYTHON, the one place the recipes and tests/gpu/check_gpu.sh choose their Python:
#   1. PYTHON as given;
#   2. else, with no environment active (neither VIRTUAL_ENV nor CONDA_PREFIX set), the repository's
#      .venv/bin/python when it exists (`make install` creates it), said in one line on stderr;
#   3. else python3 from PATH (an active environment puts its own first).
# Then, except with DRY_RUN, one cheap check that this Python has the project installed: verl and verl_gigpo are
# found (importlib.util.find_spec, ~0.05 s; importing verl would take ~10 s) and verl_gigpo's `verl.plugins` entry
# point is there (without it verl never loads the plug-in). If not, one line names the Python and what to do, and the
# recipe stops.
gigpo_python_setup() {
    local root chosen="PYTHON=${PYTHON:-}"
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    if [[ -z "${PYTHON:-}" ]]; then
        if [[ -z "${VIRTUAL_ENV:-}" && -z "${CONDA_PREFIX:-}" && -x "$root/.venv/bin/python" ]]; then
            PYTHON=$root/.venv/bin/python
            chosen="the repository's .venv"
            echo "using $PYTHON (no virtual or conda environment is active; set PYTHON to use another)" >&2
        else
            PYTHON=python3
            chosen="python3 on PATH"
        fi
    fi
    gigpo_dry_run && return 0
    local install_hint="run with the Python this project is installed in (activate its environment or set \
PYTHON=/path/to/bin/python; \`make install\` creates .venv/, which the recipes use when no environment is active), \
or install it into this one (docs/gpu.md#install)"
    command -v "$PYTHON" >/dev/null 2>&1 || gigpo_fail "PYTHON=$PYTHON is not a command; $install_hint"
    # prints: <version> <what is missing: module names, 'plugin', or '-' for nothing> <executable>
    local report version missing exe
    report=$("$PYTHON" -c '
import importlib.util, platform, sys
missing = [name for name in ("verl", "verl_gigpo") if importlib.util.find_spec(name) is None]
if not missing:
    import importlib.metadata
    eps = importlib.metadata.entry_points()
    eps = eps.select(group="verl.plugins") if hasattr(eps, "select") else eps.get("verl.plugins", [])
    missing = [] if any(ep.name == "gigpo" for ep in eps) else ["plugin"]
print(platform.python_version(), ",".join(missing) or "-", sys.executable)
' 2>/dev/null) || gigpo_fail "PYTHON=$PYTHON could not run a one-line Python 3 check (this project needs Python \
3.10-3.12); $install_hint"
    read -r version missing exe <<<"$report"
    case "$missing" in
        -) ;;
        plugin) gigpo_fail "$exe (Python $version, $chosen) has verl but not this project installed (no \
'gigpo' in verl.plugins entry points, so verl would not load GiGPO): run \`$exe -m pip install -e .\` in $root, or \
set PYTHON to the Python it is installed in" ;;
        *) gigpo_fail "$exe (Python $version, $chosen) cannot import ${missing//,/ or }; $install_hint" ;;
    esac
}

# --- Quoting: values from variables (paths, names) reach Hydra and JSON intact ------------------------------------

# gigpo_hydra_quote VALUE: print VALUE as a Hydra override value that Hydra reads back as exactly that string. Plain
# paths and names (a letter or / first, then letters, digits, / . _ - @ + :) stay as they are, except the words Hydra
# reads as other types (true, false, null, inf, nan); anything else (a comma would make Hydra sweep, a " or a space
# would not parse, ${ would interpolate, 123 would be a number) is single-quoted with Hydra's escapes: \' for a quote,
# \${ for a literal ${, and backslashes doubled where they precede either or the closing quote.
gigpo_hydra_quote() {
    local value=$1
    if [[ "$value" =~ ^[A-Za-z/][A-Za-z0-9_./@+:-]*$ && ! "${value,,}" =~ ^(true|false|null|inf|nan)$ ]]; then
        printf '%s' "$value"
        return
    fi
    local out="" slashes="" char i
    for ((i = 0; i < ${#value}; i++)); do
        char=${value:i:1}
        if [[ "$char" == "\\" ]]; then
            slashes+="\\"
        elif [[ "$char" == "'" ]]; then
            out+="$slashes$slashes\\'"
            slashes=""
        elif [[ "$char" == "\$" && "${value:i+1:1}" == "{" ]]; then
            out+="$slashes$slashes\\\$"
            slashes=""
        else
            out+="$slashes$char"
            slashes=""
        fi
    done
    printf "'%s'" "$out$slashes$slashes"
}

# gigpo_json_string VALUE: print VALUE as a JSON string literal (quotes, backslashes and control characters escaped).
gigpo_json_string() {
    local value=$1
    value=${value//\\/\\\\}
    value=${value//\"/\\\"}
    value=${value//$'\n'/\\n}
    value=${value//$'\r'/\\r}
    value=${value//$'\t'/\\t}
    printf '"%s"' "$value"
}

# --- Device: DEVICE=cuda (GPUs: vLLM + FSDP) or DEVICE=cpu (verl's own pipeline on this CPU, a tiny model) --------

# gigpo_device_setup ENV_NAME: resolve DEVICE (default: cuda when a GPU is visible; without one, a run stops and says
# to pass DEVICE=cpu, a dry run prints the GPU command). DEVICE=cpu sets small defaults for every variable the user
# left unset (a tiny model, 4 tasks x 4 episodes, 2 iterations, short episodes and replies, its own data folder), so
# that a recipe finishes in minutes on a laptop: a check of the recipe, a config change or a new environment through
# verl's real pipeline (platform=cpu: verl_gigpo/config/platform/cpu.yaml), not a way to train a real model.
gigpo_device_setup() {
    local env_name=$1
    GIGPO_ENV=$env_name # the recipe's environment, for the messages that name its variables (gigpo_eval_command)
    if [[ -z "${DEVICE:-}" ]]; then
        if [[ "$(gigpo_visible_gpus)" =~ ^[1-9] ]] || gigpo_dry_run; then
            DEVICE=cuda
        else
            gigpo_fail "no NVIDIA GPU is visible. These recipes train on GPUs (vLLM + FSDP, requirements-gpu.txt); to \
run the same pipeline on this CPU with a tiny model, as a smoke test, set DEVICE=cpu (e.g. \
MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash $0). To learn on one machine use \`make demo\`. To only print the \
command, set DRY_RUN=1."
        fi
    fi
    case "$DEVICE" in
        cuda) ROLLOUT_NAME=vllm ;;
        cpu)
            ROLLOUT_NAME=hf
            MODEL_PATH=${MODEL_PATH:-artifacts/tiny-model}
            N_GPUS=${N_GPUS:-1}
            GROUP_SIZE=${GROUP_SIZE:-4}
            TRAIN_TASKS_PER_ITER=${TRAIN_TASKS_PER_ITER:-4}
            TOTAL_ITERS=${TOTAL_ITERS:-2}
            TEST_FREQ=${TEST_FREQ:-100}
            TRAIN_SIZE=${TRAIN_SIZE:-64}
            VAL_SIZE=${VAL_SIZE:-8}
            MAX_STEPS=${MAX_STEPS:-4}
            RESPONSE_LENGTH=${RESPONSE_LENGTH:-16}
            # a tiny model's tokenizer spends more tokens per character than the budgets were sized for (Sokoban's
            # prompt with history exceeds its 1,024): shorten such prompts instead of failing their episodes
            PROMPT_OVERLONG=${PROMPT_OVERLONG:-drop_history}
            DATA_DIR=${DATA_DIR:-$HOME/data/verl-gigpo/cpu/$env_name}
            ;;
        *) gigpo_fail "DEVICE=$DEVICE: use DEVICE=cuda (GPUs) or DEVICE=cpu (smoke test on this CPU)" ;;
    esac
}

# --- GPU count: N_GPUS defaults to the GPUs this process can see -------------------------------------------------

# gigpo_visible_gpus: print how many NVIDIA GPUs this process may use: the GPUs `nvidia-smi -L` lists, or fewer when
# CUDA_VISIBLE_DEVICES is set (one per entry; empty = none). Prints nothing when nvidia-smi is missing.
gigpo_visible_gpus() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    local listed entries=() entry count=0
    listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        IFS=',' read -r -a entries <<<"$CUDA_VISIBLE_DEVICES"
        for entry in "${entries[@]}"; do
            [[ -n "${entry// /}" ]] && count=$((count + 1))
        done
        ((count < listed)) && listed=$count
    fi
    echo "$listed"
}

# gigpo_default_n_gpus: the default of N_GPUS: the visible GPUs; 1 without nvidia-smi (DRY_RUN then prints a one-GPU
# command, and a real run stops in gigpo_check_gpus saying why).
gigpo_default_n_gpus() {
    local visible
    visible=$(gigpo_visible_gpus)
    echo "${visible:-1}"
}

# gigpo_check_positive_int NAME VALUE HINT: VALUE is a whole number >= 1, else stop naming NAME (also with DRY_RUN).
gigpo_check_positive_int() {
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || gigpo_fail "$1=$2 is not a whole number >= 1; $3"
}

# gigpo_check_whole_number NAME VALUE HINT: VALUE is a whole number >= 0 (digits only), else stop naming NAME (also
# with DRY_RUN).
gigpo_check_whole_number() {
    [[ "$2" =~ ^[0-9]+$ ]] || gigpo_fail "$1=$2 is not a whole number >= 0; $3"
}

# gigpo_check_gpus N: N (N_GPUS, GPUs per node) and NNODES are whole numbers >= 1 (also with DRY_RUN); NNODES > 1 needs
# RAY_ADDRESS, the running Ray cluster to join (docs/multi-node.md). On one machine (no RAY_ADDRESS) at least N NVIDIA
# GPUs must be visible (on DEVICE=cpu: N FSDP ranks on logical GPUs). With RAY_ADDRESS the cluster's nodes hold the
# GPUs, not necessarily this one: `python -m verl_gigpo.main` checks that NNODES x N_GPUS ranks fit on them.
gigpo_check_gpus() {
    gigpo_check_positive_int N_GPUS "$1" "set N_GPUS to the number of GPUs to train on (per node), e.g. N_GPUS=2 (the \
default is the number of visible GPUs: nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES)"
    gigpo_check_positive_int NNODES "$NNODES" "it is the number of Ray nodes to train on (trainer.nnodes), each with \
N_GPUS GPUs, e.g. NNODES=2 RAY_ADDRESS=<head>:6379 (docs/multi-node.md)"
    if ((NNODES > 1)) && [[ -z "${RAY_ADDRESS:-}" ]]; then
        gigpo_fail "NNODES=$NNODES trains on $NNODES Ray nodes, but RAY_ADDRESS is not set: start a Ray cluster (\
\`ray start --head\` here, \`ray start --address=<head>:6379\` on each other node; docs/multi-node.md) and set \
RAY_ADDRESS=<head>:6379, or set NNODES=1"
    fi
    gigpo_dry_run && return 0
    [[ "${DEVICE:-cuda}" == cpu ]] && return 0
    [[ -n "${RAY_ADDRESS:-}" ]] && return 0
    command -v nvidia-smi >/dev/null 2>&1 || gigpo_fail "no NVIDIA GPU found (nvidia-smi is missing). These recipes \
train with verl on GPUs (vLLM + FSDP, see requirements-gpu.txt). On a CPU or to try things out use \`make demo\` or \
\`$PYTHON -m verl_gigpo.local.train\`. To only print the command, set DRY_RUN=1."
    local visible
    visible=$(gigpo_visible_gpus)
    if ((visible < $1)); then
        gigpo_fail "N_GPUS=$1 but $visible GPU(s) are visible; set N_GPUS=$visible (or CUDA_VISIBLE_DEVICES)"
    fi
}

# gigpo_check_model PATH_OR_ID: a local path must exist; a hub id (org/name) is left to verl to download.
gigpo_check_model() {
    gigpo_dry_run && return 0
    local model=$1
    if [[ "${DEVICE:-cuda}" == cpu && ! -d "$model" ]]; then
        gigpo_fail "MODEL_PATH=$model is not a model folder. DEVICE=cpu runs a tiny local model: build one with \
\`$PYTHON -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model\` (or \`make e2e\`, which builds \
artifacts/tiny-model-actions) and set MODEL_PATH to it"
    fi
    if [[ "$model" == /* || "$model" == ./* || "$model" == ~* || "$model" == ../* ]]; then
        [[ -d "$model" ]] || gigpo_fail "MODEL_PATH=$model does not exist; set MODEL_PATH to a local model \
folder or a Hugging Face id such as Qwen/Qwen2.5-1.5B-Instruct"
    elif [[ "${HF_HUB_OFFLINE:-0}" == "1" && ! -d "$model" ]]; then
        gigpo_fail "MODEL_PATH=$model is a hub id but HF_HUB_OFFLINE=1; set MODEL_PATH to a local model folder"
    fi
}

#: the stamp gigpo_prepare_data writes beside train.parquet and val.parquet after a successful data prep: the data-prep
#: arguments that wrote them, one "--flag value" a line
GIGPO_PREP_STAMP=prepared_with.txt

# gigpo_prep_setting FLAG ENV_NAME: print the recipe variable behind the data-prep argument FLAG (a message about a
# changed setting names it).
gigpo_prep_setting() {
    local eval_only=0
    [[ "${EVAL_ONLY:-0}" == 1 ]] && eval_only=1
    case "$1" in
        --train-size) echo TRAIN_SIZE ;;
        --val-size) ((eval_only)) && echo EVAL_TASKS || echo VAL_SIZE ;;
        --val-split) ((eval_only)) && echo EVAL_SPLIT || echo VAL_SPLIT ;;
        --env) [[ "$2" == webshop* ]] && echo WEBSHOP_ENV || echo "the environment" ;;
        --env-kwargs) [[ "$2" == alfworld ]] && echo ALFWORLD_DATA || echo "the environment's arguments" ;;
        *) echo "$1" ;;
    esac
}

# gigpo_prep_stamp FLAG VALUE ...: print the stamp of these data-prep arguments (pairs of flag and value): a comment
# line, then "FLAG VALUE" a line (a newline inside a value written as \n).
gigpo_prep_stamp() {
    echo "# the arguments of python -m verl_gigpo.data.prepare that wrote the task files here (recipes/common.sh)"
    while (($# >= 2)); do
        printf '%s %s\n' "$1" "${2//$'\n'/\\n}"
        shift 2
    done
}

# gigpo_prep_reason OUT ENV_NAME FLAG VALUE ...: print why the task files in OUT must be written for these data-prep
# arguments, or nothing when OUT/$GIGPO_PREP_STAMP says they were written with exactly these. Reasons: a file is
# missing; the files have no stamp (an older recipe, a hand or an unfinished prep wrote them: their settings are
# unknown); settings differ (each named by its recipe variable, gigpo_prep_setting, with the argument's old and new
# value).
gigpo_prep_reason() {
    local out=$1 env_name=$2
    shift 2
    if [[ ! -f "$out/train.parquet" || ! -f "$out/val.parquet" ]]; then
        printf '%s' "$out has no train.parquet or val.parquet"
        return 0
    fi
    if [[ ! -f "$out/$GIGPO_PREP_STAMP" ]]; then
        printf '%s' "the task files in $out have no $GIGPO_PREP_STAMP (prepared by an older recipe or by hand, or by a \
data prep that did not finish), so the settings they hold are unknown"
        return 0
    fi
    local -A old=() new=()
    local line flag flags=() changes=""
    while IFS= read -r line; do
        [[ "$line" == --* ]] && old[${line%% *}]=${line#* }
    done <"$out/$GIGPO_PREP_STAMP"
    while IFS= read -r line; do
        [[ "$line" == --* ]] || continue
        new[${line%% *}]=${line#* }
        flags+=("${line%% *}")
    done < <(gigpo_prep_stamp "$@")
    for flag in "${!old[@]}"; do
        [[ -n "${new[$flag]+set}" ]] || flags+=("$flag")
    done
    for flag in "${flags[@]}"; do
        [[ "${old[$flag]-(not given)}" == "${new[$flag]-(not given)}" ]] && continue
        changes+="${changes:+; }$(gigpo_prep_setting "$flag" "$env_name"): $flag ${old[$flag]-(not given)} -> \
${new[$flag]-(not given)}"
    done
    [[ -z "$changes" ]] || printf '%s' "the task files in $out were prepared with other settings ($changes)"
}

# gigpo_prepare_data ENV OUT_DIR TRAIN_SIZE [FLAG VALUE ...]: write OUT_DIR/{train,val}.parquet with `python -m
# verl_gigpo.data.prepare --env ENV --train-size TRAIN_SIZE --out OUT_DIR FLAG VALUE ...`, unless the files there
# were written with these same arguments (gigpo_prep_reason). A run says in one line why it prepares them again
# (files present but without the stamp, or a changed setting), removes the old stamp first and writes the new one
# only after the prep succeeded (an interrupted prep is redone next time). DRY_RUN=1 prints the command as a comment,
# headed by whether and why it would run.
gigpo_prepare_data() {
    local env_name=$1 out=$2 train_size=$3
    shift 3
    local args=(--env "$env_name" --train-size "$train_size" "$@")
    local cmd=("$PYTHON" -m verl_gigpo.data.prepare --env "$env_name" --train-size "$train_size" --out "$out" "$@")
    local reason
    reason=$(gigpo_prep_reason "$out" "$env_name" "${args[@]}")
    if gigpo_dry_run; then
        if [[ -n "$reason" ]]; then
            printf '# data prep (runs: %s):\n# ' "$reason"
        else
            printf '# data prep (skipped: the task files in %s were written with these arguments):\n# ' "$out"
        fi
        printf '%q ' "${cmd[@]}"
        printf '\n'
    elif [[ -z "$reason" ]]; then
        echo "using task files in $out (written with this recipe's data-prep settings: $out/$GIGPO_PREP_STAMP)" >&2
    else
        [[ -f "$out/train.parquet" && -f "$out/val.parquet" ]] && echo "$reason: preparing them again" >&2
        rm -f "$out/$GIGPO_PREP_STAMP"
        "${cmd[@]}"
        gigpo_prep_stamp "${args[@]}" >"$out/$GIGPO_PREP_STAMP.tmp"
        mv -f "$out/$GIGPO_PREP_STAMP.tmp" "$out/$GIGPO_PREP_STAMP"
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

# --- Evaluation: EVAL_ONLY=1 evaluates a checkpoint with the recipe's settings ----------------------------------

# gigpo_check_eval_split ENV_NAME: EVAL_SPLIT is one of ENV_NAME's evaluation splits (the `splits` of its environment
# class but train, which data prep keeps for training tasks; one `$PYTHON -c`, ~0.4 s), else stop naming EVAL_SPLIT
# and the splits (also with DRY_RUN). When $PYTHON cannot tell (no environments package there, e.g. a dry run with
# another Python), data prep checks the split instead.
gigpo_check_eval_split() {
    local splits
    splits=$("$PYTHON" -c 'import sys
from environments import env_class
print(" ".join(split for split in env_class(sys.argv[1]).splits if split != "train"))' "$1" 2>/dev/null) || return 0
    [[ " $splits " == *" $EVAL_SPLIT "* ]] && return 0
    local names=${splits// /, }
    gigpo_fail "EVAL_SPLIT=$EVAL_SPLIT is not an evaluation split of $1; use ${names/%, ${splits##* }/ or ${splits##* }}\
$([[ "$EVAL_SPLIT" == train ]] && echo " (train holds the training tasks)")"
}

# gigpo_holds_evaluation FOLDER: succeed when FOLDER holds an evaluation (summary.json or transcripts/), which
# `python -m verl_gigpo.evaluate` refuses to write into (the transcripts would mix).
gigpo_holds_evaluation() {
    [[ -e "$1/summary.json" || -e "$1/transcripts" ]]
}

# gigpo_eval_out DEFAULT: set EVAL_OUT, the evaluation's folder. Unset: DEFAULT, numbered DEFAULT-2, DEFAULT-3 ... when
# it holds an evaluation (gigpo_holds_evaluation), as the evaluation's own default is, with one line naming the
# folder taken. Set by the user to a folder that holds an evaluation: the recipe stops naming EVAL_OUT (with DRY_RUN,
# a note, and the command is printed).
gigpo_eval_out() {
    local base=$1 number=1
    if [[ -n "${EVAL_OUT:-}" ]]; then
        gigpo_holds_evaluation "$EVAL_OUT" || return 0
        local message="EVAL_OUT=$EVAL_OUT already holds an evaluation (summary.json or transcripts/): set EVAL_OUT to \
another folder, or remove that one; unset, EVAL_OUT is a new folder under runs/eval/"
        if gigpo_dry_run; then
            echo "note: DRY_RUN=1 prints the command, but a launch would stop here: $message" >&2
            return 0
        fi
        gigpo_fail "$message"
    fi
    EVAL_OUT=$base
    while gigpo_holds_evaluation "$EVAL_OUT"; do
        number=$((number + 1))
        EVAL_OUT=$base-$number
    done
    if ((number > 1)); then
        echo "$base already holds an evaluation: this one goes to $EVAL_OUT (EVAL_OUT sets the folder)" >&2
    fi
    return 0
}

# gigpo_eval_setup ENV_NAME: with EVAL_ONLY=1 the recipe evaluates instead of training: `python -m verl_gigpo.evaluate
# --engine verl` runs the recipe's launch as verl's trainer.val_only (validation, then stop) on CKPT (a verl
# checkpoint, .../global_step_N, loaded by verl itself; or a Hugging Face folder; default MODEL_PATH) and writes the
# table of success per task type, its plot, the transcripts and summary.json into EVAL_OUT (default
# runs/eval/<experiment>-<checkpoint>-<split>, numbered when taken: gigpo_eval_out). EVAL_SPLIT (default VAL_SPLIT; one
# of ENV_NAME's evaluation splits, gigpo_check_eval_split) and EVAL_TASKS (default VAL_SIZE; a whole number >= 1)
# choose the tasks (their own task files under DATA_DIR/eval-<split>-<tasks>), EVAL_EPISODES the episodes per task
# (pass@k), EVAL_GREEDY=1 greedy decoding; each is checked, also with DRY_RUN. Reads MODEL_PATH, DATA_DIR, VAL_SPLIT,
# VAL_SIZE, EXPERIMENT; sets EVAL_MODEL, EVAL_OUT, EVAL_ARGS.
gigpo_eval_setup() {
    EVAL_ONLY=${EVAL_ONLY:-0}
    case "$EVAL_ONLY" in
        0) return 0 ;;
        1) ;;
        *) gigpo_fail "EVAL_ONLY=$EVAL_ONLY: use EVAL_ONLY=1 (evaluate CKPT instead of training) or 0" ;;
    esac
    EVAL_MODEL=${CKPT:-$MODEL_PATH}
    if [[ -f "$EVAL_MODEL/config.json" ]]; then
        MODEL_PATH=$EVAL_MODEL # a Hugging Face folder: the model itself
    elif [[ -n "${CKPT:-}" && ! -e "$CKPT" ]] && ! gigpo_dry_run; then
        gigpo_fail "CKPT=$CKPT does not exist; set it to a verl checkpoint (<experiment>/global_step_N) or a Hugging \
Face model folder"
    fi
    if [[ -n "${EVAL_TASKS:-}" ]]; then
        gigpo_check_positive_int EVAL_TASKS "$EVAL_TASKS" "it is how many tasks of the split are evaluated, the first \
N (unset: VAL_SIZE; ALFWorld: every game of the split)"
    fi
    [[ -z "${EVAL_SPLIT:-}" ]] || gigpo_check_eval_split "$1"
    VAL_SPLIT=${EVAL_SPLIT:-$VAL_SPLIT}
    VAL_SIZE=${EVAL_TASKS:-$VAL_SIZE}
    DATA_DIR="$DATA_DIR/eval-$VAL_SPLIT-${VAL_SIZE:-all}"
    gigpo_eval_out "runs/eval/$EXPERIMENT-$(basename "$EVAL_MODEL")-$VAL_SPLIT"
    EVAL_ARGS=(--engine verl --out "$EVAL_OUT")
    if [[ -n "${EVAL_EPISODES:-}" ]]; then
        gigpo_check_positive_int EVAL_EPISODES "$EVAL_EPISODES" "it is the episodes per task (pass@k)"
        EVAL_ARGS+=(--episodes "$EVAL_EPISODES")
    fi
    case "${EVAL_GREEDY:-0}" in
        1) EVAL_ARGS+=(--greedy) ;;
        0) ;;
        *) gigpo_fail "EVAL_GREEDY=$EVAL_GREEDY: use 1 (greedy decoding) or 0 (the recipe's validation sampling)" ;;
    esac
}

# --- Resume: what a training launch will resume, before anything starts ------------------------------------------

#: the variables the suggested evaluation of a finished run (gigpo_eval_command) repeats when the user set them: what
#: the evaluation needs to run where the training ran and to load the checkpoint as it was trained (DEVICE, PYTHON,
#: MODEL_PATH, the LoRA settings), its prompts (THINKING, PROMPT_TEMPLATE, the estimator's settings) and its names
#: (EXPERIMENT); ENV:NAME only in ENV's recipe
GIGPO_EVAL_REPEATS=(DEVICE PYTHON MODEL_PATH EXPERIMENT ADV_ESTIMATOR LORA_RANK LORA_ALPHA LORA_TARGET_MODULES THINKING
    PROMPT_TEMPLATE alfworld:ALFWORLD_DATA webshop:WEBSHOP_ENV search:RETRIEVER_URL)
#: NAME -> the value the user set, read here, when a recipe sources this file (before any default of the recipe's)
declare -gA GIGPO_GIVEN=()
for _gigpo_name in "${GIGPO_EVAL_REPEATS[@]}"; do
    _gigpo_name=${_gigpo_name#*:}
    if [[ -n "${!_gigpo_name:-}" ]]; then GIGPO_GIVEN[$_gigpo_name]=${!_gigpo_name}; fi
done
unset _gigpo_name

# gigpo_eval_command CKPT: print the command that evaluates CKPT with this recipe: EVAL_ONLY=1 CKPT=CKPT, then each
# variable of GIGPO_EVAL_REPEATS the user set, as set (shell-quoted), then `bash $0`.
gigpo_eval_command() {
    local words=(EVAL_ONLY=1 "CKPT=$(printf '%q' "$1")") entry name
    for entry in "${GIGPO_EVAL_REPEATS[@]}"; do
        name=${entry#*:}
        [[ "$entry" == *:* && "${entry%%:*}" != "$GIGPO_ENV" ]] && continue
        [[ -n "${GIGPO_GIVEN[$name]+set}" ]] && words+=("$name=$(printf '%q' "${GIGPO_GIVEN[$name]}")")
    done
    printf '%s bash %s' "${words[*]}" "$0"
}

# gigpo_rollout_servers ARGS...: print what serves the rollouts of a launch with the extra overrides ARGS, for
# messages: vLLM, SGLang, or "the <name> rollout servers" (DEVICE=cpu: hf), from actor_rollout_ref.rollout.name (the
# override's value, else ROLLOUT_NAME, gigpo_device_setup).
gigpo_rollout_servers() {
    local name=${ROLLOUT_NAME:-vllm} value
    if value=$(gigpo_override_value actor_rollout_ref.rollout.name "$@"); then name=$value; fi
    case "$name" in
        vllm) printf 'vLLM' ;;
        sglang) printf 'SGLang' ;;
        *) printf 'the %s rollout servers' "$name" ;;
    esac
}

# gigpo_override_value KEY ARGS...: print the value of the last Hydra override of KEY among ARGS (KEY=V, +KEY=V or
# ++KEY=V; ~KEY, which deletes the key, prints null) and succeed; fail, printing nothing, when none names KEY.
gigpo_override_value() {
    local key=$1 arg value="" found=1
    shift
    for arg in "$@"; do
        arg=${arg#++}
        arg=${arg#+}
        if [[ "$arg" == "$key="* ]]; then
            value=${arg#"$key="}
            found=0
        elif [[ "$arg" == "~$key" || "$arg" == "~$key="* ]]; then
            value=null
            found=0
        fi
    done
    printf '%s' "$value"
    return $found
}

# gigpo_plain_value VALUE: succeed when Hydra reads VALUE, given unquoted in an override, as exactly that string (a
# letter, _, / or . first, then letters, digits and _ . / @ + : -; not true, false, null, inf or nan), so the shell
# can use it as verl will; quoted values and interpolations (${...}) fail.
gigpo_plain_value() {
    [[ "$1" =~ ^[A-Za-z_/.][A-Za-z0-9_./@+:-]*$ && ! "${1,,}" =~ ^(true|false|null|inf|nan)$ ]]
}

# gigpo_experiment_folder ARGS...: print the absolute experiment folder a launch with the extra overrides ARGS uses,
# verl's trainer.default_local_dir: the override's value, else verl's default checkpoints/<trainer.project_name>/
# <trainer.experiment_name> (the recipes set verl_gigpo and EXPERIMENT; an override of either wins), relative to the
# recipe's directory, the repository root, as verl takes it from the current directory. Fails when an override's
# value is not plain (gigpo_plain_value): only Hydra could resolve it.
gigpo_experiment_folder() {
    local folder project=verl_gigpo experiment=$EXPERIMENT value
    if value=$(gigpo_override_value trainer.default_local_dir "$@"); then
        gigpo_plain_value "$value" || return 1
        folder=$value
    else
        if value=$(gigpo_override_value trainer.project_name "$@"); then
            gigpo_plain_value "$value" || return 1
            project=$value
        fi
        if value=$(gigpo_override_value trainer.experiment_name "$@"); then
            gigpo_plain_value "$value" || return 1
            experiment=$value
        fi
        folder=checkpoints/$project/$experiment
    fi
    [[ "$folder" == /* ]] || folder=$PWD/$folder
    printf '%s' "$folder"
}

# gigpo_check_resume ARGS...: before a training launch (not EVAL_ONLY=1), with the recipe's extra overrides ARGS:
# 1. CKPT set: one warning line; CKPT is read only by EVAL_ONLY=1. A training launch resumes by itself: verl's
#    trainer.resume_mode=auto (the recipes keep verl's default) loads the checkpoint named by
#    latest_checkpointed_iteration.txt in the experiment folder (gigpo_experiment_folder).
# 2. A finished experiment: when that checkpoint's step N is at least the steps this launch trains, verl would start
#    Ray and the rollout servers (gigpo_rollout_servers), load it, validate (trainer.val_before_train) and stop
#    without training a step (verl's PPOTrainer.fit, verl/trainer/ppo/v1/trainer_base.py: `global_steps += 1`, then
#    `while ... global_steps <= total_training_steps`). The recipe stops instead, saying what to do (to evaluate it:
#    gigpo_eval_command); with DRY_RUN=1 it says so in a note and prints the command (a dry run shows what would run
#    and does not judge the machine's state).
# The step is read as PPOTrainer._load_checkpoint reads it under resume_mode=auto (find_latest_ckpt_path): the number
# in <folder>/latest_checkpointed_iteration.txt, when <folder>/global_step_<N> exists; a global_step_N folder without
# the pointer is not resumed by verl (verl_gigpo.main sets it aside as an unfinished save). The steps this launch
# trains are trainer.total_training_steps, which the recipes set to TOTAL_ITERS (an override of it wins); verl uses
# that number as given, so it is exact. Not checked, and left to verl_gigpo.main: trainer.resume_mode=disable or
# resume_path, trainer.val_only=true, an unreadable pointer, an override the shell cannot read (gigpo_plain_value),
# trainer.total_training_steps=null (verl then counts steps per epoch x total_epochs from the dataset's size), and a
# run cut short by a trainer.total_epochs override (its step count depends on the dataset's size too).
gigpo_check_resume() {
    [[ "${EVAL_ONLY:-0}" == 1 ]] && return 0
    local folder mode=auto value
    folder=$(gigpo_experiment_folder "$@") || folder=""
    if [[ -n "${CKPT:-}" ]]; then
        echo "warning: CKPT=$CKPT is ignored: CKPT is read only with EVAL_ONLY=1 (evaluate that checkpoint), and this \
launch trains. A training launch resumes by itself from the newest checkpoint in its experiment folder \
(${folder:-trainer.default_local_dir}), so the same EXPERIMENT continues its run; to train on from another verl \
checkpoint pass trainer.resume_mode=resume_path trainer.resume_from_path=.../global_step_N, from a Hugging Face \
folder set MODEL_PATH" >&2
    fi
    if value=$(gigpo_override_value trainer.resume_mode "$@"); then mode=$value; fi
    [[ "$mode" == auto && -n "$folder" ]] || return 0
    if value=$(gigpo_override_value trainer.val_only "$@") && [[ "${value,,}" == true ]]; then return 0; fi
    local total=$TOTAL_ITERS setting=TOTAL_ITERS
    if value=$(gigpo_override_value trainer.total_training_steps "$@"); then
        total=$value
        setting=trainer.total_training_steps
    fi
    [[ "$total" =~ ^[1-9][0-9]{0,17}$ ]] || return 0
    local pointer="$folder/latest_checkpointed_iteration.txt" text step
    [[ -f "$pointer" ]] || return 0
    text=$(<"$pointer")
    # verl: int(f.read().decode()), which allows surrounding white space
    [[ "$text" =~ ^[[:space:]]*([0-9]{1,18})[[:space:]]*$ ]] || return 0
    step=$((10#${BASH_REMATCH[1]}))
    local ckpt="$folder/global_step_$step"
    [[ -d "$ckpt" ]] || return 0
    ((step >= total)) || return 0
    local name=$EXPERIMENT start_over="set a new EXPERIMENT"
    if value=$(gigpo_override_value trainer.experiment_name "$@"); then
        name=$value
        start_over="pass another trainer.experiment_name"
    fi
    if gigpo_override_value trainer.default_local_dir "$@" >/dev/null; then
        start_over="pass another trainer.default_local_dir"
    fi
    local done_text="finished $step/$total steps"
    if ((step > total)); then done_text="trained $step steps, more than the $total this launch asks for"; fi
    local message="experiment $name has already $done_text ($setting=$total); its checkpoint: $ckpt. A launch would \
start Ray and $(gigpo_rollout_servers "$@"), load it and stop without training. To train on, raise $setting (e.g. \
$setting=$((step + 50)): verl resumes from step $step); to start over, $start_over (or delete $folder); to evaluate \
it: $(gigpo_eval_command "$ckpt")"
    if gigpo_dry_run; then
        echo "note: DRY_RUN=1 prints the command, but a launch would stop here: $message" >&2
    else
        gigpo_fail "$message"
    fi
}

# gigpo_launch CMD...: run the recipe's command `PYTHON -m verl_gigpo.main OVERRIDES...` (gigpo_run), or with
# EVAL_ONLY=1 the evaluation of EVAL_MODEL with those overrides (gigpo_eval_setup).
gigpo_launch() {
    if [[ "${EVAL_ONLY:-0}" == 1 ]]; then
        gigpo_run "$1" -m verl_gigpo.evaluate "$EVAL_MODEL" "${EVAL_ARGS[@]}" -- "${@:4}"
    else
        gigpo_run "$@"
    fi
}

# --- Attention: flash-attn when it imports, else sdpa ------------------------------------------------------------

# gigpo_attention_setup: set GIGPO_ATTN (the attention backend of the FSDP actor and reference model; empty on
# DEVICE=cpu, where platform=cpu sets sdpa) and GIGPO_REMOVE_PADDING (verl's padding-free packing, true/false).
# verl reads actor_rollout_ref.model.override_config.attn_implementation and defaults it to flash_attention_2
# (verl/workers/config/model.py); the reference worker deep-copies the actor's model config
# (verl/workers/engine_workers.py) and vLLM picks its own kernels, so this one key covers verl's side.
# ATTN_IMPLEMENTATION: auto (default) = flash_attention_2 when `$PYTHON -c "import flash_attn"` works, else sdpa with
# one warning line; or flash_attention_2 | sdpa | eager as given. With sdpa (or eager) padding-free packing attends
# over a dense mask of the whole pack (verl_gigpo/config/platform/cpu.yaml), so packing is turned off.
gigpo_attention_setup() {
    GIGPO_ATTN=""
    GIGPO_REMOVE_PADDING=false
    [[ "${DEVICE:-cuda}" == cpu ]] && return 0
    GIGPO_ATTN=${ATTN_IMPLEMENTATION:-auto}
    if [[ "$GIGPO_ATTN" == auto ]]; then
        if "$PYTHON" -c "import flash_attn" >/dev/null 2>&1; then
            GIGPO_ATTN=flash_attention_2
        else
            GIGPO_ATTN=sdpa
            echo "warning: flash_attn does not import with $PYTHON: the actor and reference model use sdpa \
attention (slower, more memory; padded micro-batches); add flash-attn as docs/gpu.md#flash-attn says, or set \
ATTN_IMPLEMENTATION=sdpa to choose it" >&2
        fi
    fi
    case "$GIGPO_ATTN" in
        flash_attention_2) GIGPO_REMOVE_PADDING=true ;;
        sdpa | eager) GIGPO_REMOVE_PADDING=false ;;
        *) gigpo_fail "ATTN_IMPLEMENTATION=$GIGPO_ATTN: use auto, flash_attention_2, sdpa or eager" ;;
    esac
}

# --- Optimizer steps: step rows per mini-batch ----------------------------------------------------------------------

# gigpo_check_mini_batch: MINI_BATCH_ROWS, MICRO_BATCH_PER_GPU and LOG_PROB_MICRO_BATCH_PER_GPU are whole numbers, and
# warn when NNODES x N_GPUS x lcm(micro-batch sizes) exceeds MINI_BATCH_ROWS: the gigpo_sync trainer mode rounds every
# mini-batch up to that multiple (verl_gigpo/verl_glue/trainer.py plan_mini_batches), so an optimizer step would take
# more rows than MINI_BATCH_ROWS and an iteration fewer optimizer steps than the reference.
gigpo_check_mini_batch() {
    gigpo_check_positive_int MINI_BATCH_ROWS "$MINI_BATCH_ROWS" "it is the most step rows per optimizer step \
(trainer.v1.gigpo_sync.mini_batch_rows; each recipe defaults to the reference's ppo_mini_batch_size)"
    gigpo_check_positive_int MICRO_BATCH_PER_GPU "$MICRO_BATCH_PER_GPU" "it is the actor's micro-batch per GPU \
(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)"
    gigpo_check_positive_int LOG_PROB_MICRO_BATCH_PER_GPU "$LOG_PROB_MICRO_BATCH_PER_GPU" "it is the micro-batch per \
GPU of the log-prob passes (actor_rollout_ref.{rollout,ref}.log_prob_micro_batch_size_per_gpu)"
    local a=$MICRO_BATCH_PER_GPU b=$LOG_PROB_MICRO_BATCH_PER_GPU t
    while ((b)); do
        t=$((a % b))
        a=$b
        b=$t
    done
    local ranks=$((${NNODES:-1} * N_GPUS)) nodes=""
    ((${NNODES:-1} > 1)) && nodes="NNODES x "
    local multiple=$((ranks * MICRO_BATCH_PER_GPU / a * LOG_PROB_MICRO_BATCH_PER_GPU))
    if ((multiple > MINI_BATCH_ROWS)); then
        echo "warning: MINI_BATCH_ROWS=$MINI_BATCH_ROWS is below the rows one update step needs on $ranks GPU(s) \
($multiple = ${nodes}N_GPUS x lcm(MICRO_BATCH_PER_GPU=$MICRO_BATCH_PER_GPU, LOG_PROB_MICRO_BATCH_PER_GPU=\
$LOG_PROB_MICRO_BATCH_PER_GPU)): each optimizer step takes $multiple rows; lower the micro-batch sizes to keep \
$MINI_BATCH_ROWS" >&2
    fi
}

# --- LoRA: LORA_RANK (0 = off) ------------------------------------------------------------------------------------

# gigpo_lora_rank: LORA_RANK (default 0) checked as a whole number (else stop naming it, also with DRY_RUN) and
# written in decimal (064 -> 64).
gigpo_lora_rank() {
    LORA_RANK=${LORA_RANK:-0}
    gigpo_check_whole_number LORA_RANK "$LORA_RANK" "0 trains every weight, LORA_RANK=64 trains a rank-64 adapter as \
the reference's LoRA runs do"
    LORA_RANK=$((10#$LORA_RANK))
}

# gigpo_lora_setup: LoRA from LORA_RANK, and the learning rate and KL loss that go with it. Fills GIGPO_LORA (verl's
# LoRA keys, empty when off) and sets LR and USE_KL_LOSS unless the user set them.
# LORA_RANK=0 (default): every weight trains; LR=1e-6, USE_KL_LOSS=true (the reference's full fine-tuning runs).
# LORA_RANK=R > 0: verl trains a rank-R adapter (actor_rollout_ref.model.lora_rank) with LORA_ALPHA (default R: the
# scale alpha / R is 1, as in the reference's LoRA runs, rank 64 and alpha 64) on LORA_TARGET_MODULES (default
# all-linear; or a comma-separated list such as q_proj,v_proj); LR=3e-6 and USE_KL_LOSS=false, as the reference's LoRA
# runs (verl-agent examples/gigpo_trainer/run_alfworld_lora.sh and run_webshop_lora.sh). The reference policy of a KL
# loss is then the actor with its adapter disabled (no second model). The adapter reaches the rollout unmerged, as
# verl does by default: vLLM serves it as a LoRA adapter; on DEVICE=cpu the hf backend merges it in float32 itself
# (verl_gigpo/verl_glue/cpu/hf_rollout.py), so nothing else changes there. Fidelity rows:
# recipes/reference_settings.yaml (lora).
gigpo_lora_setup() {
    gigpo_lora_rank
    GIGPO_LORA=()
    if ((LORA_RANK == 0)); then
        [[ -z "${LORA_ALPHA:-}${LORA_TARGET_MODULES:-}" ]] || gigpo_fail "LORA_ALPHA or LORA_TARGET_MODULES is set but \
LORA_RANK is 0 (LoRA off); set LORA_RANK, e.g. LORA_RANK=64"
        LR=${LR:-1e-6}
        USE_KL_LOSS=${USE_KL_LOSS:-true}
    else
        LORA_ALPHA=${LORA_ALPHA:-$LORA_RANK}
        gigpo_check_positive_int LORA_ALPHA "$LORA_ALPHA" "it is the LoRA scaling numerator (the adapter is scaled by \
LORA_ALPHA / LORA_RANK; the default is LORA_RANK)"
        LORA_TARGET_MODULES=${LORA_TARGET_MODULES:-all-linear}
        local targets=$LORA_TARGET_MODULES names='^[A-Za-z_][A-Za-z0-9_.]*(,[A-Za-z_][A-Za-z0-9_.]*)*$'
        if [[ "$targets" != all-linear ]]; then
            [[ "$targets" =~ $names ]] || gigpo_fail "LORA_TARGET_MODULES=$targets: use all-linear or a \
comma-separated list of module names, e.g. q_proj,k_proj,v_proj,o_proj"
            targets="[$targets]"
        fi
        LR=${LR:-3e-6}
        USE_KL_LOSS=${USE_KL_LOSS:-false}
        GIGPO_LORA=(
            actor_rollout_ref.model.lora_rank="$LORA_RANK"
            actor_rollout_ref.model.lora_alpha="$LORA_ALPHA"
            actor_rollout_ref.model.target_modules="$targets"
        )
        echo "LoRA: rank $LORA_RANK, alpha $LORA_ALPHA, target modules $LORA_TARGET_MODULES; lr $LR, KL loss \
$USE_KL_LOSS (LR and USE_KL_LOSS change them)" >&2
    fi
    [[ "$LR" =~ ^[0-9]+(\.[0-9]*)?([eE]-?[0-9]+)?$ ]] || gigpo_fail "LR=$LR is not a number; e.g. LR=1e-6"
    [[ "$USE_KL_LOSS" == true || "$USE_KL_LOSS" == false ]] || gigpo_fail "USE_KL_LOSS=$USE_KL_LOSS: use true or false"
}

# --- Estimator: HGPO, GraphGPO and G2PO as their authors ran them ---------------------------------------------------

#: the estimators ADV_ESTIMATOR may name: this package's step-credit estimators (verl_gigpo.STEP_CREDIT_ESTIMATORS,
#: registered into verl by verl_gigpo.plugin) and verl's outcome baselines that the gigpo_sync trainer mode computes
#: on the same step rows (verl_gigpo.advantage.outcome.OUTCOME_ESTIMATORS)
GIGPO_RECIPE_ESTIMATORS=(gigpo hgpo graphgpo g2po grpo rloo)

# gigpo_check_estimator: ADV_ESTIMATOR (default gigpo) is one of GIGPO_RECIPE_ESTIMATORS, else stop naming it and
# them (also with DRY_RUN). Another estimator of verl's registry goes in as the extra override
# algorithm.adv_estimator=NAME, which verl_gigpo.main checks against the registry.
gigpo_check_estimator() {
    ADV_ESTIMATOR=${ADV_ESTIMATOR:-gigpo}
    local name
    for name in "${GIGPO_RECIPE_ESTIMATORS[@]}"; do
        [[ "$ADV_ESTIMATOR" == "$name" ]] && return 0
    done
    local names="${GIGPO_RECIPE_ESTIMATORS[*]}"
    gigpo_fail "ADV_ESTIMATOR=$ADV_ESTIMATOR is not an estimator of the recipes; use one of ${names// /, } \
(docs/estimators.md). Another estimator of verl's registry: pass algorithm.adv_estimator=NAME as an extra override, \
with its own EXPERIMENT"
}

# gigpo_estimator_setup ENV_NAME: the settings with which the authors of ADV_ESTIMATOR ran it on ENV_NAME, where they
# differ from the recipe's GiGPO settings (recipes/reference_settings.yaml, `estimators`; docs/fidelity.md). Call it
# once ADV_ESTIMATOR is known and before the recipe's own defaults: it sets TOTAL_ITERS, MAX_STEPS, PROMPT_LENGTH,
# PROMPT_OVERLONG, ADV_NORM and HISTORY_FREE_ABOVE_CHARS only where the user left them unset (DEVICE=cpu's small
# defaults, set earlier, stay), and fills GIGPO_ESTIMATOR_OVERRIDES with the method's options, which the recipe puts
# after its own settings and before "$@" (so an override such as algorithm.hgpo.weight_base=depth, the paper's form,
# still wins). It stops on an ADV_ESTIMATOR the recipes do not know (gigpo_check_estimator). gigpo, grpo and rloo:
# nothing is set and the array is empty.
#   hgpo      every recipe: (k+1)^alpha depth weights and the population std (the authors' core_hgpo.py). ALFWorld and
#             WebShop: 160 iterations, prompts over data.max_prompt_length cut from the left (their data.truncation=
#             left); ALFWorld 4,096 prompt tokens; WebShop 30 steps, no history-free prompt above 13,000 characters.
#   graphgpo  the distance decay omega: ALFWorld 0.1, WebShop 0.2 (norm mean_std, 5,120 prompt tokens), Sokoban 0.8
#             (norm mean_std); search keeps the default 0.1 (no script of theirs). Their trainer's 0.1 penalty on
#             the graph return is env.invalid_action_penalty through env.invalid_action_penalty_mode=reference.
#   g2po      every recipe: c = 0.1 in A_1 (their function default, whatever the environment's penalty). ALFWorld and
#             WebShop: 100 iterations.
gigpo_estimator_setup() {
    local env_name=$1 omega=""
    gigpo_check_estimator
    GIGPO_ESTIMATOR_OVERRIDES=()
    case "$ADV_ESTIMATOR" in
        hgpo)
            GIGPO_ESTIMATOR_OVERRIDES=(algorithm.hgpo.weight_base=depth_plus_one algorithm.hgpo.std=population)
            case "$env_name" in
                alfworld)
                    TOTAL_ITERS=${TOTAL_ITERS:-160}
                    PROMPT_LENGTH=${PROMPT_LENGTH:-4096}
                    PROMPT_OVERLONG=${PROMPT_OVERLONG:-cut_left}
                    ;;
                webshop)
                    TOTAL_ITERS=${TOTAL_ITERS:-160}
                    MAX_STEPS=${MAX_STEPS:-30}
                    PROMPT_OVERLONG=${PROMPT_OVERLONG:-cut_left}
                    HISTORY_FREE_ABOVE_CHARS=${HISTORY_FREE_ABOVE_CHARS:-null}
                    ;;
            esac
            ;;
        graphgpo)
            case "$env_name" in
                alfworld) omega=0.1 ;;
                webshop)
                    omega=0.2
                    ADV_NORM=${ADV_NORM:-mean_std}
                    PROMPT_LENGTH=${PROMPT_LENGTH:-5120}
                    ;;
                sokoban)
                    omega=0.8
                    ADV_NORM=${ADV_NORM:-mean_std}
                    ;;
            esac
            [[ -n "$omega" ]] && GIGPO_ESTIMATOR_OVERRIDES=("algorithm.graphgpo.omega=$omega")
            ;;
        g2po)
            GIGPO_ESTIMATOR_OVERRIDES=(algorithm.g2po.invalid_penalty=0.1)
            case "$env_name" in
                alfworld | webshop) TOTAL_ITERS=${TOTAL_ITERS:-100} ;;
            esac
            ;;
        *) return 0 ;;
    esac
    echo "$ADV_ESTIMATOR on $env_name: its authors' settings wherever a variable is not set (docs/fidelity.md, the \
$ADV_ESTIMATOR tables)" >&2
}

# --- Thinking: THINKING (unset = the chat template's default) -----------------------------------------------------

# gigpo_thinking_setup: fill GIGPO_THINKING with the chat-template switch of reasoning models such as Qwen3
# (`enable_thinking`), from THINKING: unset or empty = nothing (the template's own default: Qwen3 thinks);
# THINKING=0 = data.apply_chat_template_kwargs.enable_thinking=false (Qwen3's template then closes an empty think
# block after the generation prompt, so the model answers at once); THINKING=1 = true. verl's agent loop passes
# data.apply_chat_template_kwargs to the chat template (AgentLoopBase reads it; verl_gigpo/verl_glue/agent_loop.py);
# `++` because verl's default is an empty mapping. A template that does not read the switch renders the same prompt
# (the agent loop then logs a warning).
gigpo_thinking_setup() {
    GIGPO_THINKING=()
    case "${THINKING:-}" in
        "") ;;
        0) GIGPO_THINKING=(++data.apply_chat_template_kwargs.enable_thinking=false) ;;
        1) GIGPO_THINKING=(++data.apply_chat_template_kwargs.enable_thinking=true) ;;
        *) gigpo_fail "THINKING=$THINKING: use THINKING=0 (thinking off: the chat template's enable_thinking=false, \
e.g. for Qwen3) or THINKING=1 (on), or leave it unset for the template's default" ;;
    esac
}

# --- Prompt template: PROMPT_TEMPLATE (unset = the environment's own prompt) -----------------------------------

# gigpo_prompt_template_setup: fill GIGPO_PROMPT_TEMPLATE from PROMPT_TEMPLATE, a template file (docs/environments.md,
# "Prompt templates"), e.g. one that `python -m verl_gigpo.prompts from-reference` wrote from your verl-agent checkout:
# unset or empty = nothing (the environment's own wording); else env.prompt.template (made absolute: the agent-loop
# workers read it) with the reference's layout of the history items and admissible actions of the recipe's
# environment (GIGPO_ENV), and show_step_limit back at its default, since the template's text decides that.
gigpo_prompt_template_setup() {
    GIGPO_PROMPT_TEMPLATE=()
    [[ -n "${PROMPT_TEMPLATE:-}" ]] || return 0
    [[ -f "$PROMPT_TEMPLATE" ]] || gigpo_fail "PROMPT_TEMPLATE=$PROMPT_TEMPLATE is not a file: give a template file, \
e.g. ~/gigpo-prompts/$GIGPO_ENV.txt as written by \`$PYTHON -m verl_gigpo.prompts from-reference \
/path/to/verl-agent\`"
    local path item=bracketed actions=comma
    path="$(cd "$(dirname "$PROMPT_TEMPLATE")" && pwd)/$(basename "$PROMPT_TEMPLATE")"
    case "$GIGPO_ENV" in
        alfworld) actions=quoted_indent ;;
        webshop) actions=quoted_comma ;;
        search) item=step_blocks ;;
    esac
    GIGPO_PROMPT_TEMPLATE=(
        env.prompt.template="$(gigpo_hydra_quote "$path")"
        env.prompt.history_item="$item"
        env.prompt.admissible_actions="$actions"
        env.prompt.show_step_limit=true
    )
}

# --- Dynamic sampling: DYNAMIC (unset = off) ---------------------------------------------------------------------

# gigpo_dynamic_setup: fill GIGPO_DYNAMIC with the dynamic-sampling settings (docs/dynamic-sampling.md), from
# DYNAMIC: unset or empty = off (nothing); DYNAMIC=episode = the reference's dynamic GiGPO
# (examples/gigpo_dynamic_trainer/run_*.sh): a group whose episode returns are all equal is dropped and replaced by
# fresh tasks, at most MAX_GEN_BATCHES (default 10) generation batches an iteration, with its clip range 0.2 / 0.28
# (CLIP_RATIO_LOW, CLIP_RATIO_HIGH); DYNAMIC=signal = the same, but a group is also kept when the estimator's step
# term has signal (needs a step-credit ADV_ESTIMATOR: gigpo, hgpo, graphgpo, g2po). Anything else stops the recipe.
gigpo_dynamic_setup() {
    GIGPO_DYNAMIC=()
    case "${DYNAMIC:-}" in
        "") return 0 ;;
        episode | signal) ;;
        *) gigpo_fail "DYNAMIC=$DYNAMIC: use DYNAMIC=episode (drop groups whose episode returns are all equal and \
play fresh tasks instead, the reference's dynamic GiGPO) or DYNAMIC=signal (keep a group whose step term has signal \
too), or leave it unset (no dynamic sampling)" ;;
    esac
    if [[ "$DYNAMIC" == signal && ! " gigpo hgpo graphgpo g2po " =~ " ${ADV_ESTIMATOR:-gigpo} " ]]; then
        gigpo_fail "DYNAMIC=signal needs a step-credit estimator (ADV_ESTIMATOR=gigpo, hgpo, graphgpo or g2po); \
ADV_ESTIMATOR=$ADV_ESTIMATOR has no step term: use DYNAMIC=episode"
    fi
    MAX_GEN_BATCHES=${MAX_GEN_BATCHES:-10}
    gigpo_check_positive_int MAX_GEN_BATCHES "$MAX_GEN_BATCHES" "it is the most generation batches (rounds of \
data.train_batch_size tasks) an iteration plays with dynamic sampling (algorithm.filter_groups.max_num_gen_batches), \
e.g. MAX_GEN_BATCHES=10 as the reference"
    CLIP_RATIO_LOW=${CLIP_RATIO_LOW:-0.2}
    CLIP_RATIO_HIGH=${CLIP_RATIO_HIGH:-0.28}
    GIGPO_DYNAMIC=(
        algorithm.filter_groups.enable=true
        algorithm.filter_groups.filter="$DYNAMIC"
        algorithm.filter_groups.max_num_gen_batches="$MAX_GEN_BATCHES"
        # the reference's dynamic GiGPO scripts also raise the upper clip range (DAPO's clip-higher)
        actor_rollout_ref.actor.clip_ratio_low="$CLIP_RATIO_LOW"
        actor_rollout_ref.actor.clip_ratio_high="$CLIP_RATIO_HIGH"
    )
}

# gigpo_verl_overrides: fill the array GIGPO_VERL_OVERRIDES with the settings every recipe shares, one Hydra
# override per line: the model and its attention backend, LoRA, the actor (lr 1e-6, KL loss low_var_kl; with LoRA lr
# 3e-6 and no KL loss), the optimizer steps (MINI_BATCH_ROWS step rows each), the rollout (vLLM, or hf on DEVICE=cpu),
# the reference policy, the trainer, and the prompt structure the reference uses in every environment (env.prompt.*;
# each recipe sets the rest). Reads DEVICE, ROLLOUT_NAME, MODEL_PATH, LORA_RANK, LORA_ALPHA,
# LORA_TARGET_MODULES, LR, USE_KL_LOSS, GROUP_SIZE, N_GPUS, NNODES, RAY_ADDRESS, TOTAL_ITERS, TEST_FREQ, MINI_BATCH_ROWS,
# MICRO_BATCH_PER_GPU, LOG_PROB_MICRO_BATCH_PER_GPU, KL_COEF, ENTROPY_COEF, VAL_TEMPERATURE, VAL_DO_SAMPLE,
# MAX_CKPTS_TO_KEEP, EXPERIMENT, LOGGER, SEED, THINKING, PROMPT_TEMPLATE and DYNAMIC (with MAX_GEN_BATCHES,
# CLIP_RATIO_LOW, CLIP_RATIO_HIGH) (each recipe sets its defaults, SEED defaults to 0 here;
# recipes/reference_settings.yaml lists where each value comes from). Recipes put these after their own settings; the
# user's "$@" comes last and wins.
gigpo_verl_overrides() {
    # the seed of the training task order (data.seed: verl shuffles the task rows with it; docs/configuration.md,
    # "Which tasks a run plays"), the reference's env.seed=0
    SEED=${SEED:-0}
    gigpo_check_whole_number SEED "$SEED" "it seeds the order in which training tasks are drawn (data.seed), e.g. \
SEED=1"
    # trainer.logger: the console and verl's file logger (one JSON line per iteration in the experiment folder,
    # checkpoints/verl_gigpo/$EXPERIMENT/metrics.jsonl, kept across resumed launches: docs/runs.md); add a backend
    # with e.g. LOGGER=console,file,tensorboard or LOGGER=console,file,wandb (verl's logger names)
    LOGGER=${LOGGER:-console,file}
    [[ "$LOGGER" =~ ^[a-z_]+(,[a-z_]+)*$ ]] || gigpo_fail "LOGGER=$LOGGER is not a comma-separated list of verl \
logger names; e.g. LOGGER=console,file,tensorboard (verl knows console, file, tensorboard, wandb, mlflow, swanlab, \
clearml, trackio)"
    gigpo_check_positive_int TOTAL_ITERS "$TOTAL_ITERS" "it is the number of training iterations \
(trainer.total_training_steps), e.g. TOTAL_ITERS=150"
    gigpo_check_positive_int MAX_CKPTS_TO_KEEP "$MAX_CKPTS_TO_KEEP" "it is how many checkpoints verl keeps \
(trainer.max_actor_ckpt_to_keep); to keep every checkpoint pass trainer.max_actor_ckpt_to_keep=null as an override"
    gigpo_check_positive_int PROMPT_LENGTH "${PROMPT_LENGTH:-}" "it is the most tokens of a prompt \
(data.max_prompt_length), e.g. PROMPT_LENGTH=4096"
    gigpo_check_mini_batch
    gigpo_attention_setup
    gigpo_lora_setup
    gigpo_thinking_setup
    gigpo_dynamic_setup
    gigpo_prompt_template_setup
    local platform=() attn=() ray_address=()
    [[ "${DEVICE:-cuda}" == cpu ]] && platform=(platform=cpu)
    # the address in the command too, so that DRY_RUN shows it and the launch record keeps it
    [[ -n "${RAY_ADDRESS:-}" ]] && ray_address=("ray_kwargs.ray_init.address=$(gigpo_hydra_quote "$RAY_ADDRESS")")
    # ++: verl's override_config is an empty dict, so the key is added (or replaced)
    [[ -n "$GIGPO_ATTN" ]] && attn=("++actor_rollout_ref.model.override_config.attn_implementation=$GIGPO_ATTN")
    GIGPO_VERL_OVERRIDES=(
        # DEVICE=cpu: verl's cpu platform, FSDP2 over gloo, the hf rollout backend (verl_gigpo/config/platform/cpu.yaml)
        "${platform[@]}"
        actor_rollout_ref.model.path="$(gigpo_hydra_quote "$MODEL_PATH")"
        # attention (gigpo_attention_setup): flash_attention_2 with padding-free packing, or sdpa with padded
        # micro-batches when flash-attn is missing; DEVICE=cpu: sdpa from cpu.yaml, no packing (slower on a CPU)
        "${attn[@]}"
        actor_rollout_ref.model.use_remove_padding="$GIGPO_REMOVE_PADDING"
        # activation checkpointing pays off on GPUs; on DEVICE=cpu it slows a tiny model down (cpu.yaml)
        actor_rollout_ref.model.enable_gradient_checkpointing="$([[ "${DEVICE:-cuda}" == cpu ]] && echo false || echo true)"
        # LoRA (gigpo_lora_setup): a rank-LORA_RANK adapter instead of every weight, when LORA_RANK > 0
        "${GIGPO_LORA[@]}"
        # 1e-6, or 3e-6 with LoRA (the reference's runs of each kind)
        actor_rollout_ref.actor.optim.lr="$LR"
        # optimizer steps: an iteration's R step rows make ceil(R / MINI_BATCH_ROWS) equal mini-batches, rows
        # shuffled across groups (the gigpo_sync trainer mode), as the reference's actor splits its step rows into
        # ppo_mini_batch_size-row mini-batches. verl's own ppo_mini_batch_size would count TASKS (x rollout.n
        # trajectories' rows per step); verl still checks it, so it stays at most the tasks per iteration.
        trainer.v1.gigpo_sync.mini_batch_rows="$MINI_BATCH_ROWS"
        actor_rollout_ref.actor.ppo_mini_batch_size="$((TRAIN_TASKS_PER_ITER < 16 ? TRAIN_TASKS_PER_ITER : 16))"
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO_BATCH_PER_GPU"
        # true, or false with LoRA (the reference's runs of each kind)
        actor_rollout_ref.actor.use_kl_loss="$USE_KL_LOSS"
        actor_rollout_ref.actor.kl_loss_coef="$KL_COEF"
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff="$ENTROPY_COEF"
        actor_rollout_ref.actor.fsdp_config.param_offload=false
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
        actor_rollout_ref.rollout.name="${ROLLOUT_NAME:-vllm}"
        actor_rollout_ref.rollout.n="$GROUP_SIZE"
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH_PER_GPU"
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.val_kwargs.do_sample="$VAL_DO_SAMPLE"
        actor_rollout_ref.rollout.val_kwargs.temperature="$VAL_TEMPERATURE"
        actor_rollout_ref.rollout.val_kwargs.n=1
        # training tasks: every epoch a permutation of train.parquet's rows drawn with this seed (same on every launch)
        data.seed="$SEED"
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH_PER_GPU"
        # the reference model waits in host memory between uses (on DEVICE=cpu it is there anyway)
        actor_rollout_ref.ref.fsdp_config.param_offload="$([[ "${DEVICE:-cuda}" == cpu ]] && echo false || echo true)"
        # NNODES Ray nodes of N_GPUS GPUs each (gigpo_check_gpus); RAY_ADDRESS: the running Ray cluster to join
        trainer.n_gpus_per_node="$N_GPUS"
        trainer.nnodes="$NNODES"
        "${ray_address[@]}"
        trainer.total_training_steps="$TOTAL_ITERS"
        trainer.total_epochs=1000
        trainer.test_freq="$TEST_FREQ"
        trainer.save_freq=50
        # full FSDP checkpoints (actor + optimizer) every save_freq iterations: keep the newest MAX_CKPTS_TO_KEEP
        trainer.max_actor_ckpt_to_keep="$MAX_CKPTS_TO_KEEP"
        trainer.val_before_train=true
        trainer.critic_warmup=0
        trainer.logger="[$LOGGER]"
        trainer.project_name=verl_gigpo
        trainer.experiment_name="$(gigpo_hydra_quote "$EXPERIMENT")"
        # the reference's prompt structure (wording is each environment's own; docs/environments.md, "Prompts"): the
        # step limit is not stated, and history steps are numbered from 1
        env.prompt.show_step_limit=false
        env.prompt.first_step_number=1
        # the reference's reward accounting (docs/estimators.md, "The invalid-action penalty"): the penalty comes off
        # the invalid row's own step return and its own episode score, and the episode statistics run over step rows
        env.invalid_action_penalty_mode=reference
        algorithm.gigpo.episode_stats=step
        # THINKING=0/1 (gigpo_thinking_setup): the chat template's enable_thinking switch (Qwen3), when set
        "${GIGPO_THINKING[@]}"
        # DYNAMIC=episode|signal (gigpo_dynamic_setup): dynamic sampling, when set
        "${GIGPO_DYNAMIC[@]}"
        # PROMPT_TEMPLATE (gigpo_prompt_template_setup): a template file instead of the environment's wording, when set
        "${GIGPO_PROMPT_TEMPLATE[@]}"
    )
}
