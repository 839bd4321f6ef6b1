"""Learning benchmark: GiGPO vs GRPO vs RLOO (and a sweep of GiGPO's step weight w and norm) on gridnav.

    python benchmarks/learning.py                          # the full benchmark (see --help; ~60-90 min on 2 cores)
    python benchmarks/learning.py --seeds 2 --iters 20     # a quick look
    python benchmarks/learning.py --report-only            # rebuild the table and plot from finished runs
    python benchmarks/learning.py --suite successors --jobs 1    # GiGPO, HGPO, GraphGPO, G2PO and GRPO
    python benchmarks/learning.py --engine verl --configs gigpo,grpo --seeds 3   # through verl's main_ppo (CPU)

Every configuration trains the same tiny model (built once, ``--model``) on the same task with the same seeds,
the same rollout budget (tasks x group size per iteration) and the same optimiser settings; only the advantage
estimator differs. Each run is ``python -m verl_gigpo.local.train`` in its own process with one torch thread;
``--jobs`` of them run side by side (more total throughput than one run on two threads).

The task (``TASK``): 5x5 gridnav with a key (``observe=target``: the observation gives the offset to the key
until it is held, then to the goal), where the goal is a locked door until the agent has stepped on the key:
longer horizons than the demo (shortest solutions of 5+ steps, 15-step limit), a sub-goal whose pay-off comes
later, and many states revisited across a group — where step-level credit should matter. About 1-2% of random
episodes succeed, so the reward is sparse.

Outputs: ``benchmarks/learning.png`` (validation success, mean and spread over seeds, per configuration) and the
section "## Learning: GiGPO vs GRPO" of ``benchmarks/RESULTS.md`` (replaced in place; other sections are kept),
with the exact command. Runs go to ``--runs`` (default ``runs/learning``), one folder per (config, seed).
``--suite successors`` runs GiGPO, its successors HGPO, GraphGPO and G2PO (``docs/estimators.md``, default options;
HGPO keys up to the last 3 states, K = 2, as the paper, although the prompt shows no history) and GRPO on the same
task, seeds and budget, with credit records every ``--credit-freq`` iterations, into ``runs/learning-successors``,
``benchmarks/learning_successors.png`` and the section "## Learning: GiGPO and its successors" (a table per seed
too).

``--engine verl``: GiGPO vs GRPO through verl's own pipeline on this CPU — one ``python -m verl_gigpo.main
platform=cpu`` launch per (configuration, seed), run one after another (verl already uses several processes),
reading verl's own logged metrics (its file logger: ``ckpt/metrics.jsonl`` in the experiment folder). Beside them
("twins", one torch thread, alongside the verl launches; ``--no-twin`` skips them) the local engine trains the same
configurations with the same settings, so the two engines' curves share a plot. Both engines start from the model
that already answers in gridnav's action format (``--model``, default ``artifacts/tiny-model-actions``, built when
missing with ``python -m verl_gigpo.local.tiny_model --out artifacts/tiny-model-actions --envs gridnav
--sft-actions``), both sample over the full vocabulary (the twins run with ``local.constrain_to_actions=false``),
and every setting the engines share is set on both from one table (:func:`shared_settings`, printed into
RESULTS.md). Outputs: ``benchmarks/learning_verl.png`` and the section "## Learning through verl's pipeline: GiGPO
vs GRPO"; runs under ``--runs`` (default ``runs/learning-verl``): ``verl/<config>_s<seed>/`` (``train.log``,
``launch.json``, ``ckpt/metrics.jsonl``, ``ckpt/credit/``) and ``local/<config>_s<seed>/``.

Its defaults fit a 2-core CPU: a verl iteration of the key task at 8 tasks x 8 episodes (~950 step rows) takes
~50 s there, so 150 iterations would be ~2 h per run. The defaults are ``make demo``'s task (``--task goal``: no
key, 10 steps, ~8% random success), 4 tasks x 8 episodes, 50 iterations and 4 optimizer steps per iteration
(``--opt-steps``: the same update compute as one step, more learning per rollout); ``--task key --tasks 8
--opt-steps 1 --iters 150`` is the local benchmark's budget. Deviations of the verl runs:

1. Task seeds: verl plays the training tasks 0 .. tasks x iterations - 1 of the train split in the order of its
   dataloader (``data.seed`` = the run's seed), each once; the local engine draws fresh task seeds every iteration.
2. The rollout server's sampling generator is seeded 0 in every verl run (the ``hf`` backend takes no seed);
   runs differ through the task order (``data.seed``).
3. Mini-batches: the local engine takes ``tasks / opt_steps`` whole tasks per optimizer step; verl's
   ``gigpo_sync`` mode at most ``ceil(tasks x group x max_steps / opt_steps)`` step rows, shuffled across tasks,
   so an iteration with shorter episodes can take fewer steps (``update/num_mini_batches`` logs them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from results_md import write_section  # benchmarks/ is on sys.path when this runs as a script

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Learning: GiGPO vs GRPO"
SECTION_VERL = "## Learning through verl's pipeline: GiGPO vs GRPO"
SECTION_SUCCESSORS = "## Learning: GiGPO and its successors"
ENGINES = ("local", "verl")

#: The benchmark task (env overrides shared by every configuration).
TASK: tuple[str, ...] = (
    "env.name=gridnav",
    "env.kwargs.key=true",
    "env.kwargs.observe=target",
    "env.kwargs.size=5",
    "env.kwargs.walls=[2,4]",
    "env.kwargs.min_path=5",
    "env.max_steps=15",
)

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
    f"python -m verl_gigpo.local.tiny_model --out {ACTION_MODEL} --envs gridnav --sft-actions"  # 40 SFT steps
)
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


# ---------------------------------------------------------------------------------------------- runs
def _run_local(out: Path, overrides: list[str], label: str) -> None:
    """``python -m verl_gigpo.local.train OVERRIDES`` in a subprocess with one torch thread."""
    cmd = [sys.executable, "-m", "verl_gigpo.local.train", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{done.stderr[-4000:]}")
    print(f"  {label}: {time.perf_counter() - start:.0f} s", flush=True)


def run_one(name: str, seed: int, args: argparse.Namespace) -> Path:
    """Train one (configuration, seed) on the local engine (the local benchmark); returns its run directory
    (skipped when finished)."""
    out = Path(args.runs) / f"{name}_s{seed}"
    metrics = out / "metrics.jsonl"
    if metrics.exists() and _done(metrics, args.iters):
        return out
    overrides = [
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
    _run_local(out, overrides, f"{name} seed {seed}")
    return out


def run_twin(name: str, seed: int, args: argparse.Namespace) -> Path:
    """The local engine's run of one (configuration, seed) with the side-by-side settings (:func:`shared_settings`)."""
    out = Path(args.runs) / "local" / f"{name}_s{seed}"
    metrics = out / "metrics.jsonl"
    if metrics.exists() and _done(metrics, args.iters):
        return out
    overrides = [
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
    _run_local(out, overrides, f"local {name} seed {seed}")
    return out


def verl_overrides(name: str, seed: int, args: argparse.Namespace, run_dir: Path, data_dir: Path) -> list[str]:
    """The Hydra overrides of one verl run: ``platform=cpu``, the shared settings, then what only verl needs
    (task files, logging, no checkpoints, micro-batch sizes: speed only)."""
    return [
        "platform=cpu",
        *(o for s in shared_settings(args) for o in s.verl),
        *CONFIGS[name],
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        f"data.seed={seed}",  # the order of the training tasks (see the module docstring, deviation 2)
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


def run_verl(name: str, seed: int, args: argparse.Namespace, data_dir: Path) -> Path:
    """Train one (configuration, seed) through ``python -m verl_gigpo.main platform=cpu``; returns its run
    directory (skipped when finished; an unfinished one starts over: verl's file logger appends)."""
    out = Path(args.runs).resolve() / "verl" / f"{name}_s{seed}"
    if _verl_done(out, args.iters):
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "verl_gigpo.main", *verl_overrides(name, seed, args, out, data_dir)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "GIGPO_HF_DUMP_WEIGHTS_DIR": "",  # no copies of the synced weights (the smoke test's check)
    }
    print(f"  verl {name} seed {seed}: started (log: {out / 'train.log'})", flush=True)
    start = time.perf_counter()
    with open(out / "train.log", "w") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            code = subprocess.run(
                cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.verl_timeout
            )
            returncode = code.returncode
        except subprocess.TimeoutExpired:
            returncode = 124
    seconds = time.perf_counter() - start
    (out / "launch.json").write_text(json.dumps({"wall_s": seconds, "returncode": returncode}) + "\n")
    if returncode != 0 or not _verl_done(out, args.iters):
        raise RuntimeError(f"verl {name} seed {seed} failed (exit {returncode}); see {out / 'train.log'}")
    print(f"  verl {name} seed {seed}: {seconds:.0f} s", flush=True)
    return out


def _done(metrics: Path, iters: int) -> bool:
    lines = metrics.read_text().splitlines()
    return bool(lines) and json.loads(lines[-1]).get("training_step") == float(iters)


def _verl_done(run_dir: Path, iters: int) -> bool:
    rows = read_run(run_dir, "verl")
    return any(r["training_step"] == iters and "val/success_rate" in r for r in rows)


def read_run(run_dir: Path, engine: str) -> list[dict[str, Any]]:
    """A run's metric lines in the local engine's form (``training_step``, ``env/success_rate``,
    ``val/success_rate``, ``timing_s/iteration`` = the iteration with its validation, plus every logged key).

    verl's lines (its file logger) keep their own keys; its core validation metric (``val-core/<source>/acc/mean@1``,
    the share of won episodes) becomes ``val/success_rate``.
    """
    if engine == "local":
        path = run_dir / "metrics.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    from verl_gigpo.cpu.smoke import val_metric
    from verl_gigpo.metrics_file import format_steps, iteration_gaps, read_metrics

    raws = read_metrics(run_dir / VERL_METRICS)
    missing, repeated = iteration_gaps(raws)
    if missing or repeated:
        print(
            f"  {run_dir}: iterations missing from its metrics: {format_steps(missing) or 'none'}; logged twice: "
            f"{format_steps(repeated) or 'none'}",
            flush=True,
        )
    rows = []
    for raw in raws:
        row = {**raw, "training_step": float(raw["step"])}
        key = val_metric(raw)
        if key is not None:
            row["val/success_rate"] = raw[key]
        if "timing_s/step" in raw:
            row["timing_s/iteration"] = raw["timing_s/step"] + raw.get("timing_s/testing", 0.0)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- report
def load_curves(
    runs: Path, names: list[str], seeds: list[int], *, engine: str = "local", label: str = "{name}"
) -> dict[str, dict[str, Any]]:
    """Per configuration (keyed ``label.format(name=...)``): ``steps`` (V,), ``val`` (S, V) validation success,
    ``train`` (S, T) train success, ``seconds`` (S,) summed iteration time, ``seeds`` and ``rows`` (the runs'
    metric lines)."""
    out = {}
    for name in names:
        vals, trains, secs, steps, found, lines_per_seed = [], [], [], None, [], []
        for seed in seeds:
            lines = read_run(runs / f"{name}_s{seed}", engine)
            val = [m for m in lines if "val/success_rate" in m]
            if not val:
                continue
            steps = np.array([m["training_step"] for m in val])
            vals.append([m["val/success_rate"] for m in val])
            trains.append([m["env/success_rate"] for m in lines if "env/success_rate" in m])
            secs.append(sum(m.get("timing_s/iteration", 0.0) for m in lines))
            found.append(seed)
            lines_per_seed.append(lines)
        if vals:
            width = min(len(v) for v in vals)
            out[label.format(name=name)] = {
                "steps": steps[:width],
                "val": np.array([v[:width] for v in vals]),
                "train": np.array([t[: min(len(t) for t in trains)] for t in trains]),
                "seconds": np.array(secs),
                "seeds": found,
                "rows": lines_per_seed,
            }
    return out


def first_reach(steps: np.ndarray, curve: np.ndarray, threshold: float) -> float:
    """First validation step whose success is >= threshold (nan when never)."""
    hit = np.flatnonzero(curve >= threshold)
    return float(steps[hit[0]]) if hit.size else float("nan")


def train_window(iters: int) -> int:
    """Iterations averaged for 'train success at the end': 20, fewer for short runs."""
    return max(1, min(20, iters // 4))


def summarise(curves: dict, threshold: float, window: int = 20) -> list[dict]:
    """One row per configuration: final / best / mean-over-curve validation success and iterations to threshold."""
    rows = []
    for name, c in curves.items():
        val = c["val"]  # (S, V)
        reach = np.array([first_reach(c["steps"], v, threshold) for v in val])
        rows.append(
            {
                "name": name,
                "seeds": val.shape[0],
                "start": (val[:, 0].mean(), val[:, 0].std()),
                "final": (val[:, -1].mean(), val[:, -1].std()),
                "final_per_seed": val[:, -1].tolist(),
                "auc": (val[:, 1:].mean(axis=1).mean(), val[:, 1:].mean(axis=1).std()),
                "train_last": (
                    c["train"][:, -window:].mean(axis=1).mean(),
                    c["train"][:, -window:].mean(axis=1).std(),
                ),
                "reached": int(np.isfinite(reach).sum()),
                "reach_median": float(np.nanmedian(reach)) if np.isfinite(reach).any() else float("nan"),
                "seconds": c["seconds"].mean(),
            }
        )
    return rows


def plot(curves: dict, path: Path, threshold: float, title: str) -> None:
    """Validation success (mean line, min-max band over seeds) and smoothed train success per configuration.

    Labels ``engine/config`` (the side-by-side runs): one colour per configuration, solid for verl, dashed for
    the local engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours: dict[str, str] = {}
    window = 1
    for name, c in curves.items():
        engine, _, config = name.rpartition("/")
        style = {"color": colours[config]} if config in colours else {}
        ls = "--" if engine == "local" else "-"
        mean = c["val"].mean(axis=0)
        (line,) = ax1.plot(c["steps"], mean, "o", ls=ls, ms=3, label=f"{name} (n={c['val'].shape[0]})", **style)
        colours.setdefault(config, line.get_color())
        ax1.fill_between(c["steps"], c["val"].min(axis=0), c["val"].max(axis=0), color=line.get_color(), alpha=0.12)
        train = c["train"].mean(axis=0)
        window = max(1, len(train) // 15)
        smooth = np.convolve(train, np.ones(window) / window, mode="valid")
        ax2.plot(np.arange(window, len(train) + 1), smooth, color=line.get_color(), ls=ls, label=name)
    ax1.axhline(threshold, color="grey", lw=0.8, ls=":")
    ax1.set(xlabel="iteration", ylabel="validation success (sampled)", title=title, ylim=(-0.02, 1.02))
    ax2.set(xlabel="iteration", ylabel=f"train success ({window}-iteration mean)", ylim=(-0.02, 1.02))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pm(x: tuple[float, float]) -> str:
    return f"{x[0]:.2f} ± {x[1]:.2f}"


def _result_rows(rows: list[dict], threshold: float, window: int, *, engine_column: bool) -> list[str]:
    """The results table (one row per configuration)."""
    head = "| engine | config " if engine_column else "| config "
    lines = [
        f"{head}| seeds | val success at start | final val success | mean val success over training | "
        f"train success, last {window} it. | seeds reaching {threshold:.2f} | median it. to {threshold:.2f} | "
        "s per run |",
        "|---|" + "---|" * (8 + engine_column),
    ]
    for r in rows:
        reach = "-" if np.isnan(r["reach_median"]) else f"{r['reach_median']:.0f}"
        engine, _, config = r["name"].rpartition("/")
        first = f"| {engine} | {config} " if engine_column else f"| {r['name']} "
        lines.append(
            f"{first}| {r['seeds']} | {_pm(r['start'])} | {_pm(r['final'])} | {_pm(r['auc'])} | "
            f"{_pm(r['train_last'])} | {r['reached']}/{r['seeds']} | {reach} | {r['seconds']:.0f} |"
        )
    return lines


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall: float | None, load: str) -> str:
    """The RESULTS.md section of the local benchmark (with ``--suite successors``: and a table per seed)."""
    lines = [
        SUITES[args.suite]["section"],
        "",
        f"Command: {command}",
        "",
        f"Task: gridnav with a key ({' '.join(o for o in TASK if o.startswith('env.'))}); tiny model "
        f"`{args.model}`; {args.iters} iterations x ({args.tasks} tasks x {args.group} episodes); validation on "
        f"{args.val_size} fixed test-split tasks every {args.test_freq} iterations (sampled, temperature 1); seeds "
        f"{', '.join(str(s) for s in range(args.seeds))}. Mean ± std over seeds (population std, ddof 0); "
        f"'reaching' = some validation point at or above the threshold.",
        "",
        *_result_rows(rows, args.threshold, train_window(args.iters), engine_column=False),
    ]
    if args.suite == "successors":
        lines += ["", *per_seed_rows(rows, args.seeds)]
    lines += ["", f"![learning curves]({SUITES[args.suite]['png']})", ""]
    if wall is not None:
        lines.append(f"Wall time of the whole benchmark: {wall / 60:.0f} min ({args.jobs} runs in parallel). {load}")
        lines.append("")
    return "\n".join(lines)


def per_seed_rows(rows: list[dict], seeds: int) -> list[str]:
    """Markdown: final validation success of every configuration per seed (the same seeds for all)."""
    lines = [
        "Final validation success per seed:",
        "",
        "| config | " + " | ".join(f"seed {s}" for s in range(seeds)) + " |",
    ]
    lines.append("|---|" + "---|" * seeds)
    for r in rows:
        lines.append(f"| {r['name']} | " + " | ".join(f"{v:.2f}" for v in r["final_per_seed"]) + " |")
    return lines


#: (label, local engine key, verl key) of the seconds per training iteration; None = the engine has no such phase
PHASES: tuple[tuple[str, str | None, str | None], ...] = (
    ("rollout: generation + environments", "timing_s/rollout", "timing_s/gen"),
    ("old log-probs (local: in the update's forward)", None, "timing_s/old_log_prob"),
    ("reference log-probs (KL off)", None, "timing_s/ref"),
    ("advantages", "timing_s/adv", "timing_s/adv"),
    ("actor update", "timing_s/update", "timing_s/update_actor"),
    ("weight sync to the rollout server", None, "timing_s/update_weights"),
)


def _iteration_seconds(row: dict[str, Any], engine: str) -> float:
    """A training iteration's seconds without its validation."""
    if engine == "verl":
        return row["timing_s/step"]
    return row["timing_s/iteration"] - row.get("timing_s/val", 0.0)


def phase_table(curves: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: mean seconds per training iteration and phase, per engine (over every run and iteration)."""
    engines = sorted({name.rpartition("/")[0] for name in curves}, key=ENGINES.index)
    rows = {
        e: [m for n, c in curves.items() if n.rpartition("/")[0] == e for r in c["rows"] for m in r] for e in engines
    }
    train = {e: [m for m in rows[e] if "env/success_rate" in m and "timing_s/iteration" in m] for e in engines}
    lines = [
        "| phase | " + " | ".join(f"{e} (s per iteration)" for e in engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    accounted = {e: np.zeros(len(train[e])) for e in engines}
    for label, *keys in PHASES:
        cells = []
        for e in engines:
            key = keys[ENGINES.index(e)]
            if key is None:
                cells.append("–")
                continue
            values = np.array([m.get(key, 0.0) for m in train[e]])
            accounted[e] += values
            cells.append(f"{values.mean():.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = {e: np.array([_iteration_seconds(m, e) for m in train[e]]) for e in engines}
    rest = " | ".join(f"{(totals[e] - accounted[e]).mean():.2f}" for e in engines)
    lines.append(f"| rest (verl: Ray calls, TransferQueue, batch balancing, padding) | {rest} |")
    lines.append("| **training iteration** | " + " | ".join(f"**{totals[e].mean():.2f}**" for e in engines) + " |")
    val = []
    for e in engines:
        key = "timing_s/testing" if e == "verl" else "timing_s/val"
        values = [m[key] for m in rows[e] if key in m]
        val.append(f"{np.mean(values):.2f}" if values else "–")
    lines.append("| one validation (not in the iteration) | " + " | ".join(val) + " |")
    return lines


def diagnostics_table(curves: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """Markdown: what each engine's update saw, per engine and configuration (means over runs and iterations)."""
    lines = [
        "| engine | config | step rows per iteration | optimizer steps per iteration | max rollout-vs-actor gap | "
        "entropy: first → last iteration | PPO clip fraction | grad norm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in curves.items():
        engine, _, config = name.rpartition("/")
        train = [[m for m in r if "env/success_rate" in m] for r in c["rows"]]
        flat = [m for t in train for m in t]
        if engine == "verl":
            rows_key, gap_key, gap_unit = "update/rows", "training/rollout_probs_diff_max", "in p"
            steps = f"{np.mean([m.get('update/num_mini_batches', np.nan) for m in flat]):.2f}"
        else:
            rows_key, gap_key, gap_unit = "rollout/rows", "rollout/logprob_diff_max", "in log p"
            steps = f"{args.opt_steps} ({args.tasks // args.opt_steps} task(s) each)"
        gap = max((m.get(gap_key, 0.0) for m in flat), default=float("nan"))
        # the local engine compares rollout and actor log-probs only when it updates in one optimizer step
        gap_text = f"{gap:.1e} {gap_unit}" if engine == "verl" or args.opt_steps == 1 else "– (1 step only)"
        first = np.mean([t[0].get("actor/entropy", np.nan) for t in train if t])
        last = np.mean([t[-1].get("actor/entropy", np.nan) for t in train if t])
        lines.append(
            f"| {engine} | {config} | {np.mean([m.get(rows_key, np.nan) for m in flat]):.0f} | {steps} | "
            f"{gap_text} | {first:.3f} → {last:.3f} | "
            f"{np.mean([m.get('actor/pg_clipfrac', np.nan) for m in flat]):.4f} | "
            f"{np.mean([m.get('actor/grad_norm', np.nan) for m in flat]):.3f} |"
        )
    return lines


def launch_seconds(runs: Path, names: list[str], seeds: list[int]) -> list[float]:
    """Per verl launch: wall seconds minus the seconds inside its iterations and validations (start-up, shutdown)."""
    out = []
    for name in names:
        for seed in seeds:
            run_dir = runs / "verl" / f"{name}_s{seed}"
            launch = run_dir / "launch.json"
            if launch.exists():
                inside = sum(
                    m.get("timing_s/step", 0.0) + m.get("timing_s/testing", 0.0) for m in read_run(run_dir, "verl")
                )
                out.append(json.loads(launch.read_text())["wall_s"] - inside)
    return out


def markdown_verl(curves: dict, args: argparse.Namespace, command: str, wall: float | None, load: str, png: str) -> str:
    """The RESULTS.md section of the side-by-side benchmark (``--engine verl``)."""
    rows = summarise(curves, args.threshold, train_window(args.iters))
    settings = shared_settings(args)
    lines = [
        SECTION_VERL,
        "",
        f"Command: {command}",
        "",
        f"Model: `{args.model}` (`{ACTION_MODEL_COMMAND}`: the random tiny model taught to answer a gridnav prompt "
        "with a uniformly random action word + EOS; both engines start from it and sample over its whole vocabulary). "
        f"Task: {TASK_TITLES[args.task]} ({' '.join(TASKS[args.task])}); {args.iters} iterations x "
        f"({args.tasks} tasks x {args.group} episodes); validation on {args.val_size} fixed test-split tasks every "
        f"{args.test_freq} iterations (sampled, temperature 1); seeds {', '.join(str(s) for s in range(args.seeds))}. "
        "verl: `python -m verl_gigpo.main platform=cpu` per (configuration, seed), one FSDP rank, the `hf` rollout "
        "backend, verl's own metrics (file logger); local: `python -m verl_gigpo.local.train`, one torch thread. "
        "Mean ± std over seeds (population std); 'reaching' = some validation point at or above the threshold.",
        "",
        "Settings both engines share (one table in `benchmarks/learning.py`, `shared_settings`):",
        "",
        "| setting | local engine | verl (`python -m verl_gigpo.main platform=cpu ...`) |",
        "|---|---|---|",
    ]
    for s in settings:
        local = "<br>".join(f"`{o}`" for o in s.local) or "–"
        verl = "<br>".join(f"`{o}`" for o in s.verl) or "(always the full vocabulary)"
        lines.append(f"| {s.what} | {local} | {verl} |")
    lines += [
        "| seed | `trainer.seed=S` | `data.seed=S` (order of the training tasks) |",
        "| training tasks | fresh seeds of the train split every iteration | train-split tasks 0 .. "
        f"{args.tasks * args.iters - 1} (`train.parquet`), each once, shuffled |",
        "",
        "Only on verl (plumbing and speed): `trainer.val_before_train=true trainer.save_freq=-1 "
        "trainer.resume_mode=disable trainer.logger=[console,file]`, micro-batches of "
        f"{args.micro_batch} rows (`ppo_micro_batch_size_per_gpu`, `log_prob_micro_batch_size_per_gpu`); "
        f"GiGPO runs on both engines write credit records every {args.credit_freq} iterations "
        "(`trainer.credit_log_freq`).",
        "",
        *_result_rows(rows, args.threshold, train_window(args.iters), engine_column=True),
        "",
        "Final validation success per seed:",
        "",
    ]
    for r in rows:
        engine, _, config = r["name"].rpartition("/")
        seeds = curves[r["name"]]["seeds"]
        per_seed = ", ".join(f"s{s} {v:.2f}" for s, v in zip(seeds, r["final_per_seed"], strict=True))
        lines.append(f"- {engine} {config}: {per_seed}")
    lines += [
        "",
        f"![learning curves, verl (solid) and the local engine (dashed)]({png})",
        "",
        "Seconds per training iteration by phase (means over every run and iteration):",
        "",
        *phase_table(curves),
        "",
    ]
    startup = launch_seconds(Path(args.runs), sorted({n.rpartition("/")[2] for n in curves}), list(range(args.seeds)))
    if startup:
        lines += [
            f"Per verl launch, outside iterations and validations (process and Ray start-up, model loading, "
            f"shutdown): {np.mean(startup):.0f} s (min {min(startup):.0f}, max {max(startup):.0f}).",
            "",
        ]
    lines += [
        "What the updates saw (gap: verl logs the largest |p_rollout − p_actor| of a token, "
        "`training/rollout_probs_diff_max`; the local engine the largest |log p| difference, "
        "`rollout/logprob_diff_max`, when it updates in one step; entropy: verl's `actor/entropy` is the policy's "
        "before each update, the local engine's the mean over the update's passes):",
        "",
        *diagnostics_table(curves, args),
        "",
    ]
    if wall is not None:
        lines.append(f"Wall time of the whole benchmark: {wall / 60:.0f} min. {load}")
        lines.append("")
    return "\n".join(lines)


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
    "verl": {
        "task": "goal",
        "opt_steps": 4,
        "micro_batch": 16,
        "seeds": 3,
        "iters": 50,
        "test_freq": 10,
        "tasks": 4,
        "group": 8,
        "model": ACTION_MODEL,
        "runs": "runs/learning-verl",
        "configs": "gigpo,grpo",
    },
}


def _machine_load() -> tuple[float, float, float]:
    return os.getloadavg()


def _load_line(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    return (
        f"Machine load average (1/5/15 min) before: {', '.join(f'{x:.1f}' for x in before)}; "
        f"after: {', '.join(f'{x:.1f}' for x in after)} (2 cores, shared with other work)."
    )


def _run_side_by_side(names: list[str], seeds: list[int], args: argparse.Namespace) -> None:
    """verl runs one after another; the local twins alongside them, one at a time (one torch thread)."""
    from verl_gigpo.data.prepare import write_task_files

    data_dir = Path(args.runs).resolve() / "data"
    from omegaconf import OmegaConf

    task = OmegaConf.from_dotlist(list(TASKS[args.task]))  # parsed as the local engine parses it
    env_kwargs = OmegaConf.to_container(task.env.kwargs, resolve=True)
    write_task_files(
        task.env.name,
        data_dir,
        train_size=args.tasks * args.iters,
        val_size=args.val_size,
        env_kwargs=env_kwargs,
    )
    jobs = [(name, seed) for seed in seeds for name in names]
    print(
        f"{len(jobs)} verl runs one at a time" + ("" if args.no_twin else f", {len(jobs)} local twins beside"),
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        twins = None if args.no_twin else pool.submit(lambda: [run_twin(n, s, args) for n, s in jobs])
        verl = pool.submit(lambda: [run_verl(n, s, args, data_dir) for n, s in jobs])
        verl.result()
        if twins is not None:
            twins.result()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="local",
        help="local (default): the local engine only; verl: verl's main_ppo with local twins beside",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (local 5, verl 3)")
    parser.add_argument("--iters", type=int, default=None, help="iterations per run (local 150, verl 50)")
    parser.add_argument("--test-freq", type=int, default=None, help="validate every N iterations (local 15, verl 10)")
    parser.add_argument("--task", choices=TASKS, default=None, help="verl: the task (key, goal; default goal)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per iteration (local 8, verl 4)")
    parser.add_argument("--group", type=int, default=None, help="episodes per task (8)")
    parser.add_argument("--opt-steps", type=int, default=None, help="verl: optimizer steps per iteration (4)")
    parser.add_argument("--val-size", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=2, help="local engine: runs in parallel (one torch thread each)")
    parser.add_argument("--threshold", type=float, default=0.5, help="success level for 'iterations to reach'")
    parser.add_argument("--configs", default=None, help=f"subset of {','.join(CONFIGS)} (verl default: gigpo,grpo)")
    parser.add_argument(
        "--suite",
        choices=SUITES,
        default="estimators",
        help="local engine: estimators (GiGPO's sweep, GRPO, RLOO; the default) or successors (GiGPO, HGPO, GraphGPO, "
        "G2PO, GRPO): default configs, RESULTS.md section, plot and run folder",
    )
    parser.add_argument(
        "--model", default=None, help="built when missing (local: tiny_model; verl: with --sft-actions)"
    )
    parser.add_argument("--runs", default=None, help="run folders (runs/learning, runs/learning-verl)")
    parser.add_argument("--no-twin", action="store_true", help="verl: skip the local engine's runs beside")
    parser.add_argument("--micro-batch", type=int, default=None, help="verl: rows per micro-batch (16; speed only)")
    parser.add_argument(
        "--credit-freq",
        type=int,
        default=None,
        help="credit records every N iterations of the step-credit runs (verl: both engines; local: --suite "
        "successors; default: iterations / 5; 0 = off)",
    )
    parser.add_argument("--verl-timeout", type=float, default=3600, help="verl: seconds one launch may take")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the table and plot")
    parser.add_argument("--no-results", action="store_true", help="print only: write neither RESULTS.md nor the PNG")
    parser.add_argument(
        "--results",
        default=str(REPO / "benchmarks" / "RESULTS.md"),
        help="the RESULTS.md to write the section into (the PNG goes next to it)",
    )
    parser.add_argument("extra", nargs="*", help="extra overrides for every run (key=value; verl: both engines)")
    args = parser.parse_args(argv)
    defaults = dict(ENGINE_DEFAULTS[args.engine])
    if args.engine == "local":
        defaults.update(configs=SUITES[args.suite]["configs"], runs=SUITES[args.suite]["runs"])
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.credit_freq is None:
        args.credit_freq = max(1, args.iters // 5)
    names = [n for n in args.configs.split(",") if n]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; known: {list(CONFIGS)}")
    if args.engine == "local" and (args.task != "key" or args.opt_steps != 1):
        parser.error("--task and --opt-steps apply to --engine verl (the local benchmark is fixed: key task, 1 step)")
    for key in ("seeds", "iters", "test_freq", "tasks", "group", "val_size", "micro_batch", "opt_steps"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.tasks % args.opt_steps:
        parser.error(f"--tasks ({args.tasks}) must be a multiple of --opt-steps ({args.opt_steps})")
    seeds = list(range(args.seeds))
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report-only"]
    command = "`" + " ".join(["python benchmarks/learning.py", *given]) + "`"
    if args.report_only:
        command += " (tables rebuilt from the finished runs with `--report-only`)"
    wall = None
    load = ""
    if not args.report_only:
        sys.path.insert(0, str(REPO))
        start = time.perf_counter()
        load_before = _machine_load()
        if args.engine == "verl":
            from verl_gigpo.cpu.smoke import ensure_model

            ensure_model(args.model)  # the action-format model (ACTION_MODEL_COMMAND) when missing
            _run_side_by_side(names, seeds, args)
        else:
            if not (Path(args.model) / "config.json").exists():
                from verl_gigpo.local.tiny_model import build_tiny_model

                build_tiny_model(args.model)
            jobs = [(name, seed) for seed in seeds for name in names]
            print(f"{len(jobs)} runs, {args.jobs} at a time", flush=True)
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                list(pool.map(lambda job: run_one(job[0], job[1], args), jobs))
        wall = time.perf_counter() - start
        load = _load_line(load_before, _machine_load())
    results = Path(args.results)
    if args.engine == "verl":
        runs = Path(args.runs)
        curves = load_curves(runs / "verl", names, seeds, engine="verl", label="verl/{name}")
        curves.update(load_curves(runs / "local", names, seeds, label="local/{name}"))
        section, png = SECTION_VERL, results.parent / "learning_verl.png"
        text = markdown_verl(curves, args, command, wall, load, png.name) if curves else ""
        title = f"{TASK_TITLES[args.task]}: verl (solid) vs local engine (dashed)"
    else:
        curves = load_curves(Path(args.runs), names, seeds)
        section, png = SUITES[args.suite]["section"], results.parent / SUITES[args.suite]["png"]
        text = (
            markdown(summarise(curves, args.threshold, train_window(args.iters)), args, command, wall, load)
            if curves
            else ""
        )
        title = "gridnav with a key: validation success" + (
            " (GiGPO and its successors)" if args.suite == "successors" else ""
        )
    if not curves:
        print("no finished runs found", file=sys.stderr)
        return 1
    print(text)
    if not args.no_results:
        results.parent.mkdir(parents=True, exist_ok=True)
        plot(curves, png, args.threshold, title)
        write_section(text, section, results)
        print(f"written: {results} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
