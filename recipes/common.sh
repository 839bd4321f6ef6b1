# shellcheck shell=bash
# The shell side of the recipes, sourced by recipes/run_<env>.sh (and tests/gpu/check_gpu.sh): what only bash can do
# before a Python runs. gigpo_recipe ENV checks DRY_RUN, resolves DEVICE (no GPU: stop, unless DEVICE=cpu or DRY_RUN=1),
# chooses the Python (gigpo_python_setup) and hands over to recipes/driver.py, which reads every other variable, fills
# the defaults of recipes/recipe_defaults.py, checks each value, prepares the task files and runs (DRY_RUN=1: prints)
# the command. Its checks are Python's; docs/gpu.md lists the variables.

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

# gigpo_recipe ENV_NAME ARGS...: run recipes/driver.py for ENV_NAME with the extra Hydra overrides ARGS. DEVICE: cuda
# (GPUs: vLLM + FSDP; the default when a GPU is visible) or cpu (verl's pipeline on this CPU with a tiny model and the
# small defaults of recipe_defaults.CPU); without a GPU and without DEVICE a run stops and says to pass DEVICE=cpu (a
# dry run prints the GPU command). The driver runs in the chosen Python (any Python 3 for a dry run); it learns the
# chosen Python (GIGPO_PYTHON), the device (GIGPO_DEVICE) and the visible GPUs (GIGPO_VISIBLE_GPUS) from here, while
# PYTHON and DEVICE keep what the user set (the evaluation a finished run suggests repeats those).
gigpo_recipe() {
    local env_name=$1 device=${DEVICE:-} given_python=${PYTHON:-} visible
    shift
    gigpo_dry_run || true
    visible=$(gigpo_visible_gpus)
    if [[ -z "$device" ]]; then
        if [[ "$visible" =~ ^[1-9] ]] || gigpo_dry_run; then
            device=cuda
        else
            gigpo_fail "no NVIDIA GPU is visible. These recipes train on GPUs (vLLM + FSDP, requirements-gpu.txt); to \
run the same pipeline on this CPU with a tiny model, as a smoke test, set DEVICE=cpu (e.g. \
MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash $0). To learn on one machine use \`make demo\`. To only print the \
command, set DRY_RUN=1."
        fi
    fi
    [[ "$device" == cuda || "$device" == cpu ]] || gigpo_fail "DEVICE=$device: use DEVICE=cuda (GPUs) or DEVICE=cpu \
(smoke test on this CPU)"
    gigpo_python_setup
    local chosen=$PYTHON driver_python=$PYTHON
    command -v "$driver_python" >/dev/null 2>&1 || driver_python=python3
    PYTHON=$given_python GIGPO_PYTHON=$chosen GIGPO_DEVICE=$device GIGPO_VISIBLE_GPUS=$visible exec "$driver_python" \
        -c 'import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' \
        "$(dirname "${BASH_SOURCE[0]}")/driver.py" "$env_name" "$0" "$@"
}
