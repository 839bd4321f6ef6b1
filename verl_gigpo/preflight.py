"""Driver-side checks of the composed Hydra config, run by ``python -m verl_gigpo.main`` before verl starts Ray.

verl reads ``algorithm.gigpo.*`` and ``env.*`` only inside its Ray actors (the trainer mode, the agent-loop
workers), so a typo there used to surface minutes after launch, deep in a Ray traceback, or never (a key added
with ``+`` that nothing reads). :func:`preflight` checks the whole GiGPO part of the config on the driver:

* the supported path: verl's V1 trainer (``trainer.use_v1=true``) with verl's own TransferQueue agent-loop
  manager, and ``trainer.v1.trainer_mode=gigpo_sync`` for ``adv_estimator=gigpo``;
* ``algorithm.gigpo.*`` through :meth:`GiGPOConfig.from_algorithm` and ``env.*`` through
  :func:`verl_gigpo.agent_loop.episode_config_from` — the readers the trainer mode and the agent loop use, so the
  messages are the ones those components would give later; plus what those readers let through: keys nothing
  reads (``algorithm.gigpo.gamma``, ``env.<typo>``), an ``env.name`` that is neither registered nor in
  ``env.registry``, a non-integer step count, a non-finite penalty, an ``env.kwargs`` that is not a mapping;
* ``trainer.credit_log_*`` (per-step credit records) through :meth:`verl_gigpo.credit.CreditLogOptions.from_trainer`.

    from verl_gigpo.preflight import preflight
    preflight(config)  # raises GiGPOConfigError listing every problem, or returns None
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from environments import list_envs
from verl_gigpo import AGENT_LOOP_NAME, STEP_CREDIT_ESTIMATORS, TRAINER_MODE
from verl_gigpo.agent_loop import episode_config_from
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.credit import CreditLogOptions

__all__ = ["ENV_KEYS", "GiGPOConfigError", "config_problems", "preflight"]

#: the keys of the ``env`` section (see verl_gigpo/config/gigpo_trainer.yaml)
ENV_KEYS = ("name", "max_steps", "history_length", "invalid_action_penalty", "kwargs", "registry")

# verl's own agent-loop manager of the V1 path (what actor_rollout_ref.rollout.agent.agent_loop_manager_class=null
# gives); naming it explicitly is the same thing
_VERL_TQ_MANAGERS = ("verl.trainer.ppo.v1.AgentLoopManagerTQ", "verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ")

# constructor arguments the agent loop sets itself (rollout.factory.make_task_env rejects them in env.kwargs)
_EPISODE_OWNED_KWARGS = {"max_steps": "env.max_steps", "key_mode": "algorithm.gigpo.key_mode"}


class GiGPOConfigError(ValueError):
    """The composed config cannot train GiGPO; ``problems`` lists each reason (one line each, with the fix)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"the config has {len(self.problems)} problem(s), found before starting Ray (verl_gigpo.preflight):\n"
            f"{lines}"
        )


def preflight(config: Any) -> None:
    """Check the composed trainer config on the driver; raise :class:`GiGPOConfigError` listing every problem.

    Args:
        config: the composed Hydra config (verl's ``ppo_trainer`` + ``verl_gigpo/config/gigpo_trainer.yaml`` +
            overrides), a ``DictConfig`` or a plain dict.

    Raises:
        GiGPOConfigError: (a ``ValueError``) when :func:`config_problems` finds anything.
    """
    problems = config_problems(config)
    if problems:
        raise GiGPOConfigError(problems)


def config_problems(config: Any) -> list[str]:
    """Every problem of the GiGPO part of ``config`` (see the module docstring), one message each; ``[]`` if none.

    The ``algorithm.gigpo`` and ``env`` messages are those of :meth:`GiGPOConfig.from_algorithm` and
    :func:`~verl_gigpo.agent_loop.episode_config_from`, the readers the trainer mode and the agent loop call.
    """
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    problems = _path_problems(config)
    gigpo_problems = _gigpo_problems(config.get("algorithm", None))
    env_problems, env_readable = _env_problems(config.get("env", None))
    problems += gigpo_problems + env_problems
    try:  # trainer.credit_log_*: the reader the trainer mode and the agent loop call
        CreditLogOptions.from_trainer(config.get("trainer", None))
    except ValueError as exc:
        problems.append(str(exc))
    from verl_gigpo.trainer import UpdateSettings  # the trainer mode's reader of trainer.v1.gigpo_sync

    try:
        UpdateSettings.from_config(config)
    except ValueError as exc:
        problems.append(str(exc))
    if not gigpo_problems and env_readable:
        # the agent loop's own reader: env section present, integer ranges, penalty >= 0, prompt/response lengths
        try:
            episode_config_from(config)
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
    return problems


def _path_problems(config: DictConfig) -> list[str]:
    """GiGPO's rows come from verl's V1 TransferQueue path: the agent loop returns a LIST of outputs per episode
    (one training row per step), which only ``AgentLoopManagerTQ``/``AgentLoopWorkerTQ`` store."""
    algorithm = config.get("algorithm", None) or {}
    estimator = algorithm.get("adv_estimator", None)
    rollout = OmegaConf.select(config, "actor_rollout_ref.rollout", default=None) or {}
    agent = rollout.get("agent", None) or {}
    agent_loop = agent.get("default_agent_loop", None)
    ours = estimator in STEP_CREDIT_ESTIMATORS  # gigpo, hgpo, graphgpo, g2po
    if not ours and agent_loop != AGENT_LOOP_NAME:
        return []  # neither an estimator nor the agent loop of this package: nothing of ours runs
    using = f"adv_estimator={estimator}" if ours else f"the {AGENT_LOOP_NAME} agent loop"
    problems = []
    trainer = config.get("trainer", None) or {}
    if not trainer.get("use_v1", True):
        problems.append(
            "trainer.use_v1=false selects verl's legacy (V0) trainer, which cannot store the "
            f"{AGENT_LOOP_NAME} agent loop's list outputs (one training row per environment step); {using} runs "
            "only on verl's V1 TransferQueue path: set trainer.use_v1=true (verl's default)"
        )
    manager = agent.get("agent_loop_manager_class", None)
    if manager and manager not in _VERL_TQ_MANAGERS:
        problems.append(
            f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager} replaces verl's AgentLoopManagerTQ; "
            f"{using} is supported only with verl's own manager, which stores every step row of the "
            f"{AGENT_LOOP_NAME} agent loop in TransferQueue: remove the override (agent_loop_manager_class=null)"
        )
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    if ours and trainer.get("use_v1", True) and mode != TRAINER_MODE:
        problems.append(
            f"adv_estimator={estimator} with trainer.v1.trainer_mode={mode}: only the {TRAINER_MODE} trainer "
            f"mode passes {estimator} its per-step data (verl's generic advantage step would fail after the first "
            f"rollout); set trainer.v1.trainer_mode={TRAINER_MODE} (the default of verl_gigpo.main), or choose "
            "another adv_estimator (grpo, rloo, ...) for that mode"
        )
    return problems


def _gigpo_problems(algorithm: Any) -> list[str]:
    """``algorithm.gigpo.*`` (and ``algorithm.gamma``) as the trainer mode and the agent loop read them."""
    if algorithm is None:
        return []
    gigpo = algorithm.get("gigpo", None)
    if gigpo is not None and not isinstance(gigpo, Mapping):
        return [f"algorithm.gigpo must be a mapping of GiGPO options, got {gigpo!r}"]
    problems = []
    if gigpo is not None and "gamma" in gigpo:
        # GiGPOConfig.from_algorithm takes gamma from algorithm.gamma and would silently drop this one
        problems.append(
            f"algorithm.gigpo.gamma={gigpo['gamma']} is not read: the discount of GiGPO's step return is "
            f"algorithm.gamma (one key, shared with verl's estimators); set algorithm.gamma={gigpo['gamma']} and "
            "drop algorithm.gigpo.gamma"
        )
        algorithm = OmegaConf.to_container(algorithm, resolve=True)
        algorithm["gigpo"] = {k: v for k, v in algorithm["gigpo"].items() if k != "gamma"}
    try:
        GiGPOConfig.from_algorithm(algorithm)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _env_problems(env: Any) -> tuple[list[str], bool]:
    """What :func:`~verl_gigpo.agent_loop.episode_config_from` and the environment registry do not check
    before an episode starts: unknown keys, the name, the types of the numbers, ``env.kwargs``.

    Returns:
        the problems, and whether the numbers have types that reader can take (it casts with ``int()`` and
        ``float()``, which would truncate 2.5 or fail on text with Python's own message).
    """
    if env is None:
        return [], True  # episode_config_from says what to do
    if not isinstance(env, Mapping):
        return [f"env must be a mapping (env.name, env.max_steps, ...), got {env!r}"], False
    problems = []
    unknown = sorted(str(k) for k in env if k not in ENV_KEYS)
    if unknown:
        problems.append(
            f"unknown env key(s) {unknown}: nothing reads them; known keys: {list(ENV_KEYS)} (environment "
            "constructor arguments go under env.kwargs, e.g. +env.kwargs.data_path=...)"
        )
    # env.registry ({name: "package.module:Class"}) registers the user's environments in the agent-loop workers
    registry = env.get("registry", None)
    if registry is not None and not isinstance(registry, Mapping):
        problems.append(f"env.registry must map names to 'package.module:Class' targets, got {registry!r}")
        registry = None
    known = sorted({*list_envs(), *(str(k) for k in registry or {})})
    name = env.get("name", None)
    if name not in known:
        problems.append(
            f"env.name={name!r} is not a registered environment; known environments: {', '.join(known)} (add yours "
            "with +env.registry.<name>=package.module:Class)"
        )
    kwargs = env.get("kwargs", None)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        problems.append(
            f"env.kwargs must be a mapping of environment constructor arguments (e.g. "
            f"+env.kwargs.data_path=/data/alfworld), got {kwargs!r}"
        )
    elif kwargs is not None:
        for key, owner in _EPISODE_OWNED_KWARGS.items():
            if key in kwargs:
                problems.append(f"env.kwargs.{key} is set by the agent loop from {owner}; set {owner} instead")
    type_problems = []
    for key, least in (("max_steps", 1), ("history_length", 0)):
        value = env.get(key, None)
        if isinstance(value, bool) or not isinstance(value, int):
            type_problems.append(f"env.{key} must be a whole number >= {least}, got {value!r} ({type(value).__name__})")
    penalty = env.get("invalid_action_penalty", None)
    if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not math.isfinite(penalty):
        type_problems.append(
            f"env.invalid_action_penalty must be a finite number >= 0 (subtracted from the reward of a step whose "
            f"reply holds no valid action; paper: 0.1), got {penalty!r}"
        )
    return problems + type_problems, not type_problems
