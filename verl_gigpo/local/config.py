"""The local engine's configuration: defaults, overrides and the checks run before anything is built.

    cfg = load_config(["algorithm.adv_estimator=grpo", "trainer.seed=3"])   # defaults + overrides, validated

Defaults: ``verl_gigpo/config/local_trainer.yaml`` (verl's key names); unknown keys are an error. Values are checked
by the rules verl's preflight applies (:mod:`verl_gigpo.config.rules`) and the components' own validators. Keys:
docs/configuration.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from environments import list_envs
from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.advantage.outcome import OUTCOME_ESTIMATORS
from verl_gigpo.config.keys import rename_deprecated_tree, rename_override
from verl_gigpo.config.rules import (
    RANGES,
    estimator_problem,
    group_size_warning,
    kl_in_reward_problem,
    training_sampling_problem,
    validation_sampling,
)
from verl_gigpo.config.trainer import HealthOptions, LocalSettings
from verl_gigpo.credit.records import CreditLogOptions
from verl_gigpo.rollout.dynamic import DynamicSampling
from verl_gigpo.rollout.episode import chat_template_kwargs_from
from verl_gigpo.rollout.episode_log import EpisodeLogOptions, logger_names
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.seeding import seeded_sampling_from
from verl_gigpo.rollout.step_rows import UpdateSettings
from verl_gigpo.rollout.types import PromptOptions, check_invalid_action, parse_style_from_config

__all__ = ["DEFAULT_CONFIG", "ESTIMATORS", "check_loggers", "gigpo_config", "load_config", "validate_config"]

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "local_trainer.yaml"
"""The local engine's defaults."""

ESTIMATORS = (*STEP_CREDIT_ESTIMATORS, *OUTCOME_ESTIMATORS)
"""Values of ``algorithm.adv_estimator`` the local engine runs: the step-credit estimators (gigpo, hgpo, graphgpo,
g2po) and verl's grpo and rloo."""


def load_config(
    overrides: Sequence[str] = (), config_path: str | Path | None = None, *, layers: Sequence[Mapping] = ()
) -> DictConfig:
    """The defaults (or ``config_path``), then the mappings ``layers`` in order, then dotlist ``overrides``, validated.

    Raises:
        ValueError: an unknown key, an override that is not ``key=value``, or a bad value (:func:`validate_config`).
    """
    base = OmegaConf.load(Path(config_path) if config_path else DEFAULT_CONFIG)
    OmegaConf.set_struct(base, True)
    OmegaConf.set_struct(base.env.kwargs, False)  # environment arguments are free-form
    OmegaConf.set_struct(base.env.registry, False)  # the user's environments: {name: "package.module:Class"}
    if isinstance(base.data.get("apply_chat_template_kwargs", None), DictConfig):
        OmegaConf.set_struct(base.data.apply_chat_template_kwargs, False)  # whatever the chat template reads
    overrides = [rename_override(item) for item in overrides]  # deprecated spellings (verl_gigpo.config.keys)
    layers = [rename_deprecated_tree(layer) for layer in layers]
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value (e.g. trainer.seed=3)")
    try:
        cfg = OmegaConf.merge(
            base, *(OmegaConf.create(dict(layer)) for layer in layers), OmegaConf.from_dotlist(list(overrides))
        )
    except Exception as exc:  # noqa: BLE001 - omegaconf raises several types; re-raised with the fix
        raise ValueError(
            f"bad override: {exc}. Keys are those of {DEFAULT_CONFIG.name} (sections: {', '.join(base.keys())}); "
            "environment arguments go under env.kwargs.*"
        ) from exc
    validate_config(cfg)
    return cfg


def _check_numbers(cfg: DictConfig) -> None:
    """Type and range of every numeric and boolean key by ``config.rules.RANGES``; ValueError names it."""
    for key, rule in RANGES.items():
        rule.check(OmegaConf.select(cfg, key))


def validate_config(cfg: DictConfig) -> None:
    """Check values and combinations (the shared rules, this engine's own, the components'); ValueError says what to
    change."""
    _check_numbers(cfg)
    LocalSettings.from_section(OmegaConf.to_container(cfg.local, resolve=True))  # local.*: checks on its fields
    rollout, actor, algorithm = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor, cfg.algorithm
    for problem in (
        estimator_problem(algorithm.adv_estimator, ESTIMATORS, engine="the local engine"),
        kl_in_reward_problem(algorithm.use_kl_in_reward, algorithm.adv_estimator, local_engine=True),
    ):
        if problem:
            raise ValueError(problem)
    sampling = training_sampling_problem(True, rollout.temperature)  # this engine has no rollout.do_sample key
    if sampling:
        raise ValueError(sampling)
    mini = actor.ppo_mini_batch_size
    if mini is not None and (not isinstance(mini, int) or not 1 <= mini <= cfg.data.train_batch_size):
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini!r} must be null or in [1, data.train_batch_size]"
        )
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    get_policy_loss_fn(actor.policy_loss.loss_mode)  # raises with the list of known losses
    CreditLogOptions.from_trainer(cfg.trainer)  # trainer.credit_log_*: raises naming the key
    EpisodeLogOptions.from_trainer(cfg.trainer)  # trainer.log_episodes*: the reader verl's path uses
    check_loggers(cfg.trainer.get("logger", None))
    HealthOptions.from_trainer(cfg.trainer)  # trainer.health.*: the reader verl's trainer mode uses
    check_invalid_action(cfg.env.invalid_action)  # env.invalid_action: the episode runner's own check
    known = {*list_envs(), *(str(k) for k in cfg.env.registry or {})}
    if cfg.env.name not in known:
        raise ValueError(
            f"env.name={cfg.env.name!r} is not a registered environment; known environments: "
            f"{', '.join(sorted(known))} (add yours with env.registry.<name>=package.module:Class)"
        )
    UpdateSettings.from_config(cfg)  # trainer.v1.gigpo_sync.*: the validator verl's gigpo_sync mode uses
    EnvExecution.from_config(cfg.env)  # env.step_timeout_s, env.reset_timeout_s, env.num_workers: raises naming the key
    seeded_sampling_from(cfg.env)  # env.seeded_sampling: the reader both engines' rollouts use
    PromptOptions.from_config(cfg.env.get("prompt"))  # env.prompt.*: the reader of EpisodeConfig.from_env
    parse_style_from_config(cfg.env.get("parse"))  # env.parse.*: the reader of EpisodeConfig.from_env
    chat_template_kwargs_from(cfg.data.get("apply_chat_template_kwargs", None))  # the reader both engines' encoders use
    gigpo_config(cfg)  # validates algorithm.gamma, algorithm.gigpo.* and the successors' sections, whichever estimator
    DynamicSampling.from_algorithm(algorithm)  # algorithm.filter_groups: the reader verl's path uses
    warning = group_size_warning(
        algorithm.adv_estimator, rollout.n, step_advantage_w=algorithm.gigpo.get("step_advantage_w")
    )
    if warning:
        logger.warning(warning)
    greedy = validation_sampling(rollout.val_kwargs)
    if greedy.message:
        (logger.warning if greedy.ignored else logger.info)(greedy.message)


def check_loggers(loggers) -> list[str]:
    """``trainer.logger`` as a list of verl's ``Tracking`` backend names; ValueError naming a bad one."""
    from verl.utils.tracking import Tracking

    names = logger_names(loggers)
    for name in names:
        if name not in Tracking.supported_backend:
            raise ValueError(
                f"trainer.logger has {name!r}, not a verl logger; use a list of {Tracking.supported_backend} "
                "(e.g. trainer.logger=[tensorboard]) or [] for metrics.jsonl only"
            )
    return names


def gigpo_config(cfg: DictConfig):
    """The step-credit settings as a validated :class:`verl_gigpo.config.GiGPOConfig` (ValueError names the key)."""
    from verl_gigpo.config import GiGPOConfig

    return GiGPOConfig.from_algorithm(cfg.algorithm, env=cfg.env)
