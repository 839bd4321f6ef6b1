"""Id arrays: the one place that reads and checks ids and keys and turns them into integer codes.

Shared by the estimators and anchor grouping, so both accept the same inputs and word their errors alike; the rules
are in docs/adding-an-estimator.md, "The shared row helpers". Imports no torch and no other part of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["as_id_array", "hashable", "id_codes", "pair_codes", "show"]


def as_id_array(values: Any, name: str, n: int | None = None, *, other: str = "step_rewards") -> np.ndarray:
    """``values`` (array, tensor or non-string sequence) as a 1-D (N,) array; ``n`` its expected length."""
    if isinstance(values, np.ndarray):
        arr = values
    elif callable(getattr(values, "detach", None)):  # a torch tensor (this module does not import torch)
        arr = values.detach().cpu().numpy()
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        arr = np.fromiter(values, dtype=object, count=len(values))  # keeps tuples whole
    else:
        raise ValueError(f"{name} must be a 1-D array or sequence (N,), got {type(values).__name__}")
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D with one entry per row; got shape {arr.shape}. For tuple keys build an object "
            "array: np.fromiter(keys, dtype=object, count=n)"
        )
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"length mismatch: {name} has {arr.shape[0]} entries but {other} has {n}")
    return arr


def id_codes(values: np.ndarray, name: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Codes (M,) int64 in [0, K), numbered by first appearance, equal exactly where the values are ``==``.

    Hash factorisation checked entry by entry, else ``pandas.factorize``; O(M). ``rows`` (M,) names rows in errors.
    """
    where = np.arange(values.shape[0]) if rows is None else rows
    if values.dtype == object and values.size:
        try:
            hashed = np.fromiter(map(hash, values), dtype=np.int64, count=values.shape[0])  # (M,)
        except TypeError:
            hashed = None  # an unhashable value: reported below
        if hashed is not None:
            codes, uniques = pd.factorize(hashed)
            first = np.empty(len(uniques), dtype=np.int64)  # (K,) one entry holding each code
            first[codes[::-1]] = np.arange(codes.shape[0])[::-1]
            try:
                exact = bool(np.all(values == values[first][codes])) and not pd.isna(values[first]).any()
            except TypeError:  # e.g. pd.NA, whose comparisons are not booleans
                exact = False
            if exact:
                return codes.astype(np.int64, copy=False)
    try:
        codes, _ = pd.factorize(values)
    except TypeError as err:
        bad = next((i for i, v in enumerate(values) if not hashable(v)), 0)
        raise ValueError(
            f"{name}[{int(where[bad])}] = {show(values[bad])} is not hashable ({err}); use str, int or tuple keys "
            "(e.g. tuple(key) for a list, key.tobytes() for an array)"
        ) from err
    missing = np.flatnonzero(codes < 0)
    if missing.size:
        i = int(where[missing[0]])
        raise ValueError(
            f"{name}[{i}] is missing ({show(values[missing[0]])}); every valid row needs an id (mark rows to leave "
            "out with row_mask=False)"
        )
    return codes.astype(np.int64, copy=False)


def pair_codes(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, int]:
    """``(codes (M,) int64, number of distinct pairs)`` of the pairs ``(first[i], second[i])`` of two code arrays."""
    if first.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    span = int(second.max()) + 1
    if (int(first.max()) + 1) * span >= 2**63:  # codes are < M, so this needs M > 3e9 rows
        raise ValueError(f"too many distinct ids to pair ({int(first.max()) + 1} x {span})")
    codes, uniques = pd.factorize(first * span + second)
    return codes.astype(np.int64, copy=False), len(uniques)


def show(value: Any) -> str:
    """repr of a value for error messages, numpy scalars shown as plain Python values."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def hashable(value: Any) -> bool:
    """Whether ``hash(value)`` works."""
    try:
        hash(value)
    except TypeError:
        return False
    return True
