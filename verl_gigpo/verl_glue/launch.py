"""What ``python -m verl_gigpo.main`` does with the experiment folder (``trainer.default_local_dir``) before Ray.

:func:`prepare_launch`, on the driver: 1. renames partial checkpoints (``global_step_K`` above verl's pointer) to
``global_step_K.partial``; 2. says whether and from where the launch resumes; 3. stops when a key that may not change
on resume (:data:`verl_gigpo.config.resume.VERL_RESUME`) differs from the checkpointed run's launch record
(``launches/launch_NNN.json``), unless ``trainer.allow_config_change=true``; 4. keeps the metrics file
(:mod:`verl_gigpo.verl_glue.metrics_file`). docs/runs.md ("Checkpoints and partial checkpoints", "Resuming").
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_gigpo.config.resume import POINTER, VERL_RESUME, ResumeRefused, describe
from verl_gigpo.rollout.summary import launch_summary
from verl_gigpo.verl_glue.metrics_file import (
    APPEND_ENV,
    TRAINING_STEP_KEY,
    metrics_path,
    prepare_metrics_file,
    read_metrics,
)

__all__ = [
    "LAUNCHES_DIR",
    "POINTER",
    "CheckpointFolder",
    "LaunchError",
    "LaunchPlan",
    "prepare_launch",
    "checkpoint_stamp",
    "read_checkpoint_folder",
    "saved_launch_config",
    "summary_lines",
    "set_aside_partial_checkpoints",
    "write_launch_record",
]

#: where each launch's resolved config is saved, inside the experiment folder
LAUNCHES_DIR = "launches"
_STEP_DIR = re.compile(r"global_step_(\d+)")
_LAUNCH_FILE = re.compile(r"launch_(\d+)\.json")


class LaunchError(ValueError):
    """The experiment folder does not allow this launch (a changed training key, an unreadable pointer, a missing
    ``trainer.resume_from_path``); the message says what to do."""


@dataclass
class CheckpointFolder:
    """verl's checkpoints in an experiment folder: the ``pointer``'s step (None if unreadable or absent),
    ``pointer_problem`` ("" when fine), every ``global_step_K``'s K (``steps``, sorted)."""

    folder: Path
    pointer: int | None = None
    pointer_problem: str = ""
    steps: list[int] = field(default_factory=list)

    @property
    def partial(self) -> list[int]:
        """Steps of the folders newer than the pointer: saves that did not finish."""
        return [k for k in self.steps if k > (self.pointer or 0)]

    @property
    def latest(self) -> int:
        """The step verl's ``resume_mode=auto`` resumes from (0: from scratch): the pointer's, if its folder exists."""
        return self.pointer if self.pointer is not None and self.pointer in self.steps else 0


def read_checkpoint_folder(folder: str | Path) -> CheckpointFolder:
    """What verl left in ``folder`` (see :class:`CheckpointFolder`); an absent folder holds nothing."""
    folder = Path(folder)
    state = CheckpointFolder(folder=folder)
    if not folder.is_dir():
        return state
    state.steps = sorted(int(m.group(1)) for p in folder.iterdir() if p.is_dir() and (m := _STEP_DIR.fullmatch(p.name)))
    pointer = folder / POINTER
    if pointer.exists():
        text = pointer.read_text(errors="replace").strip()
        if text.isdigit():
            state.pointer = int(text)
        else:
            state.pointer_problem = f"{pointer} holds {text[:40]!r}, not a step number"
    return state


def set_aside_partial_checkpoints(state: CheckpointFolder) -> list[tuple[Path, Path]]:
    """Rename each partial checkpoint folder (:attr:`CheckpointFolder.partial`) ``global_step_K`` to
    ``global_step_K.partial`` (``.partial2``, ... when taken); returns ``(old, new)`` pairs and updates ``state``."""
    moved = []
    for step in state.partial:
        old = state.folder / f"global_step_{step}"
        new, n = state.folder / f"{old.name}.partial", 1
        while new.exists():
            n += 1
            new = state.folder / f"{old.name}.partial{n}"
        old.rename(new)
        moved.append((old, new))
        state.steps.remove(step)
    return moved


def _launch_records(folder: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of the launch records in ``folder/launches``, oldest first."""
    records = folder / LAUNCHES_DIR
    if not records.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in records.iterdir() if (m := _LAUNCH_FILE.fullmatch(p.name)))


def checkpoint_stamp(folder: str | Path, step: int) -> int:
    """When checkpoint ``step`` of ``folder`` was written: the modification time (ns) of its ``data.pt`` (verl saves
    it after the actor), else of its folder. Identifies one save of that step."""
    ckpt = Path(folder) / f"global_step_{step}"
    return (ckpt / "data.pt" if (ckpt / "data.pt").exists() else ckpt).stat().st_mtime_ns


def saved_launch_config(folder: str | Path, step: int) -> tuple[Path, dict[str, Any]] | None:
    """The record of the launch that wrote checkpoint ``step`` (the one before the first launch that found that save
    of ``step``, by :func:`checkpoint_stamp`), or None when unknown."""
    records = [json.loads(path.read_text()) | {"_path": path} for _, path in _launch_records(Path(folder))]
    stamp = checkpoint_stamp(folder, step)
    seen_by = [i for i, r in enumerate(records) if r.get("checkpoints_seen", {}).get(str(step)) == stamp]
    writer = (seen_by[0] if seen_by else len(records)) - 1
    if writer < 0 or records[writer]["resume_step"] >= step:
        return None
    record = records[writer]
    return record.pop("_path"), record


def write_launch_record(
    folder: str | Path, config: Any, resume_step: int, metrics: Path | None, metrics_rows: int = 0
) -> Path:
    """Save this launch's resolved config, resume step, command, time, metrics rows and the checkpoints already there
    in ``folder/launches/launch_NNN.json``; returns the path."""
    records = Path(folder) / LAUNCHES_DIR
    records.mkdir(parents=True, exist_ok=True)
    number = max((n for n, _ in _launch_records(Path(folder))), default=0) + 1
    container = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
    record = {
        "launch": number,
        "resume_step": resume_step,
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "metrics": str(metrics) if metrics is not None else None,
        "metrics_rows": metrics_rows,
        "checkpoints_seen": {str(k): checkpoint_stamp(folder, k) for k in read_checkpoint_folder(folder).steps},
        "config": container,
    }
    path = records / f"launch_{number:03d}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


@dataclass
class LaunchPlan:
    """What :func:`prepare_launch` found and did: the folder, the step the launch resumes from (0: from scratch),
    the metrics file (None without the file logger), the launch record, and the lines to print."""

    folder: Path
    resume_step: int
    metrics: Path | None
    record: Path | None
    messages: list[str]


def _resume_step(config: Any, state: CheckpointFolder, messages: list[str]) -> int:
    """The step verl will resume from under ``trainer.resume_mode`` (0: from scratch); raises LaunchError where
    verl would crash inside Ray."""
    mode = config.trainer.get("resume_mode", "auto")
    if mode == "disable":
        if state.latest:
            messages.append(
                f"trainer.resume_mode=disable: starting from scratch in {state.folder}, which holds checkpoints up to "
                f"step {state.latest}; this run's checkpoints replace them step by step"
            )
        return 0
    if mode == "resume_path":
        path = str(config.trainer.get("resume_from_path", None) or "")
        match = re.search(r"global_step_(\d+)$", path.rstrip("/"))
        if match is None or not Path(path).absolute().is_dir():
            raise LaunchError(
                f"trainer.resume_mode=resume_path needs trainer.resume_from_path=<folder>/global_step_K, an existing "
                f"checkpoint folder; got {path!r}. Use trainer.resume_mode=auto to resume from the latest one"
            )
        return int(match.group(1))
    if state.pointer_problem:
        raise LaunchError(
            f"{state.pointer_problem}: verl (trainer.resume_mode=auto) would fail reading it inside Ray. Write the "
            f"step of the last complete checkpoint into it (folders: {_steps_text(state.steps)}), or start over "
            "(see docs/runs.md)"
        )
    if state.pointer is not None and not state.latest:
        messages.append(
            f"{state.folder / POINTER} names step {state.pointer}, but global_step_{state.pointer} is missing: "
            "verl starts from scratch"
        )
    return state.latest


_SHARD = re.compile(r"model_world_size_(\d+)_rank_\d+\.pt")


def world_size_problem(config: Any, checkpoint: Path) -> str | None:
    """Why verl cannot load the actor checkpoint ``.../global_step_K`` with this launch's ranks (its FSDP shards are
    per world size), or None; a checkpoint without shard files is not judged."""
    shards = {
        int(m.group(1)) for p in (checkpoint / "actor").glob("model_world_size_*") if (m := _SHARD.fullmatch(p.name))
    }
    ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    if not shards or ranks in shards:
        return None
    written = sorted(shards)[0]
    return (
        f"{checkpoint} was written by {written} rank(s) (verl's FSDP shards model_world_size_{written}_rank_*.pt), "
        f"but this launch has trainer.nnodes x trainer.n_gpus_per_node = {config.trainer.nnodes} x "
        f"{config.trainer.n_gpus_per_node} = {ranks}, and verl loads only shards of its own world size. Resume with "
        f"{written} rank(s) in all (e.g. NNODES=1 N_GPUS={written}: on the CPU platform any number of logical GPUs), "
        "or export the checkpoint (python -m verl_gigpo.export) and start a new run from it"
    )


def _steps_text(steps: list[int]) -> str:
    return ", ".join(f"global_step_{k}" for k in steps) or "none"


def _set_env(config: Any, environ: dict[str, str], name: str, value: str) -> None:
    """Set an environment variable for this process and, through Ray's runtime env, for every Ray process."""
    environ[name] = value
    OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{name}", value, force_add=True)


def prepare_launch(config: Any, *, environ: dict[str, str] | None = None, record: bool = True) -> LaunchPlan:
    """Prepare the experiment folder of a composed config before Ray (module docstring); ``config`` gets the absolute
    ``trainer.default_local_dir`` and the metrics path, ``environ`` (default ``os.environ``) the file logger's
    variables; ``record`` writes the launch record.

    Raises:
        LaunchError: a training key changed without ``trainer.allow_config_change``, or verl could not resume.
    """
    environ = os.environ if environ is None else environ
    folder = Path(str(config.trainer.default_local_dir)).absolute()
    config.trainer.default_local_dir = str(folder)
    messages: list[str] = []
    state = read_checkpoint_folder(folder)
    for old, new in set_aside_partial_checkpoints(state):
        messages.append(
            f"checkpoint {old} is newer than {POINTER} (step {state.pointer or 'none'}): a save that did not finish; "
            f"moved to {new}"
        )
    step = _resume_step(config, state, messages)
    mode = config.trainer.get("resume_mode", "auto")
    # the folder holding the checkpoint the launch loads: resume_path may name another experiment's
    source = Path(str(config.trainer.resume_from_path)).absolute().parent if mode == "resume_path" else folder
    if step and (problem := world_size_problem(config, source / f"global_step_{step}")):
        raise LaunchError(f"cannot resume: {problem}")
    if step and config.trainer.get("val_only", False):
        messages.append(
            f"trainer.val_only: validating the checkpoint {source / f'global_step_{step}'} (nothing is trained, so "
            "its training settings are not compared with this launch's)"
        )
    elif step:
        messages.append(
            f"resuming experiment {config.trainer.experiment_name!r} from {source / f'global_step_{step}'} "
            f"(trainer.resume_mode={mode}): the next iteration is {step + 1}. To start over instead, delete {folder} "
            "or choose another trainer.experiment_name (EXPERIMENT=... in the recipes)"
        )
        messages += _check_settings(config, source, step)
    path = metrics_path(config, environ)
    kept = 0
    if path is not None:
        # val_only trains nothing: the file's rows stay as they are (its folder is usually a fresh evaluation's,
        # where the checkpointed run's training rows are not expected)
        val_only = bool(config.trainer.get("val_only", False))
        report = prepare_metrics_file(path, step, keep_all=val_only)
        kept = report.kept
        messages += report.messages(step)
        messages.append(f"metrics: {path} (one JSON line per logged step, kept across launches; docs/runs.md)")
        _set_env(config, environ, "VERL_FILE_LOGGER_PATH", str(path))
        _set_env(config, environ, APPEND_ENV, "1")
    written = write_launch_record(folder, config, step, path, kept) if record else None
    return LaunchPlan(folder=folder, resume_step=step, metrics=path, record=written, messages=messages)


def _check_settings(config: Any, folder: Path, step: int) -> list[str]:
    """Compare the config with the one that wrote checkpoint ``step``: LaunchError on a changed training key unless
    ``trainer.allow_config_change``; the lines to print."""
    found = saved_launch_config(folder, step)
    if found is None:
        return [
            f"no launch record in {folder / LAUNCHES_DIR} for checkpoint {step} (a run launched without "
            "python -m verl_gigpo.main): its settings cannot be compared with this launch's"
        ]
    path, record = found
    try:
        _, refused = VERL_RESUME.check(
            record["config"],
            OmegaConf.to_container(config, resolve=True),
            allow=bool(config.trainer.get("allow_config_change", False)),
            resuming=f"{folder} from step {step}",
            source=str(path),
            start_over="start over (delete the folder or choose another trainer.experiment_name (EXPERIMENT=... in "
            "the recipes))",
        )
    except ResumeRefused as exc:
        raise LaunchError(str(exc)) from None
    if not refused:
        return []
    return [f"resuming with changed training settings (trainer.allow_config_change=true): {describe(refused)}"]


def summary_lines(plan: LaunchPlan) -> list[str]:
    """The end-of-launch summary of a verl launch (:func:`verl_gigpo.rollout.summary.launch_summary`)."""
    rows = read_metrics(plan.metrics) if plan.metrics is not None else []
    steps = [int(row["step"]) for row in rows if TRAINING_STEP_KEY in row]
    state = read_checkpoint_folder(plan.folder)
    iterations = steps[-1] if steps else state.pointer
    checkpoint = plan.folder / f"global_step_{state.latest}" if state.latest else None
    return launch_summary(rows, run_dir=plan.folder, iterations=iterations, checkpoint=checkpoint)
