"""Step-credit configuration: one validated dataclass that knows the method, readable from a dict or a ``DictConfig``.

    cfg = GiGPOConfig.from_algorithm(config.algorithm, env=config.env)   # every sub-section checked, keys named
    terms = cfg.estimate(rows)                                            # the configured estimator

The keys (``algorithm.gamma``, ``algorithm.gigpo.*``, ``algorithm.{hgpo,graphgpo,g2po}.*``): docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.advantage import (
    EPISODE_STATS,
    ESTIMATORS,
    NORMS,
    AdvantageTerms,
    CommonOptions,
    G2POOptions,
    GiGPOOptions,
    GraphGPOOptions,
    HGPOOptions,
    StepRows,
    check_estimator_options,
    invalid_row_penalty,
)
from verl_gigpo.advantage.anchors import check_similarity_grouping, check_similarity_threshold, first_fit_anchor_ids
from verl_gigpo.config.rules import (  # group_size_warning: both engines give it
    RANGES,
    KeyValueError,
    group_size_warning,
    penalty_mode,
)

__all__ = ["EPISODE_STATS", "METHOD_OPTIONS", "NORMS", "STEP_CREDIT_ESTIMATORS", "GiGPOConfig", "group_size_warning"]

_HISTORY = re.compile(r"history:(\d+)")

#: the successors' option sections: ``algorithm.<name>`` -> the options class that validates it
METHOD_OPTIONS: dict[str, type] = {"hgpo": HGPOOptions, "graphgpo": GraphGPOOptions, "g2po": G2POOptions}

#: successor option -> the ``env`` key it takes when it is null (see :meth:`GiGPOConfig.from_algorithm`)
_FROM_ENV = {
    "hgpo": {"history_length": "history_length"},
    "graphgpo": {},
    "g2po": {"invalid_penalty": "invalid_action_penalty"},
}

#: the keys of the ``algorithm.gigpo`` section (and ``gamma``, which :meth:`GiGPOConfig.from_algorithm` takes from
#: ``algorithm.gamma``)
_GIGPO_KEYS = (
    "gamma",
    "step_advantage_w",
    "norm",
    "epsilon",
    "episode_stats",
    "key_mode",
    "similarity_threshold",
    "similarity_grouping",
)


@dataclass
class GiGPOConfig:
    """Hyper-parameters of the step-credit estimator (``method``: GiGPO or a successor) and of anchor grouping.

    ``R_t = sum_{k>=t} gamma^(k-t) r_k``; ``A = A_episode + step_advantage_w * A_step`` (GiGPO). Fields are the keys
    of docs/configuration.md: ``algorithm.gamma``, ``algorithm.gigpo.*``, ``algorithm.{hgpo,graphgpo,g2po}``, and
    ``penalty_mode`` / ``invalid_action_penalty`` from ``env.invalid_action_penalty_mode`` / ``_penalty``.
    """

    gamma: float = CommonOptions.gamma
    step_advantage_w: float = GiGPOOptions.step_advantage_w
    norm: str = CommonOptions.norm
    epsilon: float = CommonOptions.epsilon
    episode_stats: str = CommonOptions.episode_stats
    key_mode: str = "observation"
    similarity_threshold: float = 0.9
    similarity_grouping: str = "dice_components"
    method: str = "gigpo"
    penalty_mode: str = "reward"
    invalid_action_penalty: float = 0.1
    hgpo: HGPOOptions = field(default_factory=HGPOOptions)
    graphgpo: GraphGPOOptions = field(default_factory=GraphGPOOptions)
    g2po: G2POOptions = field(default_factory=G2POOptions)

    def __post_init__(self) -> None:
        options = check_estimator_options(
            gamma=self.gamma,
            step_advantage_w=self.step_advantage_w,
            norm=self.norm,
            epsilon=self.epsilon,
            episode_stats=self.episode_stats,
        )  # the estimator's own check: one set of rules for both
        self.gamma, self.step_advantage_w, self.epsilon = (
            options["gamma"],
            options["step_advantage_w"],
            options["epsilon"],
        )
        if not isinstance(self.key_mode, str) or not (
            self.key_mode in ("observation", "state", "similarity") or _HISTORY.fullmatch(self.key_mode)
        ):
            raise KeyValueError(
                "key_mode",
                self.key_mode,
                "is not valid; use 'observation' (observation text, as in the paper), "
                "'state' (the environment's true state), 'history:K' (state plus the last K actions, e.g. "
                "'history:2') or 'similarity' (observation texts grouped by similarity_threshold)",
            )
        self.similarity_threshold = check_similarity_threshold(self.similarity_threshold)  # the estimator's check
        self.similarity_grouping = check_similarity_grouping(self.similarity_grouping)
        if self.method not in STEP_CREDIT_ESTIMATORS:
            raise ValueError(
                f"method={self.method!r} is not a step-credit estimator; use one of {list(STEP_CREDIT_ESTIMATORS)}"
            )
        for name, kind in METHOD_OPTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"GiGPOConfig.{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        self.penalty_mode = penalty_mode({"invalid_action_penalty_mode": self.penalty_mode})
        RANGES["env.invalid_action_penalty"].check(self.invalid_action_penalty)
        if self.penalty_mode == "reference" and self.episode_stats != "step":
            raise ValueError(
                f"env.invalid_action_penalty_mode=reference needs algorithm.gigpo.episode_stats=step, got "
                f"{self.episode_stats!r}: the reference implementation scores each step row by its episode's reward "
                "minus that row's own penalty, and normalises those scores over the group's step rows (set both, as "
                "the paper recipes do, or use env.invalid_action_penalty_mode=reward)"
            )

    @classmethod
    def from_mapping(cls, mapping: Any, *, section: str = "GiGPO config") -> GiGPOConfig:
        """Build from ``algorithm.gigpo`` (a dict or ``DictConfig``; missing or None: the default).

        Raises ValueError on unknown keys (named under ``section``), a non-mapping or a bad value.
        """
        if mapping is None:
            return cls()
        mapping = _as_mapping(mapping, "GiGPOConfig.from_mapping")
        known = list(_GIGPO_KEYS)
        unknown = sorted(str(k) for k in mapping if k not in known)
        if unknown:
            raise ValueError(f"unknown {section} key(s) {unknown}; known keys: {known}")
        return cls(**{k: v for k, v in mapping.items() if v is not None})

    @classmethod
    def from_algorithm(cls, algorithm: Any, *, method: str | None = None, env: Any = None) -> GiGPOConfig:
        """Build from verl's ``algorithm`` section (None: defaults), every successor's section checked.

        ``method`` defaults to ``algorithm.adv_estimator`` when it is a step-credit estimator, else ``"gigpo"``.
        Null ``algorithm.hgpo.history_length`` and ``algorithm.g2po.invalid_penalty`` take ``env``'s
        ``history_length`` and ``invalid_action_penalty``. Raises ValueError naming ``algorithm.<section>.<key>``.
        """
        if algorithm is None:
            algorithm = {}
        algorithm = _as_mapping(algorithm, "GiGPOConfig.from_algorithm")
        gigpo = dict(algorithm.get("gigpo") or {})
        if algorithm.get("gamma") is not None:
            gigpo["gamma"] = algorithm["gamma"]  # validated as every other gamma (no float(): True is not 1.0)
        if method is None:
            estimator = algorithm.get("adv_estimator")
            method = estimator if estimator in STEP_CREDIT_ESTIMATORS else "gigpo"
        env = {} if env is None else _as_mapping(env, "GiGPOConfig.from_algorithm(env=...)")
        for key in {e for keys in _FROM_ENV.values() for e in keys.values()}:
            if (
                env.get(key) is not None
            ):  # a bad env value is named as the env key, by its rule (verl_gigpo.config.rules)
                RANGES[f"env.{key}"].check(env[key])
        sections = {
            name: _method_options(name, kind, algorithm.get(name), {k: env.get(e) for k, e in _FROM_ENV[name].items()})
            for name, kind in METHOD_OPTIONS.items()
        }
        try:
            base = cls.from_mapping(gigpo, section="algorithm.gigpo")
        except KeyValueError as exc:  # a field of the section: named as the user types it (gamma: algorithm.gamma)
            if exc.key not in _GIGPO_KEYS:
                raise
            raise exc.under("algorithm" if exc.key == "gamma" else "algorithm.gigpo") from None
        accounting: dict[str, Any] = {}
        mode = penalty_mode(env)  # checked for every estimator
        if algorithm.get("adv_estimator") in (None, *STEP_CREDIT_ESTIMATORS):
            accounting["penalty_mode"] = mode
        if env.get("invalid_action_penalty") is not None:
            accounting["invalid_action_penalty"] = env["invalid_action_penalty"]
        return dataclasses.replace(base, method=method, **sections, **accounting)

    def advantage_terms(self, *inputs: Any, env_rewards: Any = None, **fields: Any) -> AdvantageTerms:
        """:meth:`estimate` called with arrays: ``(step_rewards, response_mask, group_ids, traj_ids, step_ids,
        anchor_keys, *, row_mask=None, won=None, action_valid=None, env_rewards=None)`` (the
        :class:`~verl_gigpo.advantage.StepRows` fields)."""
        return self.estimate(StepRows(*inputs, **fields), env_rewards=env_rewards)

    def estimate(self, rows: StepRows, *, env_rewards: Any = None) -> AdvantageTerms:
        """The configured estimator on ``rows`` (N rows): similarity keys merged, the penalty placed by
        :attr:`penalty_mode` (``"reference"`` needs ``env_rewards`` (N,) and ``rows.action_valid``).

        ``terms.token_level(response_mask)`` gives ``(advantages, returns)`` (N, L). Raises ValueError on bad input.
        """
        if self.penalty_mode == "reference":
            if env_rewards is None or rows.action_valid is None:
                raise ValueError(
                    "env.invalid_action_penalty_mode=reference needs each row's env_rewards (the environment's reward "
                    "without the penalty) and action_valid; pass both (StepBatch.advantage_terms does)"
                )
            penalty = invalid_row_penalty(rows.action_valid, self.invalid_action_penalty, len(env_rewards))
            rows = dataclasses.replace(rows, step_rewards=env_rewards, row_penalty=penalty)
        threshold = self.anchor_similarity_threshold
        if threshold is not None and self.similarity_grouping == "difflib_first_fit":
            keys = first_fit_anchor_ids(rows.anchor_keys, rows.group_ids, threshold, row_mask=rows.row_mask)
            rows, threshold = dataclasses.replace(rows, anchor_keys=keys), None
        common = CommonOptions(
            gamma=self.gamma,
            norm=self.norm,
            epsilon=self.epsilon,
            episode_stats=self.episode_stats,
            similarity_threshold=threshold,
        )
        spec = ESTIMATORS[self.method]
        gigpo = self.method == "gigpo"
        options = GiGPOOptions(step_advantage_w=self.step_advantage_w) if gigpo else getattr(self, self.method)
        return spec.terms(rows, options, common)

    def estimator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`verl_gigpo.advantage.compute_gigpo_advantage` with exact anchor keys."""
        return {
            "gamma": self.gamma,
            "step_advantage_w": self.step_advantage_w,
            "norm": self.norm,
            "epsilon": self.epsilon,
            "episode_stats": self.episode_stats,
        }

    @property
    def env_key_mode(self) -> str:
        """The ``key_mode`` environments are built with (``"observation"`` for ``"similarity"``)."""
        return "observation" if self.key_mode == "similarity" else self.key_mode

    @property
    def anchor_similarity_threshold(self) -> float | None:
        """``similarity_threshold`` when ``key_mode == "similarity"``, else None (exact keys)."""
        return self.similarity_threshold if self.key_mode == "similarity" else None


def _method_options(name: str, kind: type, section: Any, inherited: dict[str, Any]) -> Any:
    """``algorithm.<name>`` as a validated ``kind``; nulls take ``inherited`` or the default."""
    section = {} if section is None else _as_mapping(section, f"algorithm.{name}")
    known = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(str(k) for k in section if k not in known)
    if unknown:
        raise ValueError(f"unknown algorithm.{name} key(s) {unknown}; known keys: {known}")
    values = {k: v for k, v in inherited.items() if v is not None}
    values.update({k: v for k, v in section.items() if v is not None})
    try:
        return kind(**values)
    except KeyValueError as exc:  # the options' checks name their field: named here in its section
        source = f" (from env.{_FROM_ENV[name][exc.key]})" if exc.key in inherited else ""
        raise exc.under(f"algorithm.{name}", source) from exc


def _as_mapping(value: Any, caller: str) -> Mapping:
    """``value`` as a plain mapping (a ``DictConfig`` resolved to a dict); ValueError naming ``caller`` otherwise."""
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping):
        raise ValueError(f"{caller} needs a dict or DictConfig, got {type(value).__name__}")
    return value
