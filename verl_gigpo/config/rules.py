"""The configuration rules both engines check, each written once, with the key as the user types it.

A rule gives a message (or None) naming the key, the value, what is allowed and what to do; callers raise, collect
or log it. :data:`RANGES` holds every numeric and boolean key's :class:`Range`; the field helpers (:func:`number`,
:func:`whole`, :func:`flag`, :func:`choice`) declare a settings class's checks with its fields. Who calls the rules
and why they exist: docs/configuration.md#rules-checked-on-both-engines. Standard library only (environment worker
processes import it).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verl_gigpo import STEP_CREDIT_ESTIMATORS

__all__ = [
    "DEFAULT_GAMMA",
    "GREEDY_SAMPLING",
    "KeyValueError",
    "PENALTY_MODES",
    "RANGES",
    "SHARED_KEYS",
    "Range",
    "ValidationSampling",
    "bypass_mode_problem",
    "check_settings",
    "choice",
    "flag",
    "number",
    "whole",
    "estimator_problem",
    "group_size_warning",
    "kl_in_reward_problem",
    "penalty_mode",
    "training_sampling_problem",
    "validation_sampling",
]

_KINDS = ("bool", "int", "float")

#: ``algorithm.gamma``, the discount of the step return: the one default (the yaml files repeat it; a test checks)
DEFAULT_GAMMA = 0.95

#: values of ``env.invalid_action_penalty_mode`` (docs/configuration.md#rules-checked-on-both-engines)
PENALTY_MODES = ("reward", "reference")


class KeyValueError(ValueError):
    """A bad value of one config key: ``str()`` is ``"<key>=<value> <detail>"``. :meth:`under` names the key in its
    section (``gamma`` -> ``algorithm.gamma``) without reading the message text."""

    def __init__(self, key: str, value: Any, detail: str):
        super().__init__(f"{key}={_show(value)} {detail}")
        self.key, self.value, self.detail = key, value, detail

    def under(self, section: str, suffix: str = "") -> KeyValueError:
        """The same error with its key ``<section>.<key>`` (and ``suffix`` after the detail)."""
        return KeyValueError(f"{section}.{self.key}", self.value, self.detail + suffix)


@dataclass(frozen=True)
class Range:
    """The rule of one numeric or boolean config key: its type, allowed range and meaning.

    ``kind``: ``"bool"``, ``"int"`` (not a bool) or ``"float"`` (finite, not a bool; ints and numpy scalars pass).
    ``low``/``high`` None: unbounded; ``low_open``: strict lower bound; ``nullable``: None allowed.
    """

    key: str
    kind: str
    meaning: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    nullable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Range({self.key}).kind={self.kind!r}: use one of {list(_KINDS)}")

    @property
    def allowed(self) -> str:
        """The allowed values in words, e.g. ``"a whole number >= 1"``, ``"a number in (0, 1]"``."""
        if self.kind == "bool":
            text = "true or false"
        else:
            noun = "a whole number" if self.kind == "int" else "a finite number"
            lower = None if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
            if self.high is not None and self.low is not None:
                span = f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
                text = f"a whole number in {span}" if self.kind == "int" else f"a number in {span}"
            elif self.high is not None:
                text = f"{noun} <= {self.high:g}"
            else:
                text = f"{noun} {lower}" if lower else noun
        return f"{text} or null" if self.nullable else text

    def problem(self, value: Any, *, key: str | None = None) -> str | None:
        """None when ``value`` obeys the rule, else ``"<key>=<value> must be <allowed> (<meaning>)"``."""
        if value is None and self.nullable:
            return None
        if self._ok(value):
            return None
        return f"{key or self.key}={_show(value)} must be {self.allowed} ({self.meaning})"

    def check(self, value: Any, *, key: str | None = None) -> Any:
        """``value`` unchanged when it obeys the rule; else :class:`KeyValueError` with :meth:`problem`'s message."""
        if self.problem(value) is not None:
            raise KeyValueError(key or self.key, value, f"must be {self.allowed} ({self.meaning})")
        return value

    def _ok(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if self.kind == "int" else numbers.Real):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high


def _named(metadata: dict[str, Any], key: str | None) -> dict[str, Any]:
    return metadata if key is None else {**metadata, "key": key}


def number(default: Any, meaning: str, *, key: str | None = None, **bounds: Any) -> Any:
    """A dataclass field holding a finite number, with its :class:`Range` bounds; ``key``: its config key where it
    differs from the field's name."""
    return field(default=default, metadata=_named({"rule": Range("", "float", meaning, **bounds)}, key))


def whole(default: Any, meaning: str, *, key: str | None = None, **bounds: Any) -> Any:
    """A dataclass field holding a whole number (:func:`number`'s int counterpart)."""
    return field(default=default, metadata=_named({"rule": Range("", "int", meaning, **bounds)}, key))


def flag(default: bool, meaning: str, *, key: str | None = None) -> Any:
    """A dataclass field holding true or false."""
    return field(default=default, metadata=_named({"rule": Range("", "bool", meaning)}, key))


def choice(default: str, choices: Sequence[str], meaning: str, *, key: str | None = None) -> Any:
    """A dataclass field holding one of ``choices``."""
    return field(default=default, metadata=_named({"choices": tuple(choices), "meaning": meaning}, key))


def check_settings(settings: Any, section: str) -> None:
    """Check every field of ``settings`` that declares its rule; KeyValueError names ``<section>.<key>``."""
    for spec in fields(settings):
        key, value = f"{section}.{spec.metadata.get('key', spec.name)}", getattr(settings, spec.name)
        if "rule" in spec.metadata:
            spec.metadata["rule"].check(value, key=key)
        elif "choices" in spec.metadata and value not in spec.metadata["choices"]:
            allowed = f"one of {list(spec.metadata['choices'])}"
            raise KeyValueError(key, value, f"must be {allowed} ({spec.metadata['meaning']})")


def _show(value: Any) -> str:
    """repr of a value for a message, numpy scalars as the plain Python value (``0.5``, not ``np.float64(0.5)``)."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        value = value.item()
    return repr(value)


_RULES = (
    # ------------------------------------------------------------ both engines (SHARED_KEYS)
    Range("actor_rollout_ref.rollout.n", "int", "episodes per task: the group size; the paper uses 8", low=1),
    Range("algorithm.use_kl_in_reward", "bool", "KL penalty in the reward; see kl_in_reward_problem"),
    Range("env.max_steps", "int", "steps per episode", low=1),
    Range("env.history_length", "int", "past steps shown in the prompt; the paper uses 2", low=0),
    Range(
        "env.invalid_action_penalty",
        "float",
        "subtracted from the reward of a step whose reply holds no valid action; the paper uses 0.1",
        low=0,
    ),
    Range("data.max_prompt_length", "int", "prompt token budget", low=1),
    Range("actor_rollout_ref.rollout.response_length", "int", "generated tokens per step", low=1),
    # ------------------------------------------------------------ the local engine's other keys
    Range("actor_rollout_ref.rollout.temperature", "float", "sampling temperature", low=0),
    Range("actor_rollout_ref.rollout.top_p", "float", "nucleus sampling mass", low=0, high=1, low_open=True),
    Range("actor_rollout_ref.rollout.top_k", "int", "top-k sampling, -1 = off", low=-1),
    Range("actor_rollout_ref.rollout.val_kwargs.do_sample", "bool", "sample in validation"),
    Range("actor_rollout_ref.rollout.val_kwargs.temperature", "float", "validation temperature", low=0),
    Range(
        "actor_rollout_ref.rollout.val_kwargs.top_p", "float", "validation nucleus mass", low=0, high=1, low_open=True
    ),
    Range("actor_rollout_ref.rollout.val_kwargs.top_k", "int", "validation top-k, -1 = off", low=-1),
    Range("actor_rollout_ref.rollout.val_kwargs.n", "int", "validation episodes per task", low=1),
    Range("actor_rollout_ref.actor.optim.lr", "float", "learning rate", low=0, low_open=True),
    Range("actor_rollout_ref.actor.optim.weight_decay", "float", "AdamW weight decay", low=0),
    Range("actor_rollout_ref.actor.clip_ratio", "float", "PPO clip range", low=0, low_open=True),
    Range("actor_rollout_ref.actor.ppo_epochs", "int", "passes over each iteration's rows", low=1),
    Range("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "int", "sequences per micro-batch", low=1),
    Range("actor_rollout_ref.actor.grad_clip", "float", "gradient-norm clipping", low=0),
    Range("actor_rollout_ref.actor.use_kl_loss", "bool", "KL loss to the initial model"),
    Range("actor_rollout_ref.actor.kl_loss_coef", "float", "KL loss coefficient", low=0),
    Range("actor_rollout_ref.actor.entropy_coeff", "float", "entropy bonus coefficient"),
    Range("data.train_batch_size", "int", "tasks per iteration", low=1),
    Range("data.val_size", "int", "validation tasks, 0 = no validation", low=0),
    Range("algorithm.norm_adv_by_std_in_grpo", "bool", "GRPO: divide by the group std"),
    Range("trainer.total_training_steps", "int", "iterations", low=1),
    Range(
        "trainer.total_training_episodes",
        "int",
        "training episodes to stop after, null = iterations only",
        low=1,
        nullable=True,
    ),
    Range("trainer.test_freq", "int", "validate every N iterations; <= 0: start and end only"),
    Range("trainer.save_freq", "int", "checkpoint every N iterations; <= 0: after the last only"),
    Range("trainer.seed", "int", "seed of the run", low=0),
    Range("trainer.resume", "bool", "continue the run in the folder"),
    Range("trainer.overwrite", "bool", "delete the run in the folder first"),
    Range("trainer.allow_config_change", "bool", "resume with a changed config"),
)

#: config key -> its :class:`Range`: the numeric and boolean keys no settings class declares on its fields
RANGES: dict[str, Range] = {rule.key: rule for rule in _RULES}

#: the keys of :data:`RANGES` that verl's preflight checks too (the lengths: through ``EpisodeConfig``)
SHARED_KEYS = (
    "actor_rollout_ref.rollout.n",
    "algorithm.use_kl_in_reward",
    "env.max_steps",
    "env.history_length",
    "env.invalid_action_penalty",
)


def penalty_mode(env: Any) -> str:
    """``env.invalid_action_penalty_mode`` of an ``env`` section (missing: ``"reward"``); ValueError names it."""
    mode = env.get("invalid_action_penalty_mode", None) if env is not None else None
    if mode is None:
        return "reward"
    if mode not in PENALTY_MODES:
        raise ValueError(
            f"env.invalid_action_penalty_mode={mode!r} must be 'reward' (the penalty is part of the step reward, "
            "discounted into earlier steps and summed into the episode return) or 'reference' (the reference "
            "implementation's placement: subtracted from the invalid row's own step return and episode score)"
        )
    return mode


def kl_in_reward_problem(use_kl_in_reward: Any, estimator: Any, *, local_engine: bool = False) -> str | None:
    """The rule of ``algorithm.use_kl_in_reward`` for ``estimator``: None when it may be set, else the message."""
    if not use_kl_in_reward:
        return None
    instead = (
        "set algorithm.use_kl_in_reward=false and use the KL loss instead: actor_rollout_ref.actor.use_kl_loss=true "
        "(strength actor_rollout_ref.actor.kl_loss_coef)"
    )
    if estimator in STEP_CREDIT_ESTIMATORS:
        return (
            f"algorithm.use_kl_in_reward={use_kl_in_reward!r} is not supported with algorithm.adv_estimator="
            f"{estimator}: its rewards are per environment step, not per token; {instead}"
        )
    if local_engine:
        return (
            f"algorithm.use_kl_in_reward={use_kl_in_reward!r}: the local engine puts no KL penalty into rewards; "
            f"{instead}"
        )
    return None


def bypass_mode_problem(bypass_mode: Any, calculate_log_probs: Any) -> str | None:
    """The rule of ``algorithm.rollout_correction.bypass_mode`` (needs ``calculate_log_probs``): None or the message."""
    if not bypass_mode or calculate_log_probs:
        return None
    return (
        "algorithm.rollout_correction.bypass_mode=true uses the rollout's log-probs as the old log-probs, but "
        "actor_rollout_ref.rollout.calculate_log_probs=false means the rollout returns none: set "
        "calculate_log_probs=true, or bypass_mode=false to recompute them with the actor"
    )


def estimator_problem(estimator: Any, known: Sequence[str], *, engine: str) -> str | None:
    """The rule of ``algorithm.adv_estimator``: None when it is one of ``known`` (``engine``'s), else the message."""
    if isinstance(estimator, str) and estimator in known:
        return None
    return f"algorithm.adv_estimator={estimator!r} is not an advantage estimator of {engine}; use one of {list(known)}"


def group_size_warning(estimator: str, group_size: Any, *, step_advantage_w: Any = None) -> str | None:
    """The warning for ``actor_rollout_ref.rollout.n=1``, saying what ``estimator`` then computes; None otherwise."""
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


#: greedy decoding as verl sets it for its own greedy requests (``apply_greedy_sampling_params`` in
#: ``verl.trainer.ppo.v1.agent_loop_tq``): temperature 0 is vLLM's greedy path and the local server's argmax
#: (:mod:`verl_gigpo.local.sampling`); top-p and top-k are off
GREEDY_SAMPLING: dict[str, float | int] = {"temperature": 0.0, "top_p": 1.0, "top_k": -1}


def training_sampling_problem(do_sample: Any, temperature: Any) -> str | None:
    """The rule that training rollouts sample (``actor_rollout_ref.rollout.do_sample``, ``temperature`` > 0): None
    when they do, else the message."""
    instead = "greedy validation is actor_rollout_ref.rollout.val_kwargs.do_sample=false"
    if do_sample is False:
        return (
            "actor_rollout_ref.rollout.do_sample=false asks for greedy training rollouts, which make every episode of "
            f"a group identical (every group advantage 0); set it to true (the default); {instead}"
        )
    if temperature == 0 and not isinstance(temperature, bool):
        return (
            "actor_rollout_ref.rollout.temperature=0 makes every episode of a group identical (nothing to compare); "
            f"use a temperature > 0 for training; {instead}"
        )
    return None


@dataclass(frozen=True)
class ValidationSampling:
    """What validation decodes with; ``ignored``: the ``val_kwargs`` greedy decoding overrides (``name=value``)."""

    temperature: float
    top_p: float
    top_k: int
    greedy: bool
    ignored: tuple[str, ...] = ()

    @property
    def params(self) -> dict[str, float | int]:
        """``{"temperature", "top_p", "top_k"}``, the keys of verl's ``val_kwargs`` and of vLLM's sampling params."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    @property
    def message(self) -> str | None:
        """The line to log when validation is greedy (naming what it ignores), else None."""
        if not self.greedy:
            return None
        line = (
            "validation decodes greedily (actor_rollout_ref.rollout.val_kwargs.do_sample=false): temperature 0, "
            "top_p 1, top_k -1"
        )
        if self.ignored:
            line += (
                f"; val_kwargs {', '.join(self.ignored)} ignored (greedy); set val_kwargs.do_sample=true to sample "
                "with them"
            )
        return line


def validation_sampling(val_kwargs: Mapping[str, Any]) -> ValidationSampling:
    """What validation decodes with, from ``val_kwargs``: its own numbers (defaults 1.0, 1.0, -1), or
    :data:`GREEDY_SAMPLING` when ``do_sample`` is false."""
    own = {
        "temperature": val_kwargs.get("temperature", 1.0),
        "top_p": val_kwargs.get("top_p", 1.0),
        "top_k": val_kwargs.get("top_k", -1),
    }
    if val_kwargs.get("do_sample", True):
        return ValidationSampling(**own, greedy=False)
    neutral = {"temperature": (0,), "top_p": (1,), "top_k": (-1, 0)}  # values greedy decoding does not override
    ignored = tuple(f"{name}={value!r}" for name, value in own.items() if value not in neutral[name])
    return ValidationSampling(**GREEDY_SAMPLING, greedy=True, ignored=ignored)
