"""GiGPO configuration: one validated dataclass, readable from a dict or an OmegaConf ``DictConfig``.

In verl's Hydra config these fields live under ``algorithm.gigpo``; :meth:`GiGPOConfig.from_mapping` reads that
node. :meth:`GiGPOConfig.advantage_terms` is the estimator as configured (similarity keys included), the one entry
the plug-in's estimator function, the ``gigpo_sync`` trainer mode and the local engine call;
:meth:`GiGPOConfig.estimator_kwargs` gives the exact-key options alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_gigpo.advantage import EPISODE_STATS, NORMS, GiGPOTerms, check_estimator_options, gigpo_advantage_terms
from verl_gigpo.anchors import check_similarity_threshold

__all__ = ["EPISODE_STATS", "NORMS", "STEP_CREDIT_ESTIMATORS", "GiGPOConfig", "group_size_warning"]

_HISTORY = re.compile(r"history:(\d+)")
_FIELD_MESSAGE = re.compile(r"(\w+)=")

#: ``algorithm.adv_estimator`` values with a step term (anchor-state groups inside an episode group)
STEP_CREDIT_ESTIMATORS = ("gigpo",)


@dataclass
class GiGPOConfig:
    """Hyper-parameters of the GiGPO advantage estimator and of anchor-state grouping.

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
            (observation texts grouped by similarity, see :mod:`verl_gigpo.anchors`). Default ``"observation"``.
        similarity_threshold: in (0, 1]; used only when ``key_mode == "similarity"``: observations whose 5-byte
            shingle sets have Dice similarity >= this are linked (1.0 = exact match). Default 0.9. (The
            reference code's optional similarity mode uses a different measure, difflib's ratio, with 0.95.)
    """

    gamma: float = 0.95
    step_advantage_w: float = 1.0
    norm: str = "mean_std"
    epsilon: float = 1e-6
    episode_stats: str = "trajectory"
    key_mode: str = "observation"
    similarity_threshold: float = 0.9

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
            raise ValueError(
                f"key_mode={self.key_mode!r} is not valid; use 'observation' (observation text, as in the paper), "
                "'state' (the environment's true state), 'history:K' (state plus the last K actions, e.g. "
                "'history:2') or 'similarity' (observation texts grouped by similarity_threshold)"
            )
        self.similarity_threshold = check_similarity_threshold(self.similarity_threshold)  # the estimator's check

    @classmethod
    def from_mapping(cls, mapping: Any) -> GiGPOConfig:
        """Build from a dict or an OmegaConf ``DictConfig`` (e.g. ``config.algorithm.gigpo``).

        Missing keys take their defaults; ``None`` is accepted as "not set". Interpolations are resolved.

        Raises:
            ValueError: on unknown keys (listing the known ones), a non-mapping, or invalid values.
        """
        if mapping is None:
            return cls()
        mapping = _as_mapping(mapping, "GiGPOConfig.from_mapping")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in mapping if k not in known)
        if unknown:
            raise ValueError(f"unknown GiGPO config key(s) {unknown}; known keys: {known}")
        return cls(**{k: v for k, v in mapping.items() if v is not None})

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> GiGPOConfig:
        """Build from verl's ``algorithm`` config section (a dict or ``DictConfig``, or None for the defaults):
        the ``algorithm.gigpo.*`` keys plus ``gamma = algorithm.gamma`` (the discount both engines share).

        Raises:
            ValueError: as :meth:`from_mapping`.
        """
        if algorithm is None:
            return cls()
        algorithm = _as_mapping(algorithm, "GiGPOConfig.from_algorithm")
        gigpo = dict(algorithm.get("gigpo") or {})
        if algorithm.get("gamma") is not None:
            gigpo["gamma"] = algorithm["gamma"]  # validated as every other gamma (no float(): True is not 1.0)
        try:
            return cls.from_mapping(gigpo)
        except ValueError as exc:
            raise ValueError(_algorithm_key_message(str(exc))) from None

    def advantage_terms(
        self,
        step_rewards: Any,
        response_mask: Any,
        group_ids: Any,
        traj_ids: Any,
        step_ids: Any,
        anchor_keys: Any,
        *,
        row_mask: Any = None,
    ) -> GiGPOTerms:
        """The GiGPO estimator with these settings: ``A = A_E + w * A_S`` per row, anchor keys merged by similarity
        when ``key_mode == "similarity"``.

        Exactly :func:`verl_gigpo.advantage.gigpo_advantage_terms` with :meth:`estimator_kwargs` and
        ``similarity_threshold = self.anchor_similarity_threshold``; ``terms.token_level(response_mask)`` gives what
        :func:`~verl_gigpo.advantage.compute_gigpo_advantage` returns, ``(advantages, returns)`` (N, L).

        Args:
            step_rewards: ``(N,)`` float tensor or array, the reward of each step row.
            response_mask: ``(N, L)`` tensor, 1 on response tokens (``(N, 1)`` ones when only per-row terms matter).
            group_ids, traj_ids: ``(N,)`` hashables, episode group (task) and trajectory of each row.
            step_ids: ``(N,)`` integers, step index inside the trajectory.
            anchor_keys: ``(N,)`` anchor keys from the environment; str observation texts when ``key_mode`` is
                ``"similarity"`` (environments built with :attr:`env_key_mode`).
            row_mask: optional ``(N,)`` bool; False marks padding rows and rows of failed episodes.

        Returns:
            :class:`~verl_gigpo.advantage.GiGPOTerms`, arrays ``(N,)`` and the ``gigpo/*`` stats.

        Raises:
            ValueError: malformed input, as :func:`~verl_gigpo.advantage.gigpo_advantage_terms` documents.
        """
        return gigpo_advantage_terms(
            step_rewards,
            response_mask,
            group_ids,
            traj_ids,
            step_ids,
            anchor_keys,
            row_mask=row_mask,
            similarity_threshold=self.anchor_similarity_threshold,
            **self.estimator_kwargs(),
        )

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
        :func:`verl_gigpo.anchors.anchor_group_ids`)."""
        return self.similarity_threshold if self.key_mode == "similarity" else None


def _algorithm_key_message(message: str) -> str:
    """A :class:`GiGPOConfig` error as the user typed the key in verl's config: ``step_advantage_w=-1 ...`` ->
    ``algorithm.gigpo.step_advantage_w=-1 ...``, ``gamma=...`` -> ``algorithm.gamma=...``."""
    if message.startswith("unknown GiGPO config key(s)"):
        return message.replace("unknown GiGPO config key(s)", "unknown algorithm.gigpo key(s)", 1)
    match = _FIELD_MESSAGE.match(message)
    if match is None or match.group(1) not in {f.name for f in dataclasses.fields(GiGPOConfig)}:
        return message
    field = match.group(1)
    return ("algorithm.gamma" if field == "gamma" else f"algorithm.gigpo.{field}") + message[len(field) :]


def group_size_warning(estimator: str, group_size: Any, *, step_advantage_w: Any = None) -> str | None:
    """The warning for episode groups of one trajectory (``actor_rollout_ref.rollout.n`` = 1), saying what the
    estimator then computes; None for groups of 2 or more (or a value the config checks reject). Both engines warn
    with it.

    * ``gigpo`` (:data:`STEP_CREDIT_ESTIMATORS`): the episode term is 0 (a one-member group); the step term still
      compares actions taken from an anchor state that the same episode revisits, 0 elsewhere; everything is 0
      when ``step_advantage_w`` is 0.
    * ``grpo``/``rloo`` (verl's ``core_algos``): a one-member group has mean 0 (and std 1), so the advantage is the
      episode's raw return, with no baseline.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size != 1:
        return None
    head = "actor_rollout_ref.rollout.n=1: every episode group holds one trajectory"
    if estimator in STEP_CREDIT_ESTIMATORS:
        if step_advantage_w == 0:
            return f"{head}, so the episode term is 0 and (algorithm.gigpo.step_advantage_w=0) every advantage is 0"
        return (
            f"{head}, so {estimator}'s episode term is 0 on every row; its step term compares only actions taken from "
            "an anchor state that the same episode revisits, and is 0 for every other step. Groups of several "
            "trajectories (the paper: rollout.n=8) give both terms"
        )
    if estimator in ("grpo", "rloo"):
        return (
            f"{head}: verl's {estimator} gives a one-member group mean 0, so each advantage is the episode's raw "
            "return, with no baseline; rollout.n >= 2 gives the group baseline"
        )
    return None


def _as_mapping(value: Any, caller: str) -> Mapping:
    """``value`` as a plain mapping (a ``DictConfig`` resolved to a dict); ValueError naming ``caller`` otherwise."""
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, Mapping):
        raise ValueError(f"{caller} needs a dict or DictConfig, got {type(value).__name__}")
    return value
