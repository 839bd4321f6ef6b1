"""The one driver of the recipes: ``bash recipes/run_<env>.sh`` chooses the Python (recipes/common.sh) and runs this.

It reads the recipe variables (docs/gpu.md, "Variables"), fills in the defaults of recipes/recipe_defaults.py, checks
each value (one ``error:`` line naming it, also with DRY_RUN=1), prepares the task files and runs (or, with
DRY_RUN=1, prints) ``python -m verl_gigpo.main`` with one Hydra override per line, or with EVAL_ONLY=1
``python -m verl_gigpo.evaluate``. Standard library only: a dry run works with any Python 3.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_defaults as table  # noqa: E402  - beside this file, found without the package installed

#: the stamp written beside train.parquet and val.parquet after a data prep: its arguments, one "--flag value" a line
PREP_STAMP = "prepared_with.txt"
_PLAIN = re.compile(r"[A-Za-z/][A-Za-z0-9_./@+:-]*")
_HYDRA_WORDS = {"true", "false", "null", "inf", "nan"}


class RecipeError(Exception):
    """A bad recipe variable: the message names it, its value and what to do."""


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra override value that Hydra reads back as exactly that string (single-quoted with Hydra's
    escapes unless it is a plain path or name)."""
    if _PLAIN.fullmatch(value) and value.lower() not in _HYDRA_WORDS:
        return value
    out, slashes = "", ""
    for i, char in enumerate(value):
        if char == "\\":
            slashes += "\\"
        elif char == "'":
            out, slashes = out + slashes * 2 + "\\'", ""
        elif char == "$" and value[i + 1 : i + 2] == "{":
            out, slashes = out + slashes * 2 + "\\$", ""
        else:
            out, slashes = out + slashes + char, ""
    return f"'{out}{slashes * 2}'"


def plain_value(value: str) -> bool:
    """True when Hydra reads ``value``, unquoted, as exactly that string."""
    return bool(re.fullmatch(r"[A-Za-z_/.][A-Za-z0-9_./@+:-]*", value)) and value.lower() not in _HYDRA_WORDS


def override_value(key: str, args: list[str]) -> str | None:
    """The value of the last Hydra override of ``key`` among ``args`` (``~key`` gives "null"); None when none."""
    value = None
    for arg in args:
        arg = arg[2:] if arg.startswith("++") else arg[1:] if arg.startswith("+") else arg
        if arg.startswith(f"{key}="):
            value = arg[len(key) + 1 :]
        elif arg == f"~{key}" or arg.startswith(f"~{key}="):
            value = "null"
    return value


class _Value(str):
    """A variable's value in an override template: ``{NAME:q}`` quotes it for Hydra."""

    def __format__(self, spec: str) -> str:
        return hydra_quote(str(self)) if spec == "q" else str.__format__(str(self), spec)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Recipe:
    """One launch of ``run_<env>.sh``: the variables ``v`` (name -> value, "" = unset) and the checks that read them."""

    def __init__(self, env: str, script: str, args: list[str], environ: dict[str, str]) -> None:
        self.env, self.script, self.args, self.environ = env, script, args, environ
        self.given = {k: environ[k] for k in self._repeat_names() if environ.get(k)}
        self.v: dict[str, str] = {k: val for k, val in environ.items() if val}
        self.dry = environ.get("DRY_RUN") == "1"
        self.python = environ["GIGPO_PYTHON"]
        self.v["DEVICE"] = environ["GIGPO_DEVICE"]
        self.cpu = self.v["DEVICE"] == "cpu"

    # ------------------------------------------------------------------------------------------------- helpers
    def get(self, name: str) -> str:
        """The variable's value, "" when unset."""
        return self.v.get(name, "")

    def default(self, name: str, value: str) -> str:
        """Set ``name`` to ``value`` unless it is set (as the shell's ``${NAME:-value}``); returns its value."""
        if not self.v.get(name) and value:
            self.v[name] = value
        return self.get(name)

    def stop_or_note(self, message: str) -> None:
        """A launch stops with ``message``; a dry run notes it and goes on."""
        if not self.dry:
            raise RecipeError(message)
        _say(f"note: DRY_RUN=1 prints the command, but a launch would stop here: {message}")

    def positive_int(self, name: str, hint: str) -> None:
        """``name`` is a whole number >= 1."""
        if not re.fullmatch(r"[1-9][0-9]*", self.get(name)):
            raise RecipeError(f"{name}={self.get(name)} is not a whole number >= 1; {hint}")

    def whole_number(self, name: str, hint: str) -> None:
        """``name`` is a whole number >= 0."""
        if not re.fullmatch(r"[0-9]+", self.get(name)):
            raise RecipeError(f"{name}={self.get(name)} is not a whole number >= 0; {hint}")

    def _repeat_names(self) -> list[str]:
        names = []
        for entry in table.EVAL_REPEATS:
            env, _, name = entry.rpartition(":")
            if not env or env == self.env:
                names.append(name)
        return names

    def child_environ(self) -> dict[str, str]:
        """The environment of data prep and the launch: the user's, without what recipes/common.sh passed here."""
        drop = {"GIGPO_PYTHON", "GIGPO_DEVICE", "GIGPO_VISIBLE_GPUS"}
        drop |= {name for name in ("PYTHON", "DEVICE") if not self.environ.get(name)}
        return {name: value for name, value in self.environ.items() if name not in drop}

    # ---------------------------------------------------------------------------------------------- defaults
    def fill_defaults(self) -> None:
        """DEVICE=cpu's small run, then the estimator's authors' settings, the environment's, and COMMON."""
        self.observation_setup()
        if self.cpu and self.images:
            for name, value in table.CPU_IMAGE.items():
                self.default(name, value)
        if self.cpu:
            for name, value in table.CPU.items():
                self.default(name, value)
            self.default("DATA_DIR", f"{self.environ.get('HOME', '')}/data/verl-gigpo/cpu/{self.env}")
        for name, value in table.OBSERVATION_DEFAULTS.get(self.env, {}).get(self.get("OBSERVATION"), {}).items():
            self.default(name, value)
        self.v["ROLLOUT_NAME"] = "hf" if self.cpu else "vllm"
        recipe = table.RECIPES[self.env]
        self.default("MODEL_PATH", recipe["defaults"].get("MODEL_PATH", table.COMMON["MODEL_PATH"]))
        if self.env == "alfworld" and self.dry:
            self.default("ALFWORLD_DATA", "/path/to/alfworld_data")
        self.default("DATA_DIR", f"{self.environ.get('HOME', '')}/data/verl-gigpo/{self.env}")
        visible = self.environ.get("GIGPO_VISIBLE_GPUS", "")
        self.default("N_GPUS", visible or "1")
        self.estimator_setup()
        for name, value in {**table.COMMON, **recipe["defaults"]}.items():
            self.default(name, value)

    def observation_setup(self) -> None:
        """OBSERVATION (image recipes: sokoban and the card games): image, both or text (its defaults:
        recipe_defaults.OBSERVATION_DEFAULTS, after DEVICE=cpu's)."""
        recipe = table.RECIPES[self.env]
        given = self.get("OBSERVATION")
        if "OBSERVATION" not in recipe["defaults"]:
            if given:
                names = ", ".join(name for name, spec in table.RECIPES.items() if "OBSERVATION" in spec["defaults"])
                raise RecipeError(
                    f"OBSERVATION={given}: {self.env} has text observations only; OBSERVATION is for {names}"
                )
            self.images = False
            return
        mode = self.default("OBSERVATION", recipe["defaults"]["OBSERVATION"])
        if mode not in ("image", "both", "text"):
            raise RecipeError(
                f"OBSERVATION={mode}: use image (the reference's run, a vision-language model), both (image and text) "
                "or text (the text observation, for text models)"
            )
        self.images = mode != "text"

    def check_image_settings(self) -> None:
        """HISTORY_LENGTH, TILE_SIZE and IMAGE_SIZE, where a recipe reads them, are whole numbers."""
        recipe = table.RECIPES[self.env]["defaults"]
        hints = {
            "HISTORY_LENGTH": "it is the past steps the prompt shows (env.history_length), e.g. HISTORY_LENGTH=2",
            "TILE_SIZE": "it is Sokoban's pixels per cell (env.kwargs.tile_size, 4 to 64), e.g. TILE_SIZE=16",
            "IMAGE_SIZE": "it is a card table's pixels a side (env.kwargs.image_size, 96 to 512), e.g. IMAGE_SIZE=300",
        }
        for name, hint in hints.items():
            if name in recipe:
                (self.whole_number if name == "HISTORY_LENGTH" else self.positive_int)(name, hint)

    def tiny_model(self) -> None:
        """DEVICE=cpu with its default tiny model folder missing: build it (DRY_RUN=1 prints the command)."""
        model = self.get("MODEL_PATH")
        builder = table.TINY_MODELS.get(model)
        if not self.cpu or builder is None or os.path.isdir(model) or self.eval_only:
            return
        cmd = [self.python, "-m", builder, "--out", model]
        if self.dry:
            print(f"# tiny model (runs: {model} is missing):\n# {' '.join(shlex.quote(a) for a in cmd)} ", flush=True)
            return
        _say(f"building the tiny model {model} for DEVICE=cpu (seconds)")
        code = subprocess.run(cmd, env=self.child_environ()).returncode
        if code:
            sys.exit(code)

    def vision_overrides(self) -> list[str]:
        """DEVICE=cpu with images: the tiny vision model's images-only processor class is in its folder."""
        if self.cpu and self.images and self.get("MODEL_PATH") == table.CPU_IMAGE["MODEL_PATH"]:
            return ["actor_rollout_ref.model.trust_remote_code=true", "data.trust_remote_code=true"]
        return []

    def estimator_setup(self) -> None:
        """ADV_ESTIMATOR is one the recipes know; hgpo, graphgpo and g2po bring their authors' settings."""
        name = self.default("ADV_ESTIMATOR", table.COMMON["ADV_ESTIMATOR"])
        if name not in table.ESTIMATORS:
            raise RecipeError(
                f"ADV_ESTIMATOR={name} is not an estimator of the recipes; use one of {', '.join(table.ESTIMATORS)} "
                "(docs/estimators.md). Another estimator of verl's registry: pass algorithm.adv_estimator=NAME as an "
                "extra override, with its own EXPERIMENT"
            )
        settings = table.ESTIMATOR_SETTINGS.get(name)
        self.estimator_overrides: list[str] = []
        if settings is None:
            return
        here = settings.get(self.env, {})
        self.estimator_overrides = [*settings["overrides"], *here.get("overrides", [])]
        for key, value in here.get("defaults", {}).items():
            self.default(key, value)
        _say(
            f"{name} on {self.env}: its authors' settings wherever a variable is not set (docs/fidelity.md, the "
            f"{name} tables)"
        )

    def lora_rank(self) -> int:
        """LORA_RANK (default 0), a whole number, written in decimal (064 -> 64)."""
        self.default("LORA_RANK", "0")
        self.whole_number(
            "LORA_RANK", "0 trains every weight, LORA_RANK=64 trains a rank-64 adapter as the reference's LoRA runs do"
        )
        self.v["LORA_RANK"] = str(int(self.get("LORA_RANK")))
        return int(self.v["LORA_RANK"])

    def experiment_setup(self) -> None:
        """EXPERIMENT, unless set: <env>_<estimator>[_dynamic_<kind>]_<model folder>[_lora<R>][_think<0|1>]."""
        if self.get("EXPERIMENT"):
            return
        rank = self.lora_rank()
        dynamic = f"_dynamic_{self.get('DYNAMIC')}" if self.get("DYNAMIC") else ""
        name = f"{self.env}_{self.get('ADV_ESTIMATOR')}{dynamic}_{_basename(self.get('MODEL_PATH'))}"
        if rank > 0:
            name += f"_lora{rank}"
        if self.get("THINKING") in ("0", "1"):
            name += f"_think{self.get('THINKING')}"
        self.v["EXPERIMENT"] = name

    # ------------------------------------------------------------------------------------------------ checks
    def check_eval_split(self, env_name: str) -> None:
        """EVAL_SPLIT is one of the environment's evaluation splits (when this Python can import environments)."""
        code = (
            "import sys\nfrom environments import env_class\n"
            "print(' '.join(s for s in env_class(sys.argv[1]).splits if s != 'train'))"
        )
        proc = subprocess.run([self.python, "-c", code, env_name], capture_output=True, text=True)
        splits = proc.stdout.split()
        split = self.get("EVAL_SPLIT")
        if proc.returncode != 0 or split in splits:
            return
        names = splits[0] if len(splits) == 1 else f"{', '.join(splits[:-1])} or {splits[-1]}"
        extra = " (train holds the training tasks)" if split == "train" else ""
        raise RecipeError(f"EVAL_SPLIT={split} is not an evaluation split of {env_name}; use {names}{extra}")

    def eval_setup(self, env_name: str) -> None:
        """EVAL_ONLY=1: evaluate CKPT (default MODEL_PATH) on EVAL_SPLIT / EVAL_TASKS into EVAL_OUT, not train."""
        eval_only = self.get("EVAL_ONLY") or "0"
        if eval_only not in ("0", "1"):
            raise RecipeError(f"EVAL_ONLY={eval_only}: use EVAL_ONLY=1 (evaluate CKPT instead of training) or 0")
        self.eval_only = eval_only == "1"
        if not self.eval_only:
            return
        ckpt = self.get("CKPT")
        self.eval_model = ckpt or self.get("MODEL_PATH")
        if Path(self.eval_model, "config.json").is_file():
            self.v["MODEL_PATH"] = self.eval_model  # a Hugging Face folder: the model itself
        elif ckpt and not os.path.exists(ckpt) and not self.dry:
            raise RecipeError(
                f"CKPT={ckpt} does not exist; set it to a verl checkpoint (<experiment>/global_step_N) or a Hugging "
                "Face model folder"
            )
        if self.get("EVAL_TASKS"):
            self.positive_int(
                "EVAL_TASKS",
                "it is how many tasks of the split are evaluated, the first N (unset: VAL_SIZE; ALFWorld: every game "
                "of the split)",
            )
        if self.get("EVAL_SPLIT"):
            self.check_eval_split(env_name)
        self.v["VAL_SPLIT"] = self.get("EVAL_SPLIT") or self.get("VAL_SPLIT")
        self.v["VAL_SIZE"] = self.get("EVAL_TASKS") or self.get("VAL_SIZE")
        self.v["DATA_DIR"] = f"{self.get('DATA_DIR')}/eval-{self.get('VAL_SPLIT')}-{self.get('VAL_SIZE') or 'all'}"
        self.eval_out(f"runs/eval/{self.get('EXPERIMENT')}-{_basename(self.eval_model)}-{self.get('VAL_SPLIT')}")
        self.eval_args = ["--engine", "verl", "--out", self.get("EVAL_OUT")]
        if self.get("EVAL_EPISODES"):
            self.positive_int("EVAL_EPISODES", "it is the episodes per task (pass@k)")
            self.eval_args += ["--episodes", self.get("EVAL_EPISODES")]
        greedy = self.get("EVAL_GREEDY") or "0"
        if greedy not in ("0", "1"):
            raise RecipeError(f"EVAL_GREEDY={greedy}: use 1 (greedy decoding) or 0 (the recipe's validation sampling)")
        if greedy == "1":
            self.eval_args.append("--greedy")

    def eval_out(self, base: str) -> None:
        """EVAL_OUT: as set (refused when it holds an evaluation), else ``base`` numbered -2, -3 ... when taken."""
        given = self.get("EVAL_OUT")
        if given:
            if _holds_evaluation(given):
                self.stop_or_note(
                    f"EVAL_OUT={given} already holds an evaluation (summary.json or transcripts/): set EVAL_OUT to "
                    "another folder, or remove that one; unset, EVAL_OUT is a new folder under runs/eval/"
                )
            return
        out, number = base, 1
        while _holds_evaluation(out):
            number += 1
            out = f"{base}-{number}"
        if number > 1:
            _say(f"{base} already holds an evaluation: this one goes to {out} (EVAL_OUT sets the folder)")
        self.v["EVAL_OUT"] = out

    def check_gpus(self) -> None:
        """N_GPUS and NNODES are whole numbers >= 1; NNODES > 1 needs RAY_ADDRESS; on one machine N_GPUS are visible."""
        self.positive_int(
            "N_GPUS",
            "set N_GPUS to the number of GPUs to train on (per node), e.g. N_GPUS=2 (the default is the number of "
            "visible GPUs: nvidia-smi -L, limited by CUDA_VISIBLE_DEVICES)",
        )
        self.positive_int(
            "NNODES",
            "it is the number of Ray nodes to train on (trainer.nnodes), each with N_GPUS GPUs, e.g. NNODES=2 "
            "RAY_ADDRESS=<head>:6379 (docs/multi-node.md)",
        )
        nodes = int(self.get("NNODES"))
        if nodes > 1 and not self.get("RAY_ADDRESS"):
            raise RecipeError(
                f"NNODES={nodes} trains on {nodes} Ray nodes, but RAY_ADDRESS is not set: start a Ray cluster "
                "(`ray start --head` here, `ray start --address=<head>:6379` on each other node; docs/multi-node.md) "
                "and set RAY_ADDRESS=<head>:6379, or set NNODES=1"
            )
        if self.dry or self.cpu or self.get("RAY_ADDRESS"):
            return
        visible = self.environ.get("GIGPO_VISIBLE_GPUS", "")
        if not visible:
            raise RecipeError(
                "no NVIDIA GPU found (nvidia-smi is missing). These recipes train with verl on GPUs (vLLM + FSDP, see "
                "requirements-gpu.txt). On a CPU or to try things out use `make demo` or "
                f"`{self.python} -m verl_gigpo.local.train`. To only print the command, set DRY_RUN=1."
            )
        if int(visible) < int(self.get("N_GPUS")):
            raise RecipeError(
                f"N_GPUS={self.get('N_GPUS')} but {visible} GPU(s) are visible; set N_GPUS={visible} (or "
                "CUDA_VISIBLE_DEVICES)"
            )

    def check_model(self) -> None:
        """MODEL_PATH: a local path must exist (DEVICE=cpu: a local folder); a hub id is left to verl."""
        if self.dry:
            return
        model = self.get("MODEL_PATH")
        if self.cpu and not os.path.isdir(model) and model not in table.TINY_MODELS:
            raise RecipeError(
                f"MODEL_PATH={model} is not a model folder. DEVICE=cpu runs a tiny local model: build one with "
                f"`{self.python} -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model` (or `make e2e`, which "
                "builds artifacts/tiny-model-actions) and set MODEL_PATH to it"
            )
        if model.startswith(("/", "./", "../", "~")):
            if not os.path.isdir(os.path.expanduser(model)):
                raise RecipeError(
                    f"MODEL_PATH={model} does not exist; set MODEL_PATH to a local model folder or a Hugging Face id "
                    "such as Qwen/Qwen2.5-1.5B-Instruct"
                )
        elif self.environ.get("HF_HUB_OFFLINE", "0") == "1" and not os.path.isdir(model):
            raise RecipeError(
                f"MODEL_PATH={model} is a hub id but HF_HUB_OFFLINE=1; set MODEL_PATH to a local model folder"
            )

    def check_alfworld_data(self) -> None:
        """ALFWORLD_DATA is the ALFWorld data folder (json_2.1.1/ and logic/); not checked by a dry run."""
        if self.env != "alfworld" or self.dry:
            return
        data = self.get("ALFWORLD_DATA")
        get_games = (
            "`alfworld-download` fills ~/.cache/alfworld on a machine with GitHub access (copy that folder to this "
            f"machine), or `{self.python} -m environments.alfworld.synth --out DIR` writes synthetic games offline"
        )
        what = "set it to the ALFWorld data folder, which holds json_2.1.1/ (the games) and logic/"
        if not data:
            raise RecipeError(f"ALFWORLD_DATA is not set: {what}; {get_games}")
        if not os.path.isdir(data):
            raise RecipeError(f"ALFWORLD_DATA={data} does not exist (or is not a folder): {what}; {get_games}")
        if not os.path.isdir(os.path.join(data, "json_2.1.1")):
            raise RecipeError(f"ALFWORLD_DATA={data} has no json_2.1.1/ folder: {what}; {get_games}")

    def check_mini_batch(self) -> None:
        """The batch sizes are whole numbers; warn when a rank's lcm of micro-batches exceeds MINI_BATCH_ROWS."""
        self.positive_int(
            "MINI_BATCH_ROWS",
            "it is the most step rows per optimizer step (trainer.v1.gigpo_sync.mini_batch_rows; each recipe "
            "defaults to the reference's ppo_mini_batch_size)",
        )
        self.positive_int(
            "MICRO_BATCH_PER_GPU",
            "it is the actor's micro-batch per GPU (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)",
        )
        self.positive_int(
            "LOG_PROB_MICRO_BATCH_PER_GPU",
            "it is the micro-batch per GPU of the log-prob passes "
            "(actor_rollout_ref.{rollout,ref}.log_prob_micro_batch_size_per_gpu)",
        )
        micro, log_prob, rows = (
            int(self.get(n)) for n in ("MICRO_BATCH_PER_GPU", "LOG_PROB_MICRO_BATCH_PER_GPU", "MINI_BATCH_ROWS")
        )
        nodes = int(self.get("NNODES") or 1)
        ranks = nodes * int(self.get("N_GPUS"))
        multiple = ranks * micro * log_prob // math.gcd(micro, log_prob)
        if multiple > rows:
            _say(
                f"warning: MINI_BATCH_ROWS={rows} is below the rows one update step needs on {ranks} GPU(s) "
                f"({multiple} = {'NNODES x ' if nodes > 1 else ''}N_GPUS x lcm(MICRO_BATCH_PER_GPU={micro}, "
                f"LOG_PROB_MICRO_BATCH_PER_GPU={log_prob})): each optimizer step takes {multiple} rows; lower the "
                f"micro-batch sizes to keep {rows}"
            )

    def attention(self) -> tuple[str, str]:
        """(attention backend, use_remove_padding): flash_attention_2 when it imports (auto), else sdpa; DEVICE=cpu:
        nothing (platform=cpu sets sdpa)."""
        if self.cpu:
            return "", "false"
        attn = self.get("ATTN_IMPLEMENTATION")
        if attn == "auto":
            found = subprocess.run([self.python, "-c", "import flash_attn"], capture_output=True).returncode == 0
            attn = "flash_attention_2" if found else "sdpa"
            if not found:
                _say(
                    f"warning: flash_attn does not import with {self.python}: the actor and reference model use sdpa "
                    "attention (slower, more memory; padded micro-batches); add flash-attn as docs/gpu.md#flash-attn "
                    "says, or set ATTN_IMPLEMENTATION=sdpa to choose it"
                )
        if attn not in ("flash_attention_2", "sdpa", "eager"):
            raise RecipeError(f"ATTN_IMPLEMENTATION={attn}: use auto, flash_attention_2, sdpa or eager")
        return attn, "true" if attn == "flash_attention_2" else "false"

    def lora(self) -> list[str]:
        """verl's LoRA keys from LORA_RANK (0: none), and the LR / USE_KL_LOSS of the reference's runs of each kind."""
        rank = self.lora_rank()
        overrides = []
        if rank == 0:
            if self.get("LORA_ALPHA") or self.get("LORA_TARGET_MODULES"):
                raise RecipeError(
                    "LORA_ALPHA or LORA_TARGET_MODULES is set but LORA_RANK is 0 (LoRA off); set LORA_RANK, e.g. "
                    "LORA_RANK=64"
                )
            self.default("LR", "1e-6")
            self.default("USE_KL_LOSS", "true")
        else:
            self.default("LORA_ALPHA", str(rank))
            self.positive_int(
                "LORA_ALPHA",
                "it is the LoRA scaling numerator (the adapter is scaled by LORA_ALPHA / LORA_RANK; the default is "
                "LORA_RANK)",
            )
            targets = self.default("LORA_TARGET_MODULES", "all-linear")
            if targets != "all-linear":
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*(,[A-Za-z_][A-Za-z0-9_.]*)*", targets):
                    raise RecipeError(
                        f"LORA_TARGET_MODULES={targets}: use all-linear or a comma-separated list of module names, "
                        "e.g. q_proj,k_proj,v_proj,o_proj"
                    )
                targets = f"[{targets}]"
            self.default("LR", "3e-6")
            self.default("USE_KL_LOSS", "false")
            overrides = [
                f"actor_rollout_ref.model.lora_rank={rank}",
                f"actor_rollout_ref.model.lora_alpha={self.get('LORA_ALPHA')}",
                f"actor_rollout_ref.model.target_modules={targets}",
            ]
            _say(
                f"LoRA: rank {rank}, alpha {self.get('LORA_ALPHA')}, target modules {self.get('LORA_TARGET_MODULES')}; "
                f"lr {self.get('LR')}, KL loss {self.get('USE_KL_LOSS')} (LR and USE_KL_LOSS change them)"
            )
        if not re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE]-?[0-9]+)?", self.get("LR")):
            raise RecipeError(f"LR={self.get('LR')} is not a number; e.g. LR=1e-6")
        if self.get("USE_KL_LOSS") not in ("true", "false"):
            raise RecipeError(f"USE_KL_LOSS={self.get('USE_KL_LOSS')}: use true or false")
        return overrides

    def thinking(self) -> list[str]:
        """THINKING=0 / 1: the chat template's enable_thinking switch (Qwen3); unset: the template's default."""
        value = self.get("THINKING")
        if value in ("0", "1"):
            return [f"++data.apply_chat_template_kwargs.enable_thinking={'true' if value == '1' else 'false'}"]
        if value:
            raise RecipeError(
                f"THINKING={value}: use THINKING=0 (thinking off: the chat template's enable_thinking=false, e.g. for "
                "Qwen3) or THINKING=1 (on), or leave it unset for the template's default"
            )
        return []

    def dynamic(self) -> list[str]:
        """DYNAMIC=episode|signal: dynamic sampling with the reference's generation batches and clip range."""
        kind = self.get("DYNAMIC")
        if not kind:
            return []
        if kind not in ("episode", "signal"):
            raise RecipeError(
                f"DYNAMIC={kind}: use DYNAMIC=episode (drop groups whose episode returns are all equal and play fresh "
                "tasks instead, the reference's dynamic GiGPO) or DYNAMIC=signal (keep a group whose step term has "
                "signal too), or leave it unset (no dynamic sampling)"
            )
        estimator = self.get("ADV_ESTIMATOR")
        if kind == "signal" and estimator not in table.STEP_CREDIT:
            raise RecipeError(
                "DYNAMIC=signal needs a step-credit estimator (ADV_ESTIMATOR=gigpo, hgpo, graphgpo or g2po); "
                f"ADV_ESTIMATOR={estimator} has no step term: use DYNAMIC=episode"
            )
        self.default("MAX_GEN_BATCHES", "10")
        self.positive_int(
            "MAX_GEN_BATCHES",
            "it is the most generation batches (rounds of data.train_batch_size tasks) an iteration plays with "
            "dynamic sampling (algorithm.filter_groups.max_num_gen_batches), e.g. MAX_GEN_BATCHES=10 as the reference",
        )
        return [
            "algorithm.filter_groups.enable=true",
            f"algorithm.filter_groups.filter={kind}",
            f"algorithm.filter_groups.max_num_gen_batches={self.get('MAX_GEN_BATCHES')}",
            # the reference's dynamic GiGPO scripts also raise the upper clip range (DAPO's clip-higher)
            f"actor_rollout_ref.actor.clip_ratio_low={self.default('CLIP_RATIO_LOW', '0.2')}",
            f"actor_rollout_ref.actor.clip_ratio_high={self.default('CLIP_RATIO_HIGH', '0.28')}",
        ]

    def prompt_template(self) -> list[str]:
        """PROMPT_TEMPLATE: a template file instead of the environment's wording, with the reference's layout."""
        path = self.get("PROMPT_TEMPLATE")
        if not path:
            return []
        if not os.path.isfile(path):
            name = "sokoban_image" if self.env == "sokoban" and self.images else self.env
            raise RecipeError(
                f"PROMPT_TEMPLATE={path} is not a file: give a template file, e.g. ~/gigpo-prompts/{name}.txt as "
                f"written by `{self.python} -m verl_gigpo.prompts from-reference /path/to/verl-agent`"
            )
        item, actions = table.TEMPLATE_LAYOUT[self.env]
        absolute = os.path.join(os.path.abspath(os.path.dirname(path)), os.path.basename(path))
        return [
            f"env.prompt.template={hydra_quote(absolute)}",
            f"env.prompt.history_item={item}",
            f"env.prompt.admissible_actions={actions}",
            "env.prompt.show_step_limit=true",
        ]

    def shared_overrides(self) -> list[str]:
        """The settings every recipe shares (recipes/reference_settings.yaml), after their checks."""
        self.whole_number("SEED", "it seeds the order in which training tasks are drawn (data.seed), e.g. SEED=1")
        if not re.fullmatch(r"[a-z_]+(,[a-z_]+)*", self.get("LOGGER")):
            raise RecipeError(
                f"LOGGER={self.get('LOGGER')} is not a comma-separated list of verl logger names; e.g. "
                "LOGGER=console,file,tensorboard (verl knows console, file, tensorboard, wandb, mlflow, swanlab, "
                "clearml, trackio)"
            )
        self.positive_int(
            "TOTAL_ITERS",
            "it is the number of training iterations (trainer.total_training_steps), e.g. TOTAL_ITERS=150",
        )
        self.positive_int(
            "MAX_CKPTS_TO_KEEP",
            "it is how many checkpoints verl keeps (trainer.max_actor_ckpt_to_keep); to keep every checkpoint pass "
            "trainer.max_actor_ckpt_to_keep=null as an override",
        )
        self.positive_int(
            "PROMPT_LENGTH", "it is the most tokens of a prompt (data.max_prompt_length), e.g. PROMPT_LENGTH=4096"
        )
        self.check_mini_batch()
        self.check_image_settings()
        attn, remove_padding = self.attention()
        lora, thinking, dynamic, template = self.lora(), self.thinking(), self.dynamic(), self.prompt_template()
        gpu = "false" if self.cpu else "true"
        tasks = int(self.get("TRAIN_TASKS_PER_ITER"))
        ray = self.get("RAY_ADDRESS")
        return [
            *(["platform=cpu"] if self.cpu else []),
            f"actor_rollout_ref.model.path={hydra_quote(self.get('MODEL_PATH'))}",
            *([f"++actor_rollout_ref.model.override_config.attn_implementation={attn}"] if attn else []),
            f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
            f"actor_rollout_ref.model.enable_gradient_checkpointing={gpu}",
            *lora,
            f"actor_rollout_ref.actor.optim.lr={self.get('LR')}",
            # an iteration's step rows make equal mini-batches of at most MINI_BATCH_ROWS rows (the gigpo_sync mode)
            f"trainer.v1.gigpo_sync.mini_batch_rows={self.get('MINI_BATCH_ROWS')}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={min(tasks, 16)}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={self.get('MICRO_BATCH_PER_GPU')}",
            f"actor_rollout_ref.actor.use_kl_loss={self.get('USE_KL_LOSS')}",
            f"actor_rollout_ref.actor.kl_loss_coef={self.get('KL_COEF')}",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            f"actor_rollout_ref.actor.entropy_coeff={self.get('ENTROPY_COEF')}",
            "actor_rollout_ref.actor.fsdp_config.param_offload=false",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
            f"actor_rollout_ref.rollout.name={self.get('ROLLOUT_NAME')}",
            f"actor_rollout_ref.rollout.n={self.get('GROUP_SIZE')}",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={self.get('LOG_PROB_MICRO_BATCH_PER_GPU')}",
            "actor_rollout_ref.rollout.temperature=1.0",
            f"actor_rollout_ref.rollout.val_kwargs.do_sample={self.get('VAL_DO_SAMPLE')}",
            f"actor_rollout_ref.rollout.val_kwargs.temperature={self.get('VAL_TEMPERATURE')}",
            "actor_rollout_ref.rollout.val_kwargs.n=1",
            f"data.seed={self.get('SEED')}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={self.get('LOG_PROB_MICRO_BATCH_PER_GPU')}",
            f"actor_rollout_ref.ref.fsdp_config.param_offload={gpu}",
            f"trainer.n_gpus_per_node={self.get('N_GPUS')}",
            f"trainer.nnodes={self.get('NNODES')}",
            *([f"ray_kwargs.ray_init.address={hydra_quote(ray)}"] if ray else []),
            f"trainer.total_training_steps={self.get('TOTAL_ITERS')}",
            "trainer.total_epochs=1000",
            f"trainer.test_freq={self.get('TEST_FREQ')}",
            "trainer.save_freq=50",
            f"trainer.max_actor_ckpt_to_keep={self.get('MAX_CKPTS_TO_KEEP')}",
            "trainer.val_before_train=true",
            "trainer.critic_warmup=0",
            f"trainer.logger=[{self.get('LOGGER')}]",
            "trainer.project_name=verl_gigpo",
            f"trainer.experiment_name={hydra_quote(self.get('EXPERIMENT'))}",
            # the reference's prompt structure and reward accounting (docs/environments.md, docs/estimators.md)
            "env.prompt.show_step_limit=false",
            "env.prompt.first_step_number=1",
            "env.invalid_action_penalty_mode=reference",
            "algorithm.gigpo.episode_stats=step",
            *thinking,
            *dynamic,
            *template,
        ]

    # ------------------------------------------------------------------------------------------------ resume
    def experiment_folder(self) -> str | None:
        """verl's trainer.default_local_dir for this launch, absolute; None when an override is not plain."""
        args = self.args
        folder = override_value("trainer.default_local_dir", args)
        if folder is None:
            project = override_value("trainer.project_name", args) or "verl_gigpo"
            experiment = override_value("trainer.experiment_name", args)
            if not plain_value(project) or (experiment is not None and not plain_value(experiment)):
                return None
            folder = f"checkpoints/{project}/{experiment or self.get('EXPERIMENT')}"
        elif not plain_value(folder):
            return None
        return folder if folder.startswith("/") else f"{os.getcwd()}/{folder}"

    def rollout_servers(self) -> str:
        """What serves the rollouts, for messages: vLLM, SGLang or "the <name> rollout servers"."""
        name = override_value("actor_rollout_ref.rollout.name", self.args) or self.get("ROLLOUT_NAME")
        return {"vllm": "vLLM", "sglang": "SGLang"}.get(name, f"the {name} rollout servers")

    def eval_command(self, ckpt: str) -> str:
        """The command that evaluates ``ckpt`` with this recipe and the variables the user set that it needs."""
        words = ["EVAL_ONLY=1", f"CKPT={shlex.quote(ckpt)}"]
        words += [f"{name}={shlex.quote(value)}" for name, value in self.given.items()]
        return f"{' '.join(words)} bash {self.script}"

    def check_resume(self) -> None:
        """Before a training launch: warn about CKPT; stop when the experiment has already trained TOTAL_ITERS."""
        if self.eval_only:
            return
        folder = self.experiment_folder()
        if self.get("CKPT"):
            _say(
                f"warning: CKPT={self.get('CKPT')} is ignored: CKPT is read only with EVAL_ONLY=1 (evaluate that "
                "checkpoint), and this launch trains. A training launch resumes by itself from the newest checkpoint "
                f"in its experiment folder ({folder or 'trainer.default_local_dir'}), so the same EXPERIMENT "
                "continues its run; to train on from another verl checkpoint pass trainer.resume_mode=resume_path "
                "trainer.resume_from_path=.../global_step_N, from a Hugging Face folder set MODEL_PATH"
            )
        mode = override_value("trainer.resume_mode", self.args) or "auto"
        val_only = (override_value("trainer.val_only", self.args) or "").lower() == "true"
        if mode != "auto" or folder is None or val_only:
            return
        setting, total = "TOTAL_ITERS", self.get("TOTAL_ITERS")
        if override_value("trainer.total_training_steps", self.args) is not None:
            setting, total = "trainer.total_training_steps", override_value("trainer.total_training_steps", self.args)
        step = resumed_step(folder)
        if not re.fullmatch(r"[1-9][0-9]{0,17}", total) or not step or step < int(total):
            return
        ckpt = f"{folder}/global_step_{step}"
        name = override_value("trainer.experiment_name", self.args) or self.get("EXPERIMENT")
        start_over = "set a new EXPERIMENT"
        if override_value("trainer.experiment_name", self.args) is not None:
            start_over = "pass another trainer.experiment_name"
        if override_value("trainer.default_local_dir", self.args) is not None:
            start_over = "pass another trainer.default_local_dir"
        done = f"finished {step}/{total} steps"
        if step > int(total):
            done = f"trained {step} steps, more than the {total} this launch asks for"
        self.stop_or_note(
            f"experiment {name} has already {done} ({setting}={total}); its checkpoint: {ckpt}. A launch would start "
            f"Ray and {self.rollout_servers()}, load it and stop without training. To train on, raise {setting} (e.g. "
            f"{setting}={step + 50}: verl resumes from step {step}); to start over, {start_over} (or delete {folder}); "
            f"to evaluate it: {self.eval_command(ckpt)}"
        )

    # --------------------------------------------------------------------------------------------- data prep
    def prep_setting(self, flag: str, env_name: str) -> str:
        """The recipe variable behind a data-prep argument (messages about a changed setting name it)."""
        names = {"--train-size": "TRAIN_SIZE", "--val-size": "VAL_SIZE", "--val-split": "VAL_SPLIT"}
        if self.eval_only:
            names |= {"--val-size": "EVAL_TASKS", "--val-split": "EVAL_SPLIT"}
        names["--env"] = "WEBSHOP_ENV" if env_name.startswith("webshop") else "the environment"
        names["--env-kwargs"] = "ALFWORLD_DATA" if env_name == "alfworld" else "the environment's arguments"
        return names.get(flag, flag)

    def prep_reason(self, out: str, env_name: str, args: list[tuple[str, str]]) -> str:
        """Why the task files in ``out`` must be written for ``args``; "" when its stamp says they were."""
        if not (Path(out, "train.parquet").is_file() and Path(out, "val.parquet").is_file()):
            return f"{out} has no train.parquet or val.parquet"
        stamp = Path(out, PREP_STAMP)
        if not stamp.is_file():
            return (
                f"the task files in {out} have no {PREP_STAMP} (prepared by an older recipe or by hand, or by a data "
                "prep that did not finish), so the settings they hold are unknown"
            )
        old = dict(
            line.split(" ", 1) for line in stamp.read_text().splitlines() if line.startswith("--") and " " in line
        )
        new = {flag: value.replace("\n", "\\n") for flag, value in args}
        flags, none = [*new, *(flag for flag in old if flag not in new)], "(not given)"
        changes = [
            f"{self.prep_setting(flag, env_name)}: {flag} {old.get(flag, none)} -> {new.get(flag, none)}"
            for flag in flags
            if old.get(flag, none) != new.get(flag, none)
        ]
        return f"the task files in {out} were prepared with other settings ({'; '.join(changes)})" if changes else ""

    def prepare_data(self, env_name: str) -> None:
        """Write DATA_DIR/{train,val}.parquet with ``python -m verl_gigpo.data.prepare`` unless its stamp says they
        were written with these arguments; DRY_RUN=1 prints the command as a comment, headed by whether it runs."""
        out = self.get("DATA_DIR")
        args = [("--env", env_name), ("--train-size", self.get("TRAIN_SIZE"))]
        args += [(flag, self.get(name)) for flag, name in table.RECIPES[self.env]["prep"] if self.get(name)]
        argv = [a for pair in args for a in pair]
        cmd = [self.python, "-m", "verl_gigpo.data.prepare", *argv[:4], "--out", out, *argv[4:]]
        reason = self.prep_reason(out, env_name, args)
        if self.dry:
            head = (
                f"runs: {reason}" if reason else f"skipped: the task files in {out} were written with these arguments"
            )
            print(f"# data prep ({head}):\n# {' '.join(shlex.quote(a) for a in cmd)} ", flush=True)
            return
        if not reason:
            _say(f"using task files in {out} (written with this recipe's data-prep settings: {out}/{PREP_STAMP})")
            return
        if Path(out, "train.parquet").is_file() and Path(out, "val.parquet").is_file():
            _say(f"{reason}: preparing them again")
        Path(out, PREP_STAMP).unlink(missing_ok=True)
        code = subprocess.run(cmd, env=self.child_environ()).returncode
        if code:
            sys.exit(code)
        lines = [
            "# the arguments of python -m verl_gigpo.data.prepare that wrote the task files here (recipes/driver.py)"
        ]
        lines += [f"{flag} {value.replace(chr(10), chr(92) + 'n')}" for flag, value in args]
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, PREP_STAMP + ".tmp").write_text("\n".join(lines) + "\n")
        os.replace(Path(out, PREP_STAMP + ".tmp"), Path(out, PREP_STAMP))

    # ------------------------------------------------------------------------------------------------ launch
    def command(self, env_name: str, shared: list[str]) -> list[str]:
        """``PYTHON -m verl_gigpo.main`` with the recipe's, its estimator's, the shared and the user's overrides."""
        values = {name: _Value(value) for name, value in self.v.items()}
        values.setdefault("RETRIEVER_URL", _Value(""))
        env_overrides = []
        for entry in table.RECIPES[self.env]["overrides"]:
            if isinstance(entry, tuple):
                if not self.get(entry[0]):
                    continue
                entry = entry[1]
            env_overrides.append(entry.format_map(values))
        data = self.get("DATA_DIR")
        return [
            self.python,
            "-m",
            "verl_gigpo.main",
            f"algorithm.adv_estimator={self.get('ADV_ESTIMATOR')}",
            "algorithm.gamma=0.95",
            "algorithm.gigpo.step_advantage_w=1.0",
            f"algorithm.gigpo.norm={self.get('ADV_NORM')}",
            "algorithm.norm_adv_by_std_in_grpo=true",
            f"env.name={env_name}",
            f"env.max_steps={self.get('MAX_STEPS')}",
            *env_overrides,
            f"data.train_files={hydra_quote(data + '/train.parquet')}",
            f"data.val_files={hydra_quote(data + '/val.parquet')}",
            f"data.train_batch_size={self.get('TRAIN_TASKS_PER_ITER')}",
            f"data.max_prompt_length={self.get('PROMPT_LENGTH')}",
            f"data.max_response_length={self.get('RESPONSE_LENGTH')}",
            "data.filter_overlong_prompts=false",
            "data.return_raw_chat=true",
            *self.estimator_overrides,
            *self.vision_overrides(),
            *shared,
            *self.args,
        ]

    def launch(self, cmd: list[str]) -> None:
        """Run ``cmd`` (EVAL_ONLY=1: the evaluation of the checkpoint with its overrides); DRY_RUN=1 prints it."""
        if self.eval_only:
            cmd = [cmd[0], "-m", "verl_gigpo.evaluate", self.eval_model, *self.eval_args, "--", *cmd[3:]]
        if self.dry:
            lines = [f"{shlex.quote(cmd[0])} -m {shlex.quote(cmd[2])}", *(f"    {shlex.quote(a)}" for a in cmd[3:])]
            print(" \\\n".join(lines), flush=True)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe(cmd[0], cmd, self.child_environ())

    def run(self) -> None:
        """The recipe, step by step: every check before data prep, data prep, then the launch."""
        self.fill_defaults()
        env_name = self.get("WEBSHOP_ENV") if self.env == "webshop" else self.env
        self.experiment_setup()
        self.eval_setup(env_name)
        self.check_gpus()
        self.check_model()
        self.check_alfworld_data()
        shared = self.shared_overrides()
        self.check_resume()
        if self.env == "alfworld":
            self.v["ALFWORLD_KWARGS"] = json.dumps({"data_path": self.get("ALFWORLD_DATA")}, ensure_ascii=False)
        self.tiny_model()
        self.prepare_data(env_name)
        self.launch(self.command(env_name, shared))


def resumed_step(folder: str) -> int:
    """The step verl's ``trainer.resume_mode=auto`` resumes ``folder`` from (0: none): the number its pointer
    ``latest_checkpointed_iteration.txt`` names, when that ``global_step_<N>`` folder exists. The rule of
    ``verl_gigpo.verl_glue.launch.read_checkpoint_folder`` (``.latest``), which tests/test_recipes_ux.py holds it to;
    read here without importing the package, so that a dry run needs only the standard library."""
    pointer = Path(folder, "latest_checkpointed_iteration.txt")
    text = pointer.read_text(errors="replace").strip() if pointer.is_file() else ""
    if not re.fullmatch(r"[0-9]{1,18}", text) or not Path(folder, f"global_step_{int(text)}").is_dir():
        return 0
    return int(text)


def _basename(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path


def _holds_evaluation(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, "summary.json")) or os.path.exists(os.path.join(folder, "transcripts"))


def main(argv: list[str]) -> None:
    """``driver.py ENV SCRIPT [OVERRIDES...]`` with the recipe variables in the environment (recipes/common.sh)."""
    if "GIGPO_PYTHON" not in os.environ or len(argv) < 2 or argv[0] not in table.RECIPES:
        _say(f"error: run a recipe (bash recipes/run_<env>.sh, <env>: {', '.join(table.RECIPES)}), not this file")
        sys.exit(2)
    env, script, *args = argv
    try:
        Recipe(env, script, args, dict(os.environ)).run()
    except RecipeError as error:
        _say(f"error: {error}")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
