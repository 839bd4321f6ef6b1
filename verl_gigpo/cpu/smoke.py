"""Smoke-test verl's own pipeline end to end on this machine's CPU (``make e2e``).

    make e2e                                            # = python -m verl_gigpo.cpu.smoke
    python -m verl_gigpo.cpu.smoke --out runs/e2e --model artifacts/tiny-model-actions
    python -m verl_gigpo.cpu.smoke --ranks 2            # 2 FSDP ranks over gloo (slower)

Runs ``python -m verl_gigpo.main platform=cpu`` — the recipes' entry point, so verl's ``main_ppo`` ->
``TaskRunnerV1`` -> the ``gigpo_sync`` trainer mode -> FSDP actor and reference workers -> the ``gigpo_env_agent``
agent loop on the ``hf`` rollout backend -> TransferQueue — on gridnav with a tiny model, three times:

1. ``gigpo``: validation, training iterations 1-2, a checkpoint after each (as if stopped after iteration 2);
2. ``gigpo`` again in the same folder: resumes from ``global_step_2``, trains iteration 3, validates;
3. ``grpo`` (verl's estimator on the same step rows): validation, iterations 1-2.

Each run writes ``<out>/<run>/``: ``train.log`` (everything the run printed), ``metrics.jsonl`` (verl's file
logger: one JSON line per logged step), ``ckpt/`` (verl's checkpoints) and ``synced_weights/`` (the weights the
rollout server received at each sync, see :data:`verl_gigpo.cpu.hf_rollout.DUMP_WEIGHTS_ENV`). Then it prints one
line of metrics per iteration and checks, from those files: every run exited 0; every iteration logged finite
``actor/pg_loss`` and ``actor/grad_norm`` and the ``env/*``/``episode/*`` metrics (``gigpo/*`` for GiGPO);
validation before and after training; the resumed run started at step 3 and logged it once; after every sync the
rollout server held exactly the actor's checkpointed weights, and they had moved away from the initial model.
Exit status 1 if a check fails.

The tiny model is built when missing (``python -m verl_gigpo.local.tiny_model --envs gridnav --sft-actions``:
random weights, then taught the action format so rollouts are valid and varied). About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL",
    "RunResult",
    "check_runs",
    "ensure_model",
    "pipeline_overrides",
    "read_metrics",
    "run_pipeline",
    "run_smoke",
    "val_metric",
    "weight_sync_report",
]

#: the model ``make e2e`` builds when missing
DEFAULT_MODEL = "artifacts/tiny-model-actions"

#: metrics every training iteration must log (``gigpo/*`` in addition for GiGPO runs)
ITERATION_METRICS = ("env/success_rate", "episode/num_step_rows", "actor/pg_loss", "actor/grad_norm")


def val_metric(row: dict[str, Any]) -> str | None:
    """The key of verl's core validation metric in a logged row (``val-core/<data source>/acc/mean@1``: the agent
    loop reports ``acc`` = episode won), or None when the row holds no validation."""
    keys = sorted(k for k in row if k.startswith("val-core/") and k.endswith("/acc/mean@1"))
    return keys[0] if keys else None


#: what the three runs use besides the model and the data; small enough for ~1 minute of training per run
SMOKE_SETTINGS: tuple[str, ...] = (
    "algorithm.gigpo.key_mode=state",
    "env.name=gridnav",
    "env.max_steps=6",
    "env.history_length=2",
    "data.train_batch_size=4",
    "data.max_prompt_length=256",
    "data.max_response_length=3",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    # a KL loss makes verl build the reference worker, so the smoke test covers it
    "actor_rollout_ref.actor.use_kl_loss=true",
    "trainer.total_epochs=100",
    "trainer.test_freq=100",
    "trainer.logger=[console,file]",
    "trainer.project_name=verl_gigpo_smoke",
)


@dataclass
class RunResult:
    """One launch of the pipeline: its name, folder, exit status, seconds, verl's logged metrics, when it started
    (``time.time()``) and, when it was recorded, its start-up timeline (:mod:`verl_gigpo.cpu.timeline`)."""

    name: str
    run_dir: Path
    returncode: int
    seconds: float
    metrics: list[dict[str, Any]] = field(default_factory=list)
    started: float = 0.0
    timeline: Path | None = None

    @property
    def log(self) -> Path:
        """The run's console output."""
        return self.run_dir / "train.log"


def ensure_model(model_dir: str | Path) -> Path:
    """Build the gridnav tiny model with the action format at ``model_dir`` unless a model is already there."""
    model_dir = Path(model_dir)
    if (model_dir / "config.json").exists():
        return model_dir
    from verl_gigpo.local.tiny_model import build_tiny_model, sft_action_format

    print(f"building the tiny model in {model_dir} (random weights + 40 supervised steps on the action format)")
    build_tiny_model(model_dir, envs=("gridnav",))
    return sft_action_format(model_dir)


def pipeline_overrides(
    *,
    model_dir: Path,
    data_dir: Path,
    run_dir: Path,
    estimator: str,
    total_steps: int,
    ranks: int = 1,
    val_before_train: bool = True,
    save_freq: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The Hydra overrides of one smoke run of ``python -m verl_gigpo.main`` (``platform=cpu`` first)."""
    return [
        "platform=cpu",
        f"algorithm.adv_estimator={estimator}",
        *SMOKE_SETTINGS,
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        f"trainer.n_gpus_per_node={ranks}",
        f"trainer.total_training_steps={total_steps}",
        f"trainer.save_freq={save_freq}",
        f"trainer.val_before_train={str(val_before_train).lower()}",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        f"trainer.experiment_name={run_dir.name}",
        *extra,
    ]


def run_pipeline(
    name: str,
    run_dir: Path,
    overrides: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    timeline: bool = False,
) -> RunResult:
    """Launch ``python -m verl_gigpo.main OVERRIDES`` with its output in ``run_dir/train.log``.

    verl's file logger writes ``run_dir/metrics_<name>.jsonl`` (``VERL_FILE_LOGGER_PATH``, appended across launches
    in the same folder) and the rollout servers dump synced weights to ``run_dir/synced_weights``. With
    ``timeline``, every process of the launch records its start-up phases in ``run_dir/timeline_<name>.jsonl``
    (``GIGPO_TIMELINE``, :mod:`verl_gigpo.cpu.timeline`; emptied first).
    """
    from verl_gigpo.cpu.timeline import ENV as TIMELINE_ENV

    run_dir.mkdir(parents=True, exist_ok=True)
    timeline_path = run_dir / f"timeline_{name}.jsonl" if timeline else None
    if timeline_path is not None:
        timeline_path.write_text("")
    child_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VERL_FILE_LOGGER_PATH": str(run_dir / f"metrics_{name}.jsonl"),
        "GIGPO_HF_DUMP_WEIGHTS_DIR": str(run_dir / "synced_weights"),
        TIMELINE_ENV: str(timeline_path or ""),
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "verl_gigpo.main", *overrides]
    print(f"[{name}] python -m verl_gigpo.main ... (about 1-2 minutes; log: {run_dir / 'train.log'})", flush=True)
    started = time.time()
    start = time.perf_counter()
    with open(run_dir / "train.log", "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, timeout=timeout)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            log.write(f"\n[smoke] killed after {timeout:.0f} s\n")
            returncode = 124
    seconds = time.perf_counter() - start
    print(f"[{name}] exit {returncode} after {seconds:.0f} s", flush=True)
    metrics = read_metrics(run_dir / f"metrics_{name}.jsonl")
    return RunResult(name, run_dir, returncode, seconds, metrics, started=started, timeline=timeline_path)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """verl's ``FileLogger`` lines (``{"step": k, "data": {...}}``) as ``[{"step": k, **data}, ...]``."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            rows.append({"step": record["step"], **record["data"]})
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _actor_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Full actor weights of a verl FSDP checkpoint folder (``global_step_k``): FSDP2 shards every tensor along
    dim 0, so the ranks' local shards are concatenated in rank order (one rank holds the full tensors)."""
    import torch

    shards = sorted((ckpt / "actor").glob("model_world_size_*_rank_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    quiet = logging.getLogger("torch.distributed.device_mesh")  # warns about unpickling DTensors without a group
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        parts = [torch.load(s, map_location="cpu", weights_only=False) for s in shards]
    finally:
        quiet.setLevel(level)
    local = [{k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in part.items()} for part in parts]
    return {k: torch.cat([p[k] for p in local], dim=0) if local[0][k].dim() > 0 else local[0][k] for k in local[0]}


def weight_sync_report(run_dir: Path, model_dir: Path) -> list[dict[str, Any]]:
    """One entry per weight sync the rollout servers of ``run_dir`` received (``synced_weights/``), compared with
    what the actor held then: the initial model for the sync at step 0, else the actor's checkpoint of that step.

    Entry: ``file``, ``step``, ``reference`` (``initial`` / ``global_step_k`` / None when that step was not
    checkpointed), ``same_names``, ``max_abs_diff`` (server vs reference) and ``moved`` (max |diff| between the
    reference and the initial model: > 0 once the actor has been updated).
    """
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # the model's own state dict (tied weights such as lm_head appear under both names, as the actor sends them)
    initial = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}
    report = []
    dumps = (run_dir / "synced_weights").glob("sync*_step*_replica*.safetensors")
    for dump in sorted(dumps, key=lambda p: (p.stat().st_mtime, p.name)):  # in the order the syncs happened
        step = int(dump.stem.split("_step", 1)[1].split("_", 1)[0])
        ckpt = run_dir / "ckpt" / f"global_step_{step}"
        if step == 0:
            reference, name = initial, "initial"
        elif ckpt.is_dir():
            reference, name = _actor_checkpoint(ckpt), ckpt.name
        else:
            report.append({"file": dump.name, "step": step, "reference": None})
            continue
        server = load_file(dump)
        report.append(
            {
                "file": dump.name,
                "step": step,
                "reference": name,
                "same_names": set(server) == set(reference),
                "max_abs_diff": max(float((server[k].float() - reference[k].float()).abs().max()) for k in server),
                "moved": max(float((reference[k].float() - initial[k].float()).abs().max()) for k in initial),
            }
        )
    return report


def check_runs(runs: dict[str, RunResult], model_dir: Path) -> list[str]:
    """What is wrong with a smoke run (empty when everything holds; see the module docstring)."""
    problems = []
    for name, run in runs.items():
        if run.returncode != 0:
            problems.append(f"{name}: exit status {run.returncode} (see {run.log})")
            continue
        train_rows = [m for m in run.metrics if "actor/pg_loss" in m]
        needed = [*ITERATION_METRICS, *(["gigpo/step_group_size_mean"] if name.startswith("gigpo") else [])]
        for row in train_rows:
            missing = [k for k in needed if not _finite(row.get(k))]
            if missing:
                problems.append(f"{name}: iteration {row['step']} lacks finite {missing}")
        if not train_rows:
            problems.append(f"{name}: no training iteration was logged")
    first = runs.get("gigpo")
    resumed = runs.get("gigpo_resume")
    if first is not None and first.returncode == 0:
        if [m["step"] for m in first.metrics if "actor/pg_loss" in m] != [1, 2]:
            problems.append("gigpo: expected iterations 1 and 2")
        if not any(val_metric(m) and m["step"] == 0 for m in first.metrics):
            problems.append("gigpo: no validation before training (val-core/*/acc/mean@1 at step 0)")
    if resumed is not None and resumed.returncode == 0:
        steps = [m["step"] for m in resumed.metrics if "actor/pg_loss" in m]
        if steps != [3]:
            problems.append(f"gigpo_resume: expected exactly iteration 3 after resuming from step 2, got {steps}")
        if not any(val_metric(m) and m["step"] == 3 for m in resumed.metrics):
            problems.append("gigpo_resume: no final validation (val-core/*/acc/mean@1 at step 3)")
    if first is not None and first.returncode == 0:
        report = weight_sync_report(first.run_dir, model_dir)
        synced_steps = sorted({e["step"] for e in report})
        if not {0, 1, 2} <= set(synced_steps):
            problems.append(f"gigpo: the rollout server received weights at steps {synced_steps}, expected 0, 1, 2")
        for entry in report:
            if entry["reference"] is None:
                problems.append(f"gigpo: no actor checkpoint of step {entry['step']} to compare {entry['file']} with")
            elif not entry["same_names"] or entry["max_abs_diff"] != 0.0:
                problems.append(
                    f"gigpo: {entry['file']}: the rollout server's weights differ from the actor's "
                    f"({entry['reference']}; max |diff| {entry['max_abs_diff']:.3g})"
                )
            elif entry["step"] > 0 and not entry["moved"] > 0.0:
                problems.append(f"gigpo: the actor's weights at step {entry['step']} still equal the initial model's")
    return problems


def _iteration_line(name: str, row: dict[str, Any]) -> str:
    keys = (
        "env/success_rate",
        "episode/num_step_rows",
        "gigpo/step_group_size_mean",
        "gigpo/num_masked_rows",
        "actor/pg_loss",
        "actor/grad_norm",
        "timing_s/step",
        val_metric(row),
    )
    parts = [f"{k}={row[k]:.4g}" for k in keys if k and _finite(row.get(k))]
    return f"[{name}] step {row['step']}: " + " ".join(parts)


def run_smoke(
    out_dir: str | Path,
    model_dir: str | Path = DEFAULT_MODEL,
    *,
    ranks: int = 1,
    env_name: str = "gridnav",
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    estimators: Sequence[str] = ("gigpo", "grpo"),
    timeline: bool = False,
) -> dict[str, RunResult]:
    """Run the smoke runs (module docstring) under ``out_dir``; return them by name (``gigpo``, ``gigpo_resume``,
    ``grpo``). ``env_name`` is written into the task files (it must be registered in this process and, through
    ``extra`` such as ``+env.registry.NAME=module:Class``, in the workers); ``env`` adds environment variables;
    ``timeline`` records each launch's start-up phases (:func:`run_pipeline`)."""
    from verl_gigpo.data.prepare import write_task_files

    out_dir = Path(out_dir).resolve()
    model_dir = ensure_model(model_dir).resolve()
    data_dir = out_dir / "data"
    write_task_files(env_name, data_dir, train_size=64, val_size=8)
    runs: dict[str, RunResult] = {}
    common = {"model_dir": model_dir, "data_dir": data_dir, "ranks": ranks, "extra": extra}
    if "gigpo" in estimators:
        gigpo_dir = out_dir / "gigpo"
        runs["gigpo"] = run_pipeline(
            "gigpo",
            gigpo_dir,
            pipeline_overrides(run_dir=gigpo_dir, estimator="gigpo", total_steps=2, **common),
            env=env,
            timeline=timeline,
        )
        if runs["gigpo"].returncode == 0:
            overrides = pipeline_overrides(
                run_dir=gigpo_dir, estimator="gigpo", total_steps=3, val_before_train=False, **common
            )
            runs["gigpo_resume"] = run_pipeline("gigpo_resume", gigpo_dir, overrides, env=env, timeline=timeline)
    if "grpo" in estimators:
        grpo_dir = out_dir / "grpo"
        overrides = pipeline_overrides(run_dir=grpo_dir, estimator="grpo", total_steps=2, save_freq=-1, **common)
        runs["grpo"] = run_pipeline("grpo", grpo_dir, overrides, env=env, timeline=timeline)
    return runs


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Smoke-test verl's own pipeline with GiGPO on this CPU")
    parser.add_argument("--out", default="runs/e2e", help="output folder (default runs/e2e; emptied first)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"tiny model folder (built if missing: {DEFAULT_MODEL})")
    parser.add_argument("--ranks", type=int, default=1, help="FSDP ranks (gloo) of the actor/reference (default 1)")
    args = parser.parse_args(argv)
    if args.ranks < 1:
        parser.error(f"--ranks must be >= 1, got {args.ranks}")
    out = Path(args.out)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    start = time.perf_counter()
    runs = run_smoke(out, args.model, ranks=args.ranks)
    for name, run in runs.items():
        for row in run.metrics:
            print(_iteration_line(name, row))
    first = runs.get("gigpo")
    if first is not None and first.returncode == 0:
        for entry in weight_sync_report(first.run_dir, Path(args.model)):
            if entry["reference"] is not None:
                print(
                    f"[weight sync] {entry['file']}: rollout server vs actor ({entry['reference']}) max |diff| "
                    f"{entry['max_abs_diff']:.3g}; actor vs initial model {entry['moved']:.3g}"
                )
    problems = check_runs(runs, Path(args.model))
    print(f"smoke test of verl's pipeline on CPU: {time.perf_counter() - start:.0f} s in all")
    if problems:
        print("FAILED:\n  - " + "\n  - ".join(problems))
        return 1
    print("OK: validation, GiGPO and GRPO training, weight sync, checkpoint and resume all ran through verl's main_ppo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
