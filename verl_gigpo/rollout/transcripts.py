"""Evaluation transcripts: one JSON line per step of every episode played, written the same way by both engines.

    records = episode_records(episode, group="task3")            # one dict per step (a placeholder if none)
    TranscriptWriter(folder).write(records)                       # appends to folder/transcripts_<host>_<pid>.jsonl
    records = read_transcripts(folder)                            # every file of the folder
    outcomes = episode_outcomes(records)                          # one EpisodeOutcome per trajectory
    steps = step_rows(records)                                    # the rows a step-credit estimator reads

Every field: docs/evaluate.md#transcript-records.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verl_gigpo.credit.records import (
    _plain,  # the JSON form of an id, as credit records write it
    anchor_key_hash,
    read_json_lines,
)
from verl_gigpo.rollout.rows import action_text, truncate_text
from verl_gigpo.rollout.vision import save_images

__all__ = [
    "MAX_CHARS",
    "TRANSCRIPT_FIELDS",
    "EpisodeOutcome",
    "TranscriptWriter",
    "episode_outcomes",
    "episode_records",
    "read_transcripts",
    "step_rows",
]

#: texts (observation, action, reply) are cut to this many characters, from the end
MAX_CHARS = 4000

TRANSCRIPT_FIELDS = (
    "group",
    "traj",
    "step",
    "env_name",
    "split",
    "seed",
    "task_id",
    "task_type",
    "anchor_key",
    "observation",
    "action",
    "response",
    "action_valid",
    "env_reward",
    "step_reward",
    "won",
    "env_error",
    "env_error_message",
    "episode_length",
    "episode_return",
    "num_invalid",
)
"""The keys of every transcript record, in file order (see the module docstring)."""

#: the keys that follow them when the episode's requests were seeded (docs/reproducibility.md: with the task they
#: give every request's seed, so the episode can be replayed)
SEED_FIELDS = ("rollout_seed", "stream", "member")
#: the key that follows them on a step with image observations (the PNG files, relative to the transcript folder)
IMAGE_FIELDS = ("images",)


def episode_records(
    episode: Any, *, group: Any, max_chars: int = MAX_CHARS, image_folder: str | Path | None = None
) -> list[dict[str, Any]]:
    """The transcript records of one finished episode: one per step, or one placeholder when it failed before the
    first step. Texts are cut to ``max_chars``; ``image_folder`` (None: no images) receives the steps' PNGs."""
    common = {
        "group": _plain(group),
        "traj": str(episode.traj_id),
        "env_name": episode.task.env_name,
        "split": episode.task.split,
        "seed": int(episode.task.seed),
        "task_id": _plain(episode.task_id),
        "task_type": _plain(episode.task_type),
        "won": bool(episode.won),
        "env_error": episode.env_error is not None,
        "env_error_message": episode.env_error or "",
        "episode_length": int(episode.length),
        "episode_return": float(episode.episode_return),
        "num_invalid": int(episode.num_invalid),
    }
    seeds = getattr(episode, "seeds", None)
    if seeds is not None:
        common.update(rollout_seed=int(seeds.rollout_seed), stream=str(seeds.stream), member=int(seeds.member))
    if not episode.steps:
        placeholder = {"step": 0, "anchor_key": "", "observation": "", "action": "", "response": ""}
        return [_ordered({**common, **placeholder, "action_valid": False, "env_reward": 0.0, "step_reward": 0.0})]
    return [
        _ordered(
            {
                **common,
                "step": int(step.step_id),
                "anchor_key": anchor_key_hash(step.anchor_key),
                "observation": truncate_text(step.observation, max_chars),
                "action": truncate_text(action_text(step.action, step.response_text, step.action_valid), max_chars),
                "response": truncate_text(step.response_text, max_chars),
                "action_valid": bool(step.action_valid),
                "env_reward": float(step.env_reward),
                "step_reward": float(step.step_reward),
                **({"images": save_images(step.images, image_folder)} if image_folder and step.images else {}),
            }
        )
        for step in episode.steps
    ]


class TranscriptWriter:
    """Appends transcript records to ``<folder>/transcripts_<host>_<pid>.jsonl`` (one file per process), flushed
    after every episode; thread-safe."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"transcripts_{socket.gethostname()}_{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        """Append ``records`` (one episode's, their images stored in :attr:`folder`) as JSON lines."""
        text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records)
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(text)


def read_transcripts(folder: str | Path) -> list[dict[str, Any]]:
    """Every record of the ``transcripts_*.jsonl`` files in ``folder``, in name order. Raises FileNotFoundError
    (no file) or ValueError naming the file and line of a bad record."""
    folder = Path(folder)
    files = sorted(folder.glob("transcripts_*.jsonl")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no transcripts_*.jsonl in {folder}: the episodes were not written there (verl: env.transcript_dir; "
            "did the launch run its validation?)"
        )
    return [r for path in files for r in read_json_lines(path, TRANSCRIPT_FIELDS, what="a transcript record")]


@dataclass(frozen=True)
class EpisodeOutcome:
    """What one episode scored: its group (task draw), task seed, id and type, whether it was won, its length,
    return and invalid replies, and whether its environment failed (then it is not scored)."""

    group: Any
    traj: str
    seed: int
    task_id: Any
    task_type: Any
    won: bool
    length: int
    episode_return: float
    num_invalid: int
    env_error: bool


def episode_outcomes(records: Sequence[dict[str, Any]]) -> list[EpisodeOutcome]:
    """One :class:`EpisodeOutcome` per trajectory of ``records``, in order of first appearance.

    Raises:
        ValueError: two records of one trajectory that disagree on the episode's fields (mixed files).
    """
    outcomes: dict[str, EpisodeOutcome] = {}
    for r in records:
        outcome = EpisodeOutcome(
            group=r["group"],
            traj=str(r["traj"]),
            seed=int(r["seed"]),
            task_id=r["task_id"],
            task_type=r["task_type"],
            won=bool(r["won"]),
            length=int(r["episode_length"]),
            episode_return=float(r["episode_return"]),
            num_invalid=int(r["num_invalid"]),
            env_error=bool(r["env_error"]),
        )
        seen = outcomes.setdefault(outcome.traj, outcome)
        if seen != outcome:
            raise ValueError(
                f"transcript records of trajectory {outcome.traj!r} disagree ({seen} vs {outcome}): the folder holds "
                "two evaluations; give each its own --out folder"
            )
    return list(outcomes.values())


def step_rows(records: Sequence[dict[str, Any]]) -> Any:
    """The step rows of ``records`` (:class:`verl_gigpo.rollout.step_rows.StepBatch`, N rows, their texts
    included; failed episodes masked), for a step-credit estimator and the credit records."""
    from verl_gigpo.rollout.step_rows import StepBatch

    n = len(records)

    def column(key: str, dtype: Any = object) -> np.ndarray:
        return np.array([r[key] for r in records], dtype=dtype)

    env_error = column("env_error", bool)
    steps = StepBatch(
        group_ids=np.array([str(g) for g in column("group")], dtype=object),
        traj_ids=column("traj"),
        step_ids=column("step", np.int64),
        anchor_keys=column("anchor_key"),
        step_rewards=column("step_reward", np.float64),
        env_rewards=column("env_reward", np.float64),
        action_valid=column("action_valid", bool),
        won=column("won", bool),
        env_error=env_error,
        task_types=column("task_type"),
        history_dropped=np.zeros(n, dtype=np.int64),
        row_mask=~env_error,
        episode_lengths=column("episode_length", np.int64),
        task_ids=column("task_id"),
        observations=np.array([str(r["observation"]) for r in records], dtype=object),
        actions=np.array([str(r["action"]) for r in records], dtype=object),
    )
    return steps


def _ordered(record: dict[str, Any]) -> dict[str, Any]:
    keys = (*TRANSCRIPT_FIELDS, *SEED_FIELDS, *IMAGE_FIELDS)
    return {key: record[key] for key in keys if key in record or key in TRANSCRIPT_FIELDS}
