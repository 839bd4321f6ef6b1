"""The one estimator interface: ``estimator(rows, options, common) -> AdvantageTerms`` (docs/adding-an-estimator.md)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from verl_gigpo.advantage._inputs import MethodOptions, check_common_options
from verl_gigpo.advantage.anchors import check_similarity_threshold
from verl_gigpo.config.rules import DEFAULT_GAMMA

__all__ = ["CommonOptions", "Estimator", "EstimatorSpec", "RowValues", "StepRows", "arrays_signature", "split_call"]

RowValues = np.ndarray | torch.Tensor | Sequence[Any]
"""One value per row: a ``(N,)`` array, tensor or sequence (ids may be any hashables)."""

Options = TypeVar("Options", bound=MethodOptions)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class StepRows:
    """One batch of N step rows, the input of every estimator (checked by the estimator, not here).

    Per row (N,): ``step_rewards`` (read as float64), ``group_ids``, ``traj_ids``, ``step_ids``, ``anchor_keys``;
    optional ``row_mask`` (bool; False: in no statistic), ``won``, ``action_valid``, ``row_penalty``.
    ``response_mask``: (N, L).
    """

    step_rewards: RowValues
    response_mask: torch.Tensor | np.ndarray
    group_ids: RowValues
    traj_ids: RowValues
    step_ids: RowValues
    anchor_keys: RowValues
    row_mask: np.ndarray | torch.Tensor | None = None
    won: RowValues | None = None
    action_valid: RowValues | None = None
    row_penalty: RowValues | None = None


@dataclass(frozen=True)
class CommonOptions:
    """The options every estimator shares, checked at construction: ``gamma``, ``norm``, ``epsilon``,
    ``episode_stats`` and ``similarity_threshold`` (None: exact anchor keys).
    """

    gamma: float = DEFAULT_GAMMA
    norm: str = "mean_std"
    epsilon: float = 1e-6
    episode_stats: str = "trajectory"
    similarity_threshold: float | None = None

    def __post_init__(self) -> None:
        checked = check_common_options(
            gamma=self.gamma, norm=self.norm, epsilon=self.epsilon, episode_stats=self.episode_stats
        )
        if self.similarity_threshold is not None:
            checked["similarity_threshold"] = check_similarity_threshold(self.similarity_threshold)
        for key, value in checked.items():
            object.__setattr__(self, key, value)


_ROW_KEYS = frozenset(f.name for f in dataclasses.fields(StepRows))
_COMMON_KEYS = frozenset(f.name for f in dataclasses.fields(CommonOptions))


def split_call(
    options_class: type[Options], inputs: tuple[Any, ...], kwargs: dict[str, Any], *, outcome: bool = False
) -> tuple[StepRows, Options, CommonOptions]:
    """An arrays-form call ``f(step_rewards, ..., anchor_keys, **keywords)`` as ``(rows, options, common)``."""
    rows_known = _ROW_KEYS if outcome else _ROW_KEYS - {"won", "action_valid"}
    known = rows_known | _COMMON_KEYS | {f.name for f in dataclasses.fields(options_class)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}; known: {sorted(known)}")
    options = options_class(**{k: v for k, v in kwargs.items() if k not in _ROW_KEYS | _COMMON_KEYS})
    common = CommonOptions(**{k: v for k, v in kwargs.items() if k in _COMMON_KEYS})
    rows = StepRows(*inputs, **{k: v for k, v in kwargs.items() if k in _ROW_KEYS})
    return rows, options, common


def arrays_signature(options_class: type[MethodOptions], *, outcome: bool = False) -> Callable[[F], F]:
    """Decorator: the arrays form's visible signature, built from the dataclasses (each default in one place)."""
    kw, positional = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    inputs = [inspect.Parameter(f.name, positional) for f in dataclasses.fields(StepRows)[:6]]
    rows = ["row_mask", *(["won", "action_valid"] if outcome else [])]
    params = [inspect.Parameter(name, kw, default=None) for name in rows]
    for cls in (CommonOptions, options_class):
        params += [inspect.Parameter(f.name, kw, default=f.default) for f in dataclasses.fields(cls)]
    params.append(inspect.Parameter("row_penalty", kw, default=None))

    def decorate(function: F) -> F:
        returns = inspect.signature(function).return_annotation
        function.__signature__ = inspect.Signature(inputs + params, return_annotation=returns)  # type: ignore[attr-defined]
        return function

    return decorate


Estimator = Callable[[StepRows, Any, CommonOptions], Any]
"""``estimator(rows, options, common) -> AdvantageTerms``."""


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator: its function, its options class and whether it reads ``won`` and ``action_valid``."""

    terms: Estimator
    options: type[MethodOptions]
    needs_outcome: bool = False
