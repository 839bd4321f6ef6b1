"""The learning benchmark's settings (``benchmarks/learning.py``): the task, the configurations, the suites, each
engine's defaults, and the overrides of every run — the local benchmark's (:func:`local_overrides`), the side-by-side
runs' (:func:`shared_settings`, one table for both engines, printed into RESULTS.md; :func:`twin_overrides` and
:func:`verl_overrides`). Nothing here launches or reads a run (``learning_run``) or writes a report
(``learning_report``).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gigpo.dev.demo import KEY_TASK

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Learning: GiGPO vs GRPO"
SECTION_VERL = "## GiGPO against GRPO, paired, on both engines"
SECTION_SUCCESSORS = "## Learning: GiGPO and its successors"
ENGINES = ("local", "verl")

#: The benchmark task (env overrides shared by every configuration): gridnav with a key, as the imitation demo's.
TASK: tuple[str, ...] = KEY_TASK

#: The tasks ``--task`` picks (``TASK`` = "key", the local benchmark's): "goal" is ``make demo``'s task, gridnav
#: without a key (the observation gives the goal's offset; about 8% of random episodes succeed).
TASKS: dict[str, tuple[str, ...]] = {
    "key": TASK,
    "goal": (
        "env.name=gridnav",
        "env.kwargs.size=5",
        "env.kwargs.walls=[3,6]",
        "env.kwargs.min_path=3",
        "env.max_steps=10",
    ),
}
TASK_TITLES = {"key": "gridnav with a key", "goal": "gridnav (goal offset, no key)"}

#: name -> overrides. gigpo = the paper's setting (w = 1, mean_std, trajectory statistics, state anchors).
CONFIGS: dict[str, tuple[str, ...]] = {
    "gigpo": ("algorithm.adv_estimator=gigpo",),
    "gigpo_w0.5": ("algorithm.adv_estimator=gigpo", "algorithm.gigpo.step_advantage_w=0.5"),
    "gigpo_w0": ("algorithm.adv_estimator=gigpo", "algorithm.gigpo.step_advantage_w=0.0"),
    "gigpo_mean": ("algorithm.adv_estimator=gigpo", "algorithm.gigpo.norm=mean"),
    "grpo": ("algorithm.adv_estimator=grpo",),
    "rloo": ("algorithm.adv_estimator=rloo",),
    # the successors (verl_gigpo.advantage; default options: the papers'), see docs/estimators.md
    "hgpo": ("algorithm.adv_estimator=hgpo", "algorithm.hgpo.history_length=2"),
    "graphgpo": ("algorithm.adv_estimator=graphgpo",),
    "g2po": ("algorithm.adv_estimator=g2po",),
    # dynamic sampling (docs/dynamic-sampling.md; benchmarks/dynamic_sampling.py runs them on the local engine)
    "gigpo_signal": (
        "algorithm.adv_estimator=gigpo",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.filter=signal",
    ),
    "gigpo_episode": (
        "algorithm.adv_estimator=gigpo",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.filter=episode",
    ),
}

#: --suite: which configurations the local benchmark runs by default, its section, plot and run folder
SUITES: dict[str, dict[str, str]] = {
    "estimators": {
        "configs": "gigpo,gigpo_w0.5,gigpo_w0,gigpo_mean,grpo,rloo",
        "section": SECTION,
        "png": "learning.png",
        "runs": "runs/learning",
    },
    "successors": {
        "configs": "gigpo,hgpo,graphgpo,g2po,grpo",
        "section": SECTION_SUCCESSORS,
        "png": "learning_successors.png",
        "runs": "runs/learning-successors",
    },
}
STEP_CREDIT = ("gigpo", "hgpo", "graphgpo", "g2po")

#: the model of the side-by-side runs (--engine verl): replies to gridnav prompts with an action word + EOS
ACTION_MODEL = "artifacts/tiny-model-actions"
ACTION_MODEL_COMMAND = (
    f"python -m verl_gigpo.dev.tiny_model --out {ACTION_MODEL} --envs gridnav --sft-actions"  # 40 SFT steps
)
#: the paired study's start model (the default of --engine verl): 60 % expert actions on the key task (it wins a few
#: percent of its validation episodes, sampled at temperature 1), built when missing with IMITATE_COMMAND
IMITATE_MODEL = "artifacts/tiny-model-imitate-key06"
IMITATE_KWARGS = {"key": True, "min_path": 5, "observe": "target", "size": 5, "walls": [2, 4]}
IMITATE_ARGS = ["--imitate", "gridnav:0.6", "--imitate-kwargs", json.dumps(IMITATE_KWARGS)]
IMITATE_ARGS += ["--imitate-max-steps", "15", "--imitate-history", "0"]
IMITATE_COMMAND = f"python -m verl_gigpo.dev.tiny_model --out {IMITATE_MODEL} " + " ".join(
    f"'{a}'" if a.startswith("{") else a for a in IMITATE_ARGS
)
#: the learning rate of the paired study (the fall-back study's stable setting, RESULTS.md "The fall-back")
STABLE_LR = "3e-4"  # a string: the override is written as given, and kept cells compare overrides as text
#: verl's file logger output in a verl run folder: the experiment folder's metrics file (docs/runs.md)
VERL_METRICS = "ckpt/metrics.jsonl"
#: tokens per reply in the side-by-side runs: the action word, EOS, one spare (both engines)
REPLY_TOKENS = 3


# ---------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """A setting both engines share: what it is, and the overrides that set it on each engine."""

    what: str
    local: tuple[str, ...]
    verl: tuple[str, ...]


def _same(what: str, *overrides: str) -> Setting:
    return Setting(what, overrides, overrides)


def _task_value(task: tuple[str, ...], key: str) -> str:
    return next(o.split("=", 1)[1] for o in task if o.startswith(key + "="))


def verl_task(task: tuple[str, ...]) -> tuple[str, ...]:
    """A task's overrides for verl: ``env.kwargs`` is an empty dict in verl's config, so its keys take ``+``."""
    return tuple("+" + o if o.startswith("env.kwargs.") else o for o in task)


def shared_settings(args: argparse.Namespace) -> list[Setting]:
    """Every setting the side-by-side runs share, with each engine's overrides (one table for both engines; also
    printed into RESULTS.md). Optimizer steps per iteration (``--opt-steps`` k): the local engine takes tasks / k
    whole tasks per step (``ppo_mini_batch_size``; null = the whole iteration), verl's ``gigpo_sync`` mode at most
    ceil(tasks x group x max_steps / k) step rows per step (``mini_batch_rows``), k steps for a full iteration."""
    task = TASKS[args.task]
    per_step = args.tasks // args.opt_steps
    # the most step rows an iteration can hold, split into opt_steps optimizer steps
    max_rows = math.ceil(args.tasks * args.group * int(_task_value(task, "env.max_steps")) / args.opt_steps)
    sampling = ("temperature=1.0", "top_p=1.0", "top_k=-1")
    return [
        Setting("task", task, verl_task(task)),
        _same("prompt: no history; invalid-action penalty", "env.history_length=0", "env.invalid_action_penalty=0.1"),
        _same("model (both sample over the full vocabulary)", f"actor_rollout_ref.model.path={args.model}"),
        Setting("output tokens (local: no action-token constraint)", ("local.constrain_to_actions=false",), ()),
        Setting(
            "tokens per reply (action + EOS)",
            (f"actor_rollout_ref.rollout.response_length={REPLY_TOKENS}",),
            (f"data.max_response_length={REPLY_TOKENS}",),
        ),
        _same("prompt budget", "data.max_prompt_length=256"),
        _same("tasks per iteration", f"data.train_batch_size={args.tasks}"),
        _same("group size (episodes per task)", f"actor_rollout_ref.rollout.n={args.group}"),
        _same("iterations", f"trainer.total_training_steps={args.iters}"),
        _same("rollout sampling", *(f"actor_rollout_ref.rollout.{kv}" for kv in sampling)),
        _same("learning rate (constant, no warm-up)", "actor_rollout_ref.actor.optim.lr=1e-3"),
        _same("AdamW weight decay (verl's default: 0.01)", "actor_rollout_ref.actor.optim.weight_decay=0.0"),
        _same("PPO epochs", "actor_rollout_ref.actor.ppo_epochs=1"),
        Setting(
            f"optimizer steps per iteration: {args.opt_steps} (local: {per_step} task(s) each; verl: at most "
            f"{max_rows} step rows each, shuffled across tasks: {args.opt_steps} when the iteration is full)",
            (f"actor_rollout_ref.actor.ppo_mini_batch_size={'null' if args.opt_steps == 1 else per_step}",),
            (
                f"trainer.v1.gigpo_sync.mini_batch_rows={max_rows}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={per_step}",
            ),
        ),
        _same(
            "policy loss (PPO-clip) and aggregation",
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        ),
        _same("PPO clip range", "actor_rollout_ref.actor.clip_ratio=0.2"),
        _same("gradient-norm clip", "actor_rollout_ref.actor.grad_clip=1.0"),
        Setting(
            "KL to the initial model: off",
            ("actor_rollout_ref.actor.use_kl_loss=false",),
            ("actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false"),
        ),
        _same("entropy bonus: off", "actor_rollout_ref.actor.entropy_coeff=0.0"),
        _same("discount; GiGPO anchors: environment state", "algorithm.gamma=0.95", "algorithm.gigpo.key_mode=state"),
        _same("GRPO: divide by the group std", "algorithm.norm_adv_by_std_in_grpo=true"),
        Setting(
            f"validation: tasks 0..{args.val_size - 1} of the test split (verl: `val.parquet`), 1 episode each, "
            "sampled at temperature 1",
            (
                f"data.val_size={args.val_size}",
                "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                *(f"actor_rollout_ref.rollout.val_kwargs.{kv}" for kv in ("temperature=1.0", "n=1")),
            ),
            (
                "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                *(f"actor_rollout_ref.rollout.val_kwargs.{kv}" for kv in ("n=1", *sampling)),
            ),
        ),
        _same(
            "validation frequency (and before the first, after the last iteration)",
            f"trainer.test_freq={args.test_freq}",
        ),
    ]


def _credit(name: str, args: argparse.Namespace) -> list[str]:
    """Credit records (``trainer.credit_log_freq``, same key on both engines) for runs of a step-credit estimator."""
    if args.credit_freq <= 0 or not any(f"algorithm.adv_estimator={m}" in CONFIGS[name] for m in STEP_CREDIT):
        return []
    return [f"trainer.credit_log_freq={args.credit_freq}", "trainer.credit_log_groups=2"]


#: the configurations verl launches when --verl-configs is not given (those of --configs among them; else all)
VERL_CONFIGS = ("gigpo", "grpo")

#: defaults that differ by engine (``--engine``); None in the parser = take the engine's
ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "local": {
        "task": "key",
        "opt_steps": 1,
        "micro_batch": 16,
        "seeds": 5,
        "iters": 150,
        "test_freq": 15,
        "tasks": 8,
        "group": 8,
        "model": "artifacts/tiny-model",
        "runs": "runs/learning",
        "configs": ",".join(CONFIGS),
    },
    "verl": {  # the paired study: GiGPO against GRPO on both engines (RESULTS.md, SECTION_VERL)
        "task": "key",
        "opt_steps": 1,
        "micro_batch": 16,
        "seeds": 10,
        "verl_seeds": 3,
        "iters": 150,
        "test_freq": 15,
        "tasks": 4,
        "group": 8,
        "model": IMITATE_MODEL,
        "runs": "runs/learning-verl",
        "configs": "gigpo,grpo,gigpo_episode,gigpo_signal",
        "lr": STABLE_LR,
    },
}


def ensure_start_model(model: str) -> None:
    """Build :data:`IMITATE_MODEL` when its folder is missing (:data:`IMITATE_COMMAND`); any other missing
    ``model`` is an error naming it."""
    if (Path(model) / "config.json").exists():
        return
    if model != IMITATE_MODEL:
        raise SystemExit(f"error: --model {model}: no model there (a Hugging Face folder with config.json)")
    print(f"building the start model: {IMITATE_COMMAND}", flush=True)
    command = [sys.executable, "-m", "verl_gigpo.dev.tiny_model", "--out", IMITATE_MODEL, *IMITATE_ARGS]
    subprocess.run(command, check=True)  # relative to this folder, as --model and the launches read it


# ---------------------------------------------------------------------------------------------- each run's overrides
def local_overrides(name: str, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The overrides of one run of the local benchmark (``python -m verl_gigpo.local.train``) into ``out``."""
    return [
        f"actor_rollout_ref.model.path={args.model}",
        f"trainer.default_local_dir={out}",
        "trainer.overwrite=true",  # an unfinished run (killed, or another config) starts over
        f"trainer.total_training_steps={args.iters}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.save_freq={args.iters}",
        f"trainer.seed={seed}",
        f"data.val_size={args.val_size}",
        f"data.train_batch_size={args.tasks}",
        f"actor_rollout_ref.rollout.n={args.group}",
        "local.num_threads=1",
        "local.progress=false",
        "local.plot=false",
        *TASK,
        *CONFIGS[name],
        *(_credit(name, args) if args.suite == "successors" else []),
        *args.extra,
    ]


def twin_overrides(name: str, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The overrides of the local engine's twin of one verl run (:func:`shared_settings`) into ``out``."""
    return [
        *(o for s in shared_settings(args) for o in s.local),
        f"trainer.default_local_dir={out}",
        "trainer.overwrite=true",
        f"trainer.save_freq={args.iters}",
        f"trainer.seed={seed}",
        "local.num_threads=1",
        "local.progress=false",
        "local.plot=false",
        *CONFIGS[name],
        *_credit(name, args),
        *args.extra,
    ]


def verl_overrides(name: str, seed: int, args: argparse.Namespace, run_dir: Path, data_dir: Path) -> list[str]:
    """The Hydra overrides of one verl run: ``platform=cpu``, the shared settings, then what only verl needs
    (task files, logging, no checkpoints, micro-batch sizes: speed only)."""
    return [
        "platform=cpu",
        *(o for s in shared_settings(args) for o in s.verl),
        *CONFIGS[name],
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        f"data.seed={seed}",  # the order of the training tasks (see learning.py's docstring, deviation 2)
        f"actor_rollout_ref.rollout.seed={seed}",  # the request seeds, as the local twin's (its trainer.seed)
        "trainer.val_before_train=true",
        "trainer.total_epochs=2",  # the train file holds tasks x iterations tasks: one epoch is the run
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        "trainer.project_name=gigpo_learning",
        f"trainer.experiment_name={run_dir.name}",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",  # credit records go to ckpt/credit/
        # rows per micro-batch: verl pads an iteration to a multiple of this (padding rows are forwarded too)
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro_batch}",
        *_credit(name, args),
        *args.extra,
    ]
