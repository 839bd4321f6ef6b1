"""Credit the same rows again with another estimator: every method's picture of the same episodes.

A run's credit records hold what each step-credit estimator reads (episode group, trajectory, step id, anchor group,
step reward, outcome, action validity), so the rows of one episode group can be credited again by GiGPO, HGPO,
GraphGPO and G2PO and drawn side by side (``python -m verl_gigpo.inspect RUN --methods gigpo,hgpo,graphgpo,g2po``).
The anchor of a row is its recorded anchor group (exact keys, or the similarity groups the run used); the options
are the defaults of :class:`verl_gigpo.config.GiGPOConfig` (the papers') with the ``gamma`` given, since records do
not store the run's options.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.rules import DEFAULT_GAMMA
from verl_gigpo.credit.records import credit_records
from verl_gigpo.rollout.step_rows import StepBatch

__all__ = ["recredit"]


def recredit(records: Sequence[dict[str, Any]], method: str, *, gamma: float = DEFAULT_GAMMA) -> list[dict[str, Any]]:
    """The records of ``records``' rows as ``method`` credits them (same rows, same order, same texts).

    Args:
        records: credit records of one iteration (any method wrote them).
        method: ``"gigpo"``, ``"hgpo"``, ``"graphgpo"`` or ``"g2po"``.
        gamma: the discount of R_t (and of G2PO's node values).

    Raises:
        ValueError: an unknown method, or no records.
    """
    if method not in STEP_CREDIT_ESTIMATORS:
        raise ValueError(f"method={method!r} is not a step-credit estimator; use one of {list(STEP_CREDIT_ESTIMATORS)}")
    if not records:
        raise ValueError("recredit needs credit records; got none")
    n = len(records)

    def column(key: str, dtype: Any = object) -> np.ndarray:
        return np.array([r[key] for r in records], dtype=dtype)

    groups, trajs, steps = column("group"), column("traj"), column("step", np.int64)
    rewards, anchors = column("step_reward", np.float64), column("anchor_group", np.int64)
    rows = StepBatch(
        group_ids=groups,
        traj_ids=trajs,
        step_ids=steps,
        anchor_keys=anchors,
        step_rewards=rewards,
        action_valid=column("action_valid", bool),
        won=column("won", bool),
        env_error=np.zeros(n, dtype=bool),
        task_types=column("task_type"),
        history_dropped=np.zeros(n, dtype=np.int64),
        row_mask=np.ones(n, dtype=bool),
        task_ids=column("task_id"),
        observations=column("observation"),
        actions=column("action"),
    )
    terms = rows.advantage_terms(GiGPOConfig(gamma=gamma, method=method))
    out = credit_records(terms, iteration=int(records[0]["iteration"]), steps=rows)
    for new, old in zip(out, records, strict=True):  # the recorded hash of the raw key, not of the group id
        new["anchor_key"] = old["anchor_key"]
    return out
