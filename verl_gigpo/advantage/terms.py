"""What every estimator of :mod:`verl_gigpo.advantage` returns: :class:`AdvantageTerms`, per-row terms plus
diagnostics, and the ``gigpo/*`` diagnostics they all share (:data:`STAT_NAMES`)."""

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
"""Diagnostics every estimator returns in :attr:`AdvantageTerms.stats` (documented in
:func:`verl_gigpo.advantage.gigpo_advantage_terms`); HGPO, GraphGPO and G2PO add a few of their own."""

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
    """Per-row terms of a step-credit advantage (GiGPO, HGPO, GraphGPO or G2PO), plus batch diagnostics.

    All arrays have shape ``(N,)``, one entry per input row; rows with ``row_mask`` False hold 0 everywhere.

    Attributes:
        episode_return: float64, the row's episode score: R(tau) = sum of the trajectory's valid step rewards (same
            for all its rows), minus the row's own penalty when the estimator got a ``row_penalty``.
        step_return: float64, R_t = sum_{k >= t} gamma^(k - t) r_k along the trajectory in step-id order (minus the
            row's own penalty with a ``row_penalty``).
        episode_adv: float64, the episode term (A_E: R(tau) normalised within its episode group; HGPO: A_E when
            its episode term is on, else 0).
        step_adv: float64, the method's step term (GiGPO: A_S; HGPO: the weighted mean over history depths;
            GraphGPO: A_G; G2PO: A_1 + A_2).
        advantage: float64, the advantage the update uses (GiGPO: A_E + w A_S; see each estimator).
        anchor_group: int64, the anchor group (episode group, anchor key) of the row, numbered 0, 1, ... in order
            of first appearance among valid rows (-1 for masked rows): GiGPO's step group, HGPO's depth-1 group,
            GraphGPO's and G2PO's graph node.
        anchor_group_size: int64, number of valid rows in the row's anchor group (0 for masked rows).
        row_mask: bool, which rows took part (True) and which were ignored (False).
        episode_signal, step_signal: bool, the row's episode / step term carries signal into ``advantage``: the
            values the term normalises differ beyond rounding within the row's group
            (:func:`~verl_gigpo.advantage.differs_in_groups`, judged before normalising) and its weight is > 0.
            What dynamic sampling's ``signal`` filter reads.
        stats: diagnostics as plain floats: :data:`STAT_NAMES` and the method's own.
        method: the estimator that computed the terms: ``"gigpo"``, ``"hgpo"``, ``"graphgpo"`` or ``"g2po"``.
        extras: the per-row ``(N,)`` float64 values behind the method's step term (GraphGPO: ``distance``,
            ``next_distance``, ``graph_return``; G2PO: ``node_value``, ``next_value``; HGPO: ``depths_used``,
            ``deepest_depth``; GiGPO: none), 0 on masked rows.
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
        """Broadcast the per-row advantage and step return over the response tokens.

        Args:
            response_mask: ``(N, L)`` tensor (bool, int or float); its device is the output device.

        Returns:
            ``(advantages, returns)``, both float32 ``(N, L)``: ``A[:, None] * mask`` and ``R_t[:, None] * mask``.

        Raises:
            ValueError: a non-finite ``response_mask`` entry (NaN would pass into the loss), or an advantage or
                step return too large for float32 (|x| > 3.4e38).
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
    """The :class:`AdvantageTerms` of an estimator: its ``(M,)`` episode term, step term and advantage over the valid
    rows of ``base``, scattered to ``(N,)``, with :data:`STAT_NAMES` plus the method's own ``stats`` and ``(M,)``
    ``extras``. ``step_signal`` and ``episode_signal`` (None: ``base.episode_signal``) are ``(M,)`` bool.

    Raises:
        ValueError: a non-finite episode return, R_t or advantage (float64 overflow, see
            :func:`~verl_gigpo.advantage._rows.check_overflow`).
    """
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
    """The :data:`STAT_NAMES` diagnostics of one batch.

    Args:
        rows: the batch's valid rows.
        A_E, A_S: ``(M,)`` the episode and step terms of the valid rows.
        group_size: ``(S,)`` valid rows per anchor group.
        flat_episode_groups: ``(G,)`` episode groups whose returns are all equal.
    """
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
