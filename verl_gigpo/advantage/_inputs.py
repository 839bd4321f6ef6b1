"""Reading the estimators' options and per-row arrays, each checked with an error naming the argument, row and fix."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from verl_gigpo.advantage._ids import as_id_array, show
from verl_gigpo.config.rules import KeyValueError, Range

__all__ = [
    "EPISODE_STATS",
    "NORMS",
    "MethodOptions",
    "as_flags",
    "as_response_mask",
    "as_rewards",
    "as_row_mask",
    "as_row_penalty",
    "as_step_ids",
    "check_common_options",
    "check_number",
    "invalid_row_penalty",
    "is_real",
]

NORMS = ("mean_std", "mean")
"""Valid ``norm`` values: ``"mean_std"`` = (x - mean) / (std + eps); ``"mean"`` = x - mean."""

EPISODE_STATS = ("trajectory", "step")
"""Valid ``episode_stats`` values: statistics over trajectories (paper Eq. 3) or over step rows (reference)."""


# ---------------------------------------------------------------------------------------------------- options
def is_real(x: Any) -> bool:
    """A real number that is not a bool (True is not 1.0 here)."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def check_common_options(*, gamma: Any, norm: Any, epsilon: Any, episode_stats: Any) -> dict[str, Any]:
    """Check the shared options (``norm``, ``episode_stats``, ``gamma`` in [0, 1], ``epsilon`` > 0); floats back."""
    if norm not in NORMS:
        hints = {
            "mean_norm": " (the reference code's mode='mean_norm' meant 'mean')",
            "mean_std_norm": " (the reference code's 'mean_std_norm' is 'mean_std')",
        }
        hint = hints.get(norm, "") if isinstance(norm, str) else ""
        raise KeyValueError(
            "norm",
            norm,
            f"is not a norm{hint}; use 'mean_std' (subtract the group mean, divide by std + epsilon) "
            "or 'mean' (only subtract the group mean)",
        )
    if episode_stats not in EPISODE_STATS:
        raise KeyValueError(
            "episode_stats",
            episode_stats,
            "is not valid; use 'trajectory' (each trajectory counts once, paper "
            "Eq. 3) or 'step' (every step row counts, as the reference code does)",
        )
    why = "the paper uses 0.95; 1.0 = no discount, 0 = each step's own reward"
    gamma = check_number("gamma", gamma, low=0.0, high=1.0, why=why)
    epsilon = check_number("epsilon", epsilon, low=0.0, low_open=True, why="e.g. 1e-6")
    return {"gamma": gamma, "norm": norm, "epsilon": epsilon, "episode_stats": episode_stats}


def check_number(
    key: str, value: Any, *, low: float, high: float = math.inf, low_open: bool = False, why: str
) -> float:
    """``value`` as a float when it is a real number in [low, high] (``low_open``: (low, high]); else one error."""
    Range(key, "float", why, low=low, high=None if high == math.inf else high, low_open=low_open).check(value)
    return float(value)


class MethodOptions:
    """Base of an estimator's frozen options dataclass: ``_check`` validates every field at construction."""

    _check: Any = None

    def __post_init__(self) -> None:
        for key, value in type(self)._check(**self.kwargs()).items():
            object.__setattr__(self, key, value)  # frozen: the validated value replaces the given one

    def kwargs(self) -> dict[str, Any]:
        """The options as the keyword arguments of the method's terms function."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ---------------------------------------------------------------------------------------------------- inputs
def _float64(values: Any, name: str) -> np.ndarray:
    """``values`` (tensor or array-like) as a float64 array; complex tensors and unconvertible values refused."""
    if isinstance(values, torch.Tensor):
        if values.is_complex():
            raise ValueError(f"{name} must be a real tensor, got a complex one")
        return values.detach().to(device="cpu", dtype=torch.float64).numpy()
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a (N,) float array or tensor; could not convert it: {err}") from err


def as_rewards(step_rewards: Any) -> np.ndarray:
    """``step_rewards`` as a ``(N,)`` float64 array (tensor or array-like; complex and multi-dimensional refused)."""
    arr = _float64(step_rewards, "step_rewards")
    if arr.ndim != 1:
        raise ValueError(
            f"step_rewards must be 1-D (N,), one reward per step row; got shape {tuple(arr.shape)} "
            "(sum or squeeze token-level rewards first)"
        )
    return arr


def as_response_mask(response_mask: Any, n: int) -> torch.Tensor:
    """``response_mask`` as a 2-D ``(N, L)`` tensor with one row per step row."""
    mask = response_mask if isinstance(response_mask, torch.Tensor) else torch.as_tensor(np.asarray(response_mask))
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be 2-D (N, L); got shape {tuple(mask.shape)}")
    if mask.shape[0] != n:
        raise ValueError(
            f"length mismatch: response_mask has {mask.shape[0]} rows but step_rewards has {n}; "
            "pass one row per step row"
        )
    return mask


def as_row_mask(row_mask: Any, n: int) -> np.ndarray:
    """``row_mask`` as a ``(N,)`` bool array (all True when None); only bool dtypes are accepted."""
    if row_mask is None:
        return np.ones(n, dtype=bool)
    if isinstance(row_mask, torch.Tensor):
        if row_mask.dtype != torch.bool:
            raise ValueError(f"row_mask must be a bool tensor/array, got dtype {row_mask.dtype}; use mask.bool()")
        arr = row_mask.detach().cpu().numpy()
    elif isinstance(row_mask, np.ndarray):
        if row_mask.dtype != np.bool_:
            raise ValueError(
                f"row_mask must be a bool array, got dtype {row_mask.dtype}; use row_mask.astype(bool) "
                "(True = real row, False = padding/duplicate)"
            )
        arr = row_mask
    else:
        raise ValueError(f"row_mask must be a bool np.ndarray or torch.Tensor of shape (N,), got {type(row_mask)}")
    if arr.shape != (n,):
        raise ValueError(f"row_mask must have shape ({n},) like step_rewards; got shape {tuple(arr.shape)}")
    return arr.copy()


def as_row_penalty(row_penalty: Any, n: int) -> np.ndarray:
    """``row_penalty`` as a (N,) float64 array of finite numbers."""
    arr = _float64(row_penalty, "row_penalty")
    if arr.shape != (n,):
        raise ValueError(f"row_penalty must have shape ({n},) like step_rewards, one penalty per row; got {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"row_penalty[{int(bad[0])}] = {show(arr[bad[0]])} is not a finite number")
    return arr


def invalid_row_penalty(action_valid: Any, penalty: float, n: int) -> np.ndarray:
    """Reference placement of the invalid-action penalty: (N,) float64 ``p_t = penalty * (1 - valid_t)``."""
    valid = as_flags(action_valid, "action_valid", n, needed_by="the reference placement of the invalid-action penalty")
    return np.where(valid, 0.0, float(penalty))


def as_flags(values: Any, name: str, n: int, *, needed_by: str) -> np.ndarray:
    """A per-row flag (``won``, ``action_valid``) as a (N,) bool array: booleans, or numbers 0 or 1."""
    if values is None:
        raise ValueError(f"{needed_by} needs {name}: one bool per step row ({name}[i] of the row's trajectory step)")
    arr = as_id_array(values, name, n)
    if arr.dtype == np.bool_:
        return arr.astype(bool, copy=True)
    items = arr.tolist()
    bad = [i for i, v in enumerate(items) if v not in (0, 1)]  # NaN, None and text are none of them
    if bad:
        i = bad[0]
        raise ValueError(f"{name}[{i}] = {show(arr[i])} is not a bool; {name} holds True/False (or 1/0) per row")
    return np.fromiter((bool(v) for v in items), dtype=bool, count=n)


def as_step_ids(steps: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Step ids as int64, exactly: whole numbers within int64 (larger ones would wrap and reverse the order)."""
    kind = steps.dtype.kind
    limit = 2**63
    if kind == "i":
        return steps.astype(np.int64, copy=False)
    if kind == "u":
        big = np.flatnonzero(steps >= np.uint64(limit)) if steps.dtype.itemsize == 8 else np.zeros(0, np.int64)
        if big.size:
            _raise_step_range(steps, rows, int(big[0]))
        return steps.astype(np.int64)
    if kind not in "fO":
        raise ValueError(f"step_ids must be integers, got dtype {steps.dtype}; pass an integer array")
    if kind == "O" and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in steps.tolist()):
        big = [k for k, v in enumerate(steps.tolist()) if not -limit <= int(v) < limit]
        if big:
            _raise_step_range(steps, rows, big[0])
        return steps.astype(np.int64)  # exact for Python ints (no detour through float64)
    try:
        f = steps.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"step_ids must be integers; could not read them as numbers: {err}") from err
    bad = np.flatnonzero(~np.isfinite(f) | (f != np.round(f)))
    if bad.size:
        i = int(rows[bad[0]])
        raise ValueError(f"step_ids must be integers; step_ids[{i}] = {show(steps[bad[0]])} is not a whole number")
    big = np.flatnonzero((f >= float(limit)) | (f < -float(limit)))
    if big.size:
        _raise_step_range(steps, rows, int(big[0]))
    return f.astype(np.int64)


def _raise_step_range(steps: np.ndarray, rows: np.ndarray, k: int) -> None:
    raise ValueError(
        f"step_ids[{int(rows[k])}] = {show(steps[k])} is outside the int64 range [-2^63, 2^63); step ids number "
        "the steps of a trajectory (0, 1, 2, ...): pass the step index, not a timestamp or a hash"
    )
