"""What every estimator returns: :class:`AdvantageTerms` and the shared ``gigpo/*`` diagnostics (:data:`STAT_NAMES`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl_gigpo.advantage._inputs import as_response_mask
from verl_gigpo.advantage._rows import Basis, ValidRows, check_overflow

__all__ = ["STAT_NAMES", "AdvantageTerms", "GiGPOTerms", "assemble", "shared_stats"]

STAT_NAMES = (
    "gigpo/num_episode_groups",
    "gigpo/num_step_groups",
    "gigpo/step_group_size_mean",
    "gigpo/step_group_size_max",
    "gigpo/frac_singleton_step_groups",
    "gigpo/frac_rows_in_singleton_step_groups",
    "gigpo/frac_zero_std_episode_groups",
    "gigpo/frac_rows_nonzero_step_adv",
    "gigpo/episode_adv_abs_mean",
    "gigpo/step_adv_abs_mean",
    "gigpo/num_masked_rows",
)
"""Diagnostics every estimator returns in :attr:`AdvantageTerms.stats` (docs/metrics.md); HGPO, GraphGPO and G2PO
add a few of their own."""

STEP_ADV_ZERO = 1e-6
"""|A_S| at or below this counts as no step signal in ``gigpo/frac_rows_nonzero_step_adv`` (equal returns leave
rounding residues of about 1e-16)."""

_NUMPY_MASK_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
)


@dataclass(frozen=True)
class AdvantageTerms:
    """Per-row terms of a step-credit advantage plus batch diagnostics; every array (N,), 0 on masked rows.

    Fields per estimator: docs/adding-an-estimator.md, "What an estimator returns". ``anchor_group`` is -1 on masked
    rows; ``episode_signal``/``step_signal`` (bool) say whether the term carries signal (what dynamic sampling reads).
    """

    episode_return: np.ndarray
    step_return: np.ndarray
    episode_adv: np.ndarray
    step_adv: np.ndarray
    advantage: np.ndarray
    anchor_group: np.ndarray
    anchor_group_size: np.ndarray
    row_mask: np.ndarray
    episode_signal: np.ndarray
    step_signal: np.ndarray
    stats: dict[str, float] = field(default_factory=dict)
    method: str = "gigpo"
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def token_level(self, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` float32 (N, L): ``A[:, None] * mask``, ``R_t[:, None] * mask``.

        ``response_mask`` (N, L) bool, int or float, on the output device. Raises on a non-finite mask or |x| > 3.4e38.
        """
        mask = as_response_mask(response_mask, self.advantage.shape[0]).detach()  # (N, L)
        for name, values in (("advantage", self.advantage), ("step return R_t", self.step_return)):
            too_big = np.flatnonzero(np.abs(values) > np.finfo(np.float32).max)
            if too_big.size:
                i = int(too_big[0])
                raise ValueError(
                    f"the {name} of row {i} ({values[i]:.3g}) does not fit the float32 output (|x| <= 3.4e38); scale "
                    "the rewards down (e.g. to |r| <= 1e6)"
                )
        adv = self.advantage.astype(np.float32)[:, None]  # (N, 1)
        ret = self.step_return.astype(np.float32)[:, None]  # (N, 1)
        if mask.device.type == "cpu" and mask.dtype in _NUMPY_MASK_DTYPES:
            # numpy on CPU: single-threaded, so no thread-pool hand-off on a busy machine; same numbers.
            with np.errstate(over="ignore"):  # a float64 value beyond float32 becomes inf: reported below
                m = mask.numpy().astype(np.float32, copy=False)
            if mask.is_floating_point() and not np.isfinite(m).all():
                _raise_mask(mask, np.argwhere(~np.isfinite(m))[0])
            return torch.from_numpy(adv * m), torch.from_numpy(ret * m)  # (N, L), (N, L)
        mask = mask.to(torch.float32)
        if not bool(torch.isfinite(mask).all()):
            _raise_mask(response_mask, torch.nonzero(~torch.isfinite(mask))[0].tolist())
        return torch.from_numpy(adv).to(mask.device) * mask, torch.from_numpy(ret).to(mask.device) * mask


GiGPOTerms = AdvantageTerms
"""The name the terms have always had (GiGPO's); the same class."""


def assemble(
    base: Basis,
    *,
    episode_adv: np.ndarray,
    step_adv: np.ndarray,
    advantage: np.ndarray,
    method: str,
    step_signal: np.ndarray,
    episode_signal: np.ndarray | None = None,
    stats: dict[str, float] | None = None,
    extras: dict[str, np.ndarray] | None = None,
) -> AdvantageTerms:
    """Scatter an estimator's (M,) terms, signals and ``extras`` of the valid rows to (N,), with :data:`STAT_NAMES`."""
    rows = base.rows
    check_overflow(rows, {"episode return": base.R_row, "step return R_t": base.R_t, "advantage": advantage})
    s_size = np.bincount(base.s_group, minlength=base.num_s)  # (S,)
    return AdvantageTerms(
        episode_return=rows.scatter(base.R_row),
        step_return=rows.scatter(base.R_t),
        episode_adv=rows.scatter(episode_adv),
        step_adv=rows.scatter(step_adv),
        advantage=rows.scatter(advantage),
        anchor_group=rows.scatter(base.s_group, np.int64, fill=-1),
        anchor_group_size=rows.scatter(s_size[base.s_group], np.int64),
        row_mask=rows.valid,
        episode_signal=rows.scatter(base.episode_signal if episode_signal is None else episode_signal, bool, False),
        step_signal=rows.scatter(step_signal, bool, False),
        stats={**shared_stats(rows, episode_adv, step_adv, s_size, base.flat_groups), **(stats or {})},
        method=method,
        extras={name: rows.scatter(values) for name, values in (extras or {}).items()},
    )


def shared_stats(
    rows: ValidRows,
    A_E: np.ndarray,
    A_S: np.ndarray,
    group_size: np.ndarray,
    flat_episode_groups: np.ndarray,
) -> dict[str, float]:
    """The :data:`STAT_NAMES` diagnostics; ``A_E``, ``A_S`` (M,), ``group_size`` (S,), ``flat_episode_groups`` (G,)."""
    m, num_s = rows.m, group_size.shape[0]
    singleton = group_size == 1
    return {
        "gigpo/num_episode_groups": float(rows.num_groups),
        "gigpo/num_step_groups": float(num_s),
        "gigpo/step_group_size_mean": float(m / num_s) if num_s else 0.0,
        "gigpo/step_group_size_max": float(group_size.max(initial=0)),
        "gigpo/frac_singleton_step_groups": float(singleton.mean()) if num_s else 0.0,
        "gigpo/frac_rows_in_singleton_step_groups": float(singleton.sum() / m) if m else 0.0,
        "gigpo/frac_zero_std_episode_groups": float(flat_episode_groups.mean()) if rows.num_groups else 0.0,
        "gigpo/frac_rows_nonzero_step_adv": float((np.abs(A_S) > STEP_ADV_ZERO).mean()) if m else 0.0,
        "gigpo/episode_adv_abs_mean": float(np.abs(A_E).mean()) if m else 0.0,
        "gigpo/step_adv_abs_mean": float(np.abs(A_S).mean()) if m else 0.0,
        "gigpo/num_masked_rows": float(rows.n - m),
    }


def _raise_mask(mask: Any, where: Any) -> None:
    i, j = (int(x) for x in where)
    raise ValueError(
        f"response_mask[{i}, {j}] = {float(mask[i, j])} is not finite (as float32); the mask must hold 1 on response "
        "tokens and 0 on padding (NaN or inf would pass into every loss term)"
    )
