"""Credit the same rows again with another estimator: every method's picture of the same episodes.

``python -m verl_gigpo.inspect RUN --methods gigpo,hgpo,graphgpo,g2po``; what is reused and assumed:
docs/credit-report.md, "Other estimators, two runs".
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
    """The records of ``records``' rows (one iteration) as ``method`` credits them, with discount ``gamma``."""
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
        image_refs=[list(r.get("images") or []) for r in records],  # the same PNGs, beside the same records
    )
    terms = rows.advantage_terms(GiGPOConfig(gamma=gamma, method=method))
    out = credit_records(terms, iteration=int(records[0]["iteration"]), steps=rows)
    for new, old in zip(out, records, strict=True):  # the recorded hash of the raw key, not of the group id
        new["anchor_key"] = old["anchor_key"]
    return out
