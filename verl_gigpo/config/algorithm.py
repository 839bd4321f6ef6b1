"""Step-credit configuration: one validated dataclass that knows the method, readable from a dict or a ``DictConfig``.

In verl's Hydra config (and the local engine's) the method is ``algorithm.adv_estimator`` (gigpo, hgpo, graphgpo or
g2po); ``algorithm.gigpo`` holds GiGPO's step weight and the settings every method shares (norm, epsilon, episode
statistics, anchor keys), ``algorithm.gamma`` the discount, and ``algorithm.hgpo``, ``algorithm.graphgpo`` and
``algorithm.g2po`` each successor's own options. :meth:`GiGPOConfig.from_algorithm` reads that section (checking
every sub-section, errors naming the key), :meth:`GiGPOConfig.from_mapping` the ``algorithm.gigpo`` node alone.
:meth:`GiGPOConfig.advantage_terms` is the configured estimator (similarity keys included), the one entry the
plug-in's estimator functions, the ``gigpo_sync`` trainer mode and the local engine call;
:meth:`GiGPOConfig.estimator_kwargs` gives GiGPO's exact-key options alone.
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
    """Hyper-parameters of the step-credit estimator (GiGPO or a successor) and of anchor-state grouping.

    Attributes:
        gamma: discount in [0, 1] of the step return ``R_t = sum_{k>=t} gamma^(k-t) r_k`` that the step-level
            advantage compares (0: R_t = r_t). Paper: 0.95.
        step_advantage_w: weight w >= 0 of the step-level term in ``A = A_episode + w * A_step``; 0 gives the
            episode-level (GRPO-style) advantage alone. Paper: 1.0.
        norm: how both levels normalise within a group: ``"mean_std"`` = (x - mean) / (std + epsilon) with the
            unbiased std, ``"mean"`` = x - mean only. Paper: ``"mean_std"`` for ALFWorld, ``"mean"`` for WebShop.
        epsilon: > 0, added to the std in ``"mean_std"``. Default 1e-6 (as GRPO in verl).
        episode_stats: what the episode-level mean/std are taken over: ``"trajectory"`` (each trajectory once,
            the paper's Eq. 3) or ``"step"`` (every step row, so long trajectories weigh more, as the reference
            code does). Default ``"trajectory"``.
        key_mode: what makes two steps "the same state" (their anchor key): ``"observation"`` (the observation
            text, as in the paper), ``"state"`` (the environment's true state, where it exposes one),
            ``"history:K"`` (state plus the last K actions, e.g. ``"history:2"``), or ``"similarity"``
            (observation texts grouped by similarity, see :mod:`verl_gigpo.advantage.anchors`). Default
            ``"observation"``.
        similarity_threshold: in (0, 1]; used only when ``key_mode == "similarity"``: observations whose 5-byte
            shingle sets have Dice similarity >= this are linked (1.0 = exact match). Default 0.9. (The
            reference code's optional similarity mode uses a different measure, difflib's ratio, with 0.95.)
        similarity_grouping: how ``key_mode == "similarity"`` groups the texts
            (:data:`~verl_gigpo.advantage.anchors.SIMILARITY_GROUPINGS`): ``"dice_components"`` (default: connected
            components of shingle Dice >= threshold, order-independent) or ``"difflib_first_fit"`` (the reference's:
            difflib ratio against each cluster's first member, greedy in row order; order-dependent).
        method: the estimator these settings drive: ``"gigpo"`` (default), ``"hgpo"``, ``"graphgpo"`` or ``"g2po"``
            (:data:`verl_gigpo.STEP_CREDIT_ESTIMATORS`). gamma, norm, epsilon, episode_stats, key_mode and
            similarity_threshold apply to every method; step_advantage_w is GiGPO's.
        penalty_mode: where the invalid-action penalty enters the advantage (``env.invalid_action_penalty_mode``,
            :data:`~verl_gigpo.config.rules.PENALTY_MODES`): ``"reward"`` (default) takes the rows' step rewards
            as they are (the penalty already in r_t); ``"reference"`` takes the environment's rewards alone and passes
            each row's own penalty, ``invalid_action_penalty`` on a row without a valid action, as the estimator's
            ``row_penalty`` (the reference implementation's placement; needs ``episode_stats="step"``).
        invalid_action_penalty: the penalty of ``"reference"`` mode (``env.invalid_action_penalty``; paper 0.1).
        hgpo, graphgpo, g2po: each successor's own options (:class:`~verl_gigpo.advantage.HGPOOptions`,
            :class:`~verl_gigpo.advantage.GraphGPOOptions`, :class:`~verl_gigpo.advantage.G2POOptions`: the keys of
            ``algorithm.hgpo``, ``algorithm.graphgpo``, ``algorithm.g2po``), defaults the papers'.
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
        """Build from a dict or an OmegaConf ``DictConfig`` (e.g. ``config.algorithm.gigpo``).

        Missing keys take their defaults; ``None`` is accepted as "not set". Interpolations are resolved. ``section``
        names the mapping in the unknown-key message.

        Raises:
            ValueError: on unknown keys (listing the known ones), a non-mapping, or invalid values.
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
        """Build from verl's ``algorithm`` config section (a dict or ``DictConfig``, or None for the defaults):
        the ``algorithm.gigpo.*`` keys plus ``gamma = algorithm.gamma`` (the discount both engines share), and each
        successor's section ``algorithm.hgpo``, ``algorithm.graphgpo``, ``algorithm.g2po`` (all of them are
        checked, whichever method runs).

        Args:
            algorithm: the section.
            method: the estimator; default ``algorithm.adv_estimator`` when that names a step-credit estimator,
                else ``"gigpo"`` (e.g. ``grpo`` runs, whose config is only checked).
            env: the ``env`` section, or None: where ``algorithm.hgpo.history_length`` and
                ``algorithm.g2po.invalid_penalty`` are null (their defaults), they take ``env.history_length`` and
                ``env.invalid_action_penalty`` (the prompt's history and the environment's penalty, as the papers
                do); without ``env`` the papers' values, 2 and 0.1. :attr:`penalty_mode` and
                :attr:`invalid_action_penalty` come from ``env.invalid_action_penalty_mode`` and
                ``env.invalid_action_penalty`` (for an estimator that is not a step-credit one, e.g. ``grpo``, the
                mode is checked but kept at ``"reward"`` here: :func:`~verl_gigpo.advantage.outcome.
                outcome_advantages` reads it).

        Raises:
            ValueError: as :meth:`from_mapping`; an unknown key or a bad value in a successor's section, named
                ``algorithm.<method>.<key>``.
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
        """The configured estimator (:attr:`method`, :data:`verl_gigpo.advantage.ESTIMATORS`) on ``rows`` with these
        settings: anchor keys merged by similarity when ``key_mode == "similarity"`` (``difflib_first_fit`` turns the
        keys into cluster ids here, in the rows' order) and the invalid-action penalty placed by :attr:`penalty_mode`
        (``"reference"``: ``env_rewards`` ``(N,)``, the environment's rewards without the penalty, replace the step
        rewards, and ``rows.action_valid`` gives each row's penalty). ``terms.token_level(response_mask)`` gives the
        ``(advantages, returns)`` (N, L) the update uses.

        Raises:
            ValueError: malformed input, as the method's function documents; ``penalty_mode="reference"`` without
                ``env_rewards`` or ``action_valid``.
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
        """Keyword arguments for :func:`verl_gigpo.advantage.compute_gigpo_advantage` (and
        ``gigpo_advantage_terms``) with exact anchor keys: gamma, step_advantage_w, norm, epsilon, episode_stats.
        :meth:`advantage_terms` adds the similarity threshold of ``key_mode="similarity"``."""
        return {
            "gamma": self.gamma,
            "step_advantage_w": self.step_advantage_w,
            "norm": self.norm,
            "epsilon": self.epsilon,
            "episode_stats": self.episode_stats,
        }

    @property
    def env_key_mode(self) -> str:
        """The ``key_mode`` to build environments with: ``"observation"`` when grouping by similarity (the
        environment emits observation texts, the trainer groups them), else ``key_mode`` itself."""
        return "observation" if self.key_mode == "similarity" else self.key_mode

    @property
    def anchor_similarity_threshold(self) -> float | None:
        """``similarity_threshold`` when ``key_mode == "similarity"``, else None (exact keys): the
        ``similarity_threshold`` argument of :func:`verl_gigpo.advantage.gigpo_advantage_terms` (and of
        :func:`verl_gigpo.advantage.anchors.anchor_group_ids`)."""
        return self.similarity_threshold if self.key_mode == "similarity" else None


def _method_options(name: str, kind: type, section: Any, inherited: dict[str, Any]) -> Any:
    """``algorithm.<name>`` (a mapping, or None for the defaults) as a validated ``kind``; null values take
    ``inherited`` (an env value, when not None) or the default. Errors name the key."""
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
