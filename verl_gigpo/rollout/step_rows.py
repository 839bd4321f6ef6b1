"""The step rows of one training batch: one type for both engines, the estimator entry and the credit writer.

    steps = StepBatch.from_rows(uids, extra_fields, is_padding)   # verl's trainer mode, from TransferQueue rows
    steps = StepBatch.from_episodes(episodes)                      # the local engine, from finished episodes
    terms = steps.advantage_terms(cfg, response_mask)              # the configured step-credit estimator
    metrics = episode_metrics(steps.trajectory_summaries())       # env/* and episode/*, one definition

One row per environment step (N rows). A row's episode group is its task's id, never a batch position; rows of
failed episodes and verl's padding rows stay in the batch with ``row_mask`` False. Plain numpy at import. The row
schema: docs/estimators.md#the-step-row-schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from verl_gigpo import AGENT_LOOP_NAME, ESTIMATOR_NAME
from verl_gigpo.config.trainer import UpdateSettings  # noqa: F401 - its home was here
from verl_gigpo.rollout.metrics import TrajectorySummary
from verl_gigpo.rollout.rows import IMAGES_FIELD, REQUIRED_FIELDS, ROW_FIELDS, episode_rows
from verl_gigpo.rollout.types import Episode

__all__ = ["REQUIRED_FIELDS", "StepBatch", "UpdateSettings", "episode_group_id"]

#: row field -> (StepBatch column, value of a row that lacks it, dtype), from the schema
#: (:data:`~verl_gigpo.rollout.rows.ROW_FIELDS`); the one mapping both :meth:`StepBatch.from_rows` and
#: :meth:`StepBatch.from_episodes` read the rows through
_COLUMNS: dict[str, tuple[str, Any, Any]] = {f.name: (f.column, f.default, f.dtype) for f in ROW_FIELDS if f.column}


@dataclass
class StepBatch:
    """Per-row step data of one training batch, numpy arrays (N,) (padding included); schema columns as
    :data:`~verl_gigpo.rollout.rows.ROW_FIELDS`. ``env_rewards``: the environment's reward alone (None: the step
    rewards). Token columns (N lists; local engine only, else None): prompts, responses, rollout_logprobs, images.
    ``image_refs`` (N lists, else None): each row's images as PNG paths relative to the run's ``credit/`` folder
    (verl's rows, the evaluation's transcripts).
    """

    group_ids: np.ndarray
    traj_ids: np.ndarray
    step_ids: np.ndarray
    anchor_keys: np.ndarray
    step_rewards: np.ndarray
    action_valid: np.ndarray
    won: np.ndarray
    env_error: np.ndarray
    task_types: np.ndarray
    history_dropped: np.ndarray
    row_mask: np.ndarray
    env_seconds: np.ndarray | None = None
    generate_seconds: np.ndarray | None = None
    padding: np.ndarray | None = None
    episode_lengths: np.ndarray | None = None
    observation_truncated: np.ndarray | None = None
    abandoned_threads: np.ndarray | None = None
    env_rewards: np.ndarray | None = None
    task_ids: np.ndarray | None = None
    observations: np.ndarray | None = None
    actions: np.ndarray | None = None
    prompts: list[list[int]] | None = None
    responses: list[list[int]] | None = None
    rollout_logprobs: list[list[float] | None] | None = None
    images: list[list[Any]] | None = None
    image_refs: list[list[str]] | None = None

    def __len__(self) -> int:
        """N, the number of rows (padding and masked rows included)."""
        return len(self.group_ids)

    def __post_init__(self) -> None:
        n = len(self.group_ids)
        for column, default, dtype in _COLUMNS.values():  # an optional column left out: the schema's default
            if getattr(self, column) is None:
                setattr(self, column, np.full(n, default, dtype=dtype))
        if self.padding is None:
            pad_uid = np.array([str(g).startswith("pad") for g in self.group_ids], dtype=bool)
            self.padding = pad_uid | (~self.row_mask & ~self.env_error)
        if self.env_rewards is None:
            self.env_rewards = np.asarray(self.step_rewards, dtype=np.float64).copy()
        for name in ("prompts", "responses", "rollout_logprobs", "images", "image_refs"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"StepBatch.{name} has {len(column)} rows, group_ids {n}")

    def trajectory_summaries(self) -> list[TrajectorySummary]:
        """One :class:`~verl_gigpo.rollout.metrics.TrajectorySummary` per trajectory of the non-padding rows, in
        order of first appearance."""
        real = np.flatnonzero(~self.padding)  # (M,)
        if real.size == 0:
            return []
        codes, _ = pd.factorize(self.traj_ids[real])  # (M,) trajectory of each real row, 0..T-1
        num = int(codes.max()) + 1

        def count(flags: np.ndarray) -> np.ndarray:
            return np.bincount(codes, weights=flags.astype(np.float64), minlength=num)  # (T,)

        rows = np.bincount(codes, minlength=num)  # (T,)
        first = np.full(num, real.size, dtype=np.int64)
        np.minimum.at(first, codes, np.arange(real.size))
        first = real[first]  # (T,) batch position of each trajectory's first real row
        reported = self.episode_lengths[first]  # (T,)
        length = np.where(reported >= 0, reported, rows)
        returns = count(self.step_rewards[real])
        won, failed = count(self.won[real]) > 0, count(self.env_error[real]) > 0
        no_step = reported == 0  # (T,) failed at reset: its one row is the agent loop's placeholder, not a step
        invalid = np.where(no_step, 0, count(~self.action_valid[real].astype(bool)))
        dropped = np.where(no_step, 0, count(self.history_dropped[real] > 0))
        cut = np.where(no_step, 0, count(self.observation_truncated[real].astype(bool)))
        return [
            TrajectorySummary(
                won=bool(won[k]),
                length=int(length[k]),
                episode_return=float(returns[k]),
                num_invalid=int(invalid[k]),
                history_dropped_steps=int(dropped[k]),
                observation_truncated_steps=int(cut[k]),
                env_error=bool(failed[k]),
                task_type=self.task_types[first[k]],
                env_seconds=float(self.env_seconds[first[k]]),
                generate_seconds=float(self.generate_seconds[first[k]]),
                batch_rows=int(rows[k]),
                abandoned_threads=int(self.abandoned_threads[first[k]]),
            )
            for k in range(num)
        ]

    @classmethod
    def from_rows(cls, uids: Sequence[str], extra_fields: Sequence[dict], is_padding: Sequence[bool]) -> StepBatch:
        """Build from TransferQueue rows (``uid``, ``extra_fields``, ``is_padding``); ValueError if a real row lacks
        the agent loop's step fields."""
        n = len(uids)
        if not (len(extra_fields) == n == len(is_padding)):
            raise ValueError(
                f"uids ({n}), extra_fields ({len(extra_fields)}) and is_padding ({len(is_padding)}) differ in length"
            )
        padding = np.asarray(is_padding, dtype=bool) | np.array([str(u).startswith("pad") for u in uids], dtype=bool)
        for i in range(n):
            if padding[i]:
                continue
            missing = [k for k in REQUIRED_FIELDS if k not in (extra_fields[i] or {})]
            if missing:
                raise ValueError(
                    f"row {i} (uid {uids[i]}) lacks extra_fields {missing}: adv_estimator={ESTIMATOR_NAME} needs the "
                    f"step rows of the '{AGENT_LOOP_NAME}' agent loop (actor_rollout_ref.rollout.agent."
                    f"default_agent_loop={AGENT_LOOP_NAME}, or an agent_name column in the dataset)"
                )
        refs = [list((f or {}).get(IMAGES_FIELD) or []) for f in extra_fields]  # the agent loop's PNG paths
        uid_array = np.array([str(u) for u in uids], dtype=object)
        return cls._from_fields(uid_array, extra_fields, padding, image_refs=refs if any(refs) else None)

    @classmethod
    def from_episodes(cls, episodes: Sequence[Episode], *, text_chars: int = 0) -> StepBatch:
        """Build from finished episodes (the local engine) via :func:`~verl_gigpo.rollout.rows.episode_rows`;
        ``text_chars`` > 0 keeps the rows' texts, cut. Raises ValueError when two episodes share a ``traj_id``."""
        ids = [ep.traj_id for ep in episodes]
        if len(set(ids)) != len(ids):
            repeated = sorted({t for t in ids if ids.count(t) > 1})
            raise ValueError(f"episodes share traj_id {repeated[:5]}: each trajectory needs its own id")
        groups, rows = [], []
        for ep in episodes:
            for row in episode_rows(ep, text_chars=text_chars):
                groups.append(episode_group_id(ep))
                rows.append(row)
        return cls._from_fields(
            np.asarray(groups, dtype=object),
            [r.fields for r in rows],
            np.zeros(len(rows), dtype=bool),
            prompts=[r.prompt_ids for r in rows],
            responses=[r.response_ids for r in rows],
            rollout_logprobs=[r.response_logprobs for r in rows],
            images=[r.images for r in rows],
        )

    @classmethod
    def _from_fields(
        cls, group_ids: np.ndarray, rows: Sequence[Mapping[str, Any] | None], padding: np.ndarray, **tokens: Any
    ) -> StepBatch:
        """The batch of N rows' fields (:mod:`verl_gigpo.rollout.rows`) read through :data:`_COLUMNS`; a field a
        row lacks (or holds None) takes the column's default, ``env_reward`` the row's step reward."""
        rows = [r or {} for r in rows]

        def value(row: Mapping[str, Any], key: str, default: Any) -> Any:
            got = row.get(key)
            return default if got is None else got

        columns = {
            column: np.array([value(r, key, default) for r in rows], dtype=dtype)
            for key, (column, default, dtype) in _COLUMNS.items()
        }
        columns["env_rewards"] = np.array(
            [float(value(r, "env_reward", value(r, "step_reward", 0.0))) for r in rows], dtype=np.float64
        )
        return cls(
            group_ids=group_ids,
            **columns,
            row_mask=~padding & ~columns["env_error"],
            padding=padding,
            **tokens,
        )

    def select(self, rows: np.ndarray) -> StepBatch:
        """The rows ``rows`` (indices into this batch, (M,) int) as a new batch, every column taken in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        taken: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                taken[f.name] = value[rows]
            elif value is not None:
                taken[f.name] = [value[i] for i in rows]
            else:
                taken[f.name] = None
        return StepBatch(**taken)

    def trajectory_scores(self, *, env_rewards: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One outcome score ``R = sum_t r_t`` per trajectory of the unmasked rows (GRPO, RLOO).

        Returns ``traj_of_row`` (N,) int64 (-1 masked), ``returns`` (T,) float64 (environment rewards alone with
        ``env_rewards``), ``groups`` (T,) object.
        """
        traj_of_row = np.full(len(self), -1, dtype=np.int64)
        real = np.flatnonzero(self.row_mask)  # (M,)
        if real.size == 0:
            return traj_of_row, np.zeros(0), np.zeros(0, dtype=object)
        codes, _ = pd.factorize(self.traj_ids[real])  # (M,)
        traj_of_row[real] = codes
        num = int(codes.max()) + 1
        rewards = self.env_rewards if env_rewards else self.step_rewards  # (N,)
        returns = np.bincount(codes, weights=rewards[real], minlength=num)  # (T,)
        first = np.full(num, real.size, dtype=np.int64)
        np.minimum.at(first, codes, np.arange(real.size))
        return traj_of_row, returns, self.group_ids[real[first]]

    def advantage_terms(self, cfg: Any, response_mask: Any = None) -> Any:
        """``cfg.estimate`` (a :class:`verl_gigpo.config.GiGPOConfig`) on these rows, rewards float64: the
        :class:`verl_gigpo.advantage.AdvantageTerms`, arrays (N,), 0 on masked rows."""
        env_rewards = np.asarray(self.env_rewards, dtype=np.float64)
        return cfg.estimate(self.estimator_rows(response_mask), env_rewards=env_rewards)

    def estimator_rows(self, response_mask: Any = None) -> Any:
        """These rows as the estimators' input, :class:`verl_gigpo.advantage.StepRows` (step rewards float64);
        ``response_mask`` (N, L) torch, None: one token per row ((N, 1) ones)."""
        import torch

        from verl_gigpo.advantage import StepRows  # the maths imports torch: not at import time

        rewards = np.asarray(self.step_rewards, dtype=np.float64)
        mask = torch.ones((len(self), 1)) if response_mask is None else response_mask
        ids = (self.group_ids, self.traj_ids, self.step_ids, self.anchor_keys)
        return StepRows(rewards, mask, *ids, row_mask=self.row_mask, won=self.won, action_valid=self.action_valid)


def episode_group_id(episode: Episode) -> str:
    """The episode group of ``episode``: its ``group_id`` when set, else ``env_name/split/seed[/kwargs]``."""
    if episode.group_id is not None:
        return str(episode.group_id)
    task = episode.task
    kwargs = f"/{sorted(dict(task.env_kwargs).items())}" if task.env_kwargs else ""
    return f"{task.env_name}/{task.split}/{task.seed}{kwargs}"
