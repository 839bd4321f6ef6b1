"""Write the train/val parquet files of task rows that verl's dataset loader (``RLHFDataset``) reads.

    python -m verl_gigpo.data.prepare --env alfworld --train-size 2048 --out ~/data/gigpo/alfworld
    python -m verl_gigpo.data.prepare --env webshop --train-size 4096 --val-size 500 --out ~/data/gigpo/webshop

A row is a TASK (``env_name``, ``seed``, ``split``), not a prompt; validation uses a fixed task list. The counts
of each task type go to ``task_types.json``. Details: docs/configuration.md#task-data.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from environments import TextEnv, kwargs_from_json, list_envs, make_env, resolve_env
from verl_gigpo import AGENT_LOOP_NAME
from verl_gigpo.config.rules import Range

__all__ = ["DEFAULT_VAL_SPLIT", "REPORT_NAME", "main", "task_rows", "task_type_counts", "write_task_files"]

#: The task-type report written beside train.parquet and val.parquet.
REPORT_NAME = "task_types.json"

logger = logging.getLogger(__name__)

#: evaluation split of each environment (the paper's evaluation sets where they exist)
DEFAULT_VAL_SPLIT = {
    "alfworld": "valid_seen",
    "webshop": "test",
    "webshop_real": "test",
    "sokoban": "test",
    "search": "test",
    "gridnav": "test",
}
#: default validation size when the environment has no fixed list of its own
DEFAULT_VAL_SIZE = {"webshop": 500, "webshop_real": 500, "sokoban": 128, "search": 256, "gridnav": 64}


def task_rows(env_name: str, split: str, seeds: range, *, data_source: str | None = None) -> list[dict[str, Any]]:
    """Task rows for ``seeds`` of ``split``: the columns verl's ``RLHFDataset`` and the agent loop read."""
    rows = []
    for index, seed in enumerate(seeds):
        rows.append(
            {
                "data_source": data_source or env_name,
                "prompt": [{"role": "user", "content": f"{env_name} task {split}/{seed}"}],
                "agent_name": AGENT_LOOP_NAME,
                "env_name": env_name,
                "seed": int(seed),
                "split": split,
                "ability": "agent",
                "reward_model": {"style": "environment", "ground_truth": ""},
                "extra_info": {"index": index, "split": split, "seed": int(seed)},
            }
        )
    return rows


def task_type_counts(env: TextEnv, split: str, seeds: range) -> dict[str, int] | None:
    """``{task type: number of seeds}`` of ``seeds`` in ``split``, sorted by type, from
    :meth:`~environments.base.TextEnv.task_type_of`; None when the environment cannot tell a seed's type."""
    counts: Counter[str] = Counter()
    for seed in seeds:
        task_type = env.task_type_of(seed, split)
        if task_type is None:
            return None
        counts[str(task_type)] += 1
    return dict(sorted(counts.items()))


def _describe(name: str, report: dict[str, Any]) -> str:
    """One line of the report: ``train: 2048 tasks of split 'train'; task types: clean 340, cool 300, ...``."""
    types = report["task_types"]
    listed = ", ".join(f"{t} {n}" for t, n in types.items()) if types is not None else "not known before reset"
    return f"{name}: {report['tasks']} tasks of split {report['split']!r}; task types: {listed}"


def write_task_files(
    env_name: str,
    out_dir: str | Path,
    *,
    train_size: int,
    val_size: int | None = None,
    val_split: str | None = None,
    train_split: str = "train",
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write ``train.parquet`` (seeds ``0..train_size-1``) and ``val.parquet`` under ``out_dir``; return their paths.

    ``val_size`` None: the environment's whole fixed list or its default size. Raises ValueError on a bad name,
    split or size; ImportError / EnvError when the environment cannot be built.
    """
    if env_name not in list_envs():
        raise ValueError(f"unknown environment {env_name!r}; known environments: {', '.join(list_envs())}")
    Range("train_size", "int", "training tasks", low=1).check(train_size)
    if not str(out_dir).strip():
        raise ValueError("out_dir is empty; name the folder for train.parquet and val.parquet, e.g. ~/data/gigpo/x")
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ValueError(f"env_kwargs must be a dict of constructor arguments, got {type(env_kwargs).__name__}")
    env_kwargs = dict(env_kwargs or {})
    val_split = val_split or DEFAULT_VAL_SPLIT.get(env_name, "test")
    if val_split == train_split:
        raise ValueError(
            f"the validation split {val_split!r} is the training split: validation tasks 0..val_size-1 would be "
            f"training tasks too; use an evaluation split (default for {env_name}: "
            f"{DEFAULT_VAL_SPLIT.get(env_name, 'test')!r})"
        )
    env = make_env(env_name, **env_kwargs)
    try:
        for split in (train_split, val_split):
            if split not in env.splits:
                raise ValueError(f"{env_name} has no split {split!r}; its splits: {list(env.splits)}")
        fixed = env.num_tasks(val_split)  # the size of a fixed evaluation list, None when tasks are procedural
        if val_size is None:
            val_size = int(fixed) if fixed is not None else DEFAULT_VAL_SIZE.get(env_name, 64)
        if val_size < 1:
            raise ValueError(f"val_size must be >= 1, got {val_size}")
        if fixed is not None and val_size > fixed:
            raise ValueError(f"{env_name} split {val_split!r} has {fixed} tasks; val_size={val_size} is larger")
        report = {
            name: {"split": split, "tasks": size, "task_types": task_type_counts(env, split, range(size))}
            for name, split, size in (("train", train_split, train_size), ("val", val_split, val_size))
        }
    finally:
        env.close()
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    train_path, val_path = out / "train.parquet", out / "val.parquet"
    pd.DataFrame(task_rows(env_name, train_split, range(train_size))).to_parquet(train_path)
    pd.DataFrame(task_rows(env_name, val_split, range(val_size))).to_parquet(val_path)
    (out / REPORT_NAME).write_text(json.dumps({"env_name": env_name, **report}, indent=2) + "\n")
    logger.info("wrote %s and %s (%s)", train_path, val_path, out / REPORT_NAME)
    for name, part in report.items():
        logger.info("%s", _describe(name, part))
    return train_path, val_path


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Write train/val task parquet files for verl-gigpo.")
    parser.add_argument(
        "--env",
        required=True,
        help=f"environment: {', '.join(list_envs())}, or your own as package.module:Class (importable here)",
    )
    parser.add_argument("--train-size", type=int, required=True, help="number of training tasks")
    parser.add_argument("--val-size", type=int, default=None, help="validation tasks (default: the fixed list)")
    parser.add_argument("--val-split", default=None, help="evaluation split (default per environment)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--env-kwargs", default="{}", help='JSON constructor arguments, e.g. \'{"data_path": "..."}\'')
    args = parser.parse_args(argv)
    try:
        env_name = resolve_env(args.env)  # a user's package.module:Class is registered under its name
    except (ValueError, ImportError) as exc:
        parser.error(f"--env {args.env}: {exc}")
    try:
        env_kwargs = kwargs_from_json(args.env_kwargs)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        train_path, val_path = write_task_files(
            env_name,
            args.out,
            train_size=args.train_size,
            val_size=args.val_size,
            val_split=args.val_split,
            env_kwargs=env_kwargs,
        )
    except (ValueError, TypeError) as exc:  # bad arguments, including environment constructor arguments
        parser.error(str(exc))
    print(f"train: {train_path}\nval:   {val_path}")
    report = json.loads((Path(train_path).parent / REPORT_NAME).read_text())
    for name in ("train", "val"):
        print(_describe(name, report[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
