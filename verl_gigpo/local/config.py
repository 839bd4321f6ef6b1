"""The local engine's configuration: defaults, overrides and the checks run before anything is built.

    cfg = load_config(["algorithm.adv_estimator=grpo", "trainer.seed=3"])   # defaults + overrides, validated

Defaults: ``verl_gigpo/config/local_trainer.yaml`` (:data:`DEFAULT_CONFIG`), with the key names of the verl
recipes; overrides are OmegaConf dotlist items ``key=value`` and unknown keys are an error. Every numeric and
boolean key is type- and range-checked (:func:`validate_config`), so a typo fails at once rather than after the
first iteration; ``algorithm.gigpo.*`` and the successors' sections (``algorithm.hgpo``, ``algorithm.graphgpo``,
``algorithm.g2po``) are checked by :class:`verl_gigpo.config.GiGPOConfig`, ``trainer.credit_log_*`` by
:class:`verl_gigpo.credit.CreditLogOptions`, the environment deadlines and worker processes by
:class:`verl_gigpo.rollout.execution.EnvExecution` (the validator verl's agent loop uses).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from environments import list_envs
from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.config import group_size_warning
from verl_gigpo.credit import CreditLogOptions
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.step_rows import UpdateSettings
from verl_gigpo.rollout.types import check_invalid_action

__all__ = ["DEFAULT_CONFIG", "ESTIMATORS", "gigpo_config", "load_config", "validate_config"]

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "local_trainer.yaml"
"""The local engine's defaults."""

ESTIMATORS = (*STEP_CREDIT_ESTIMATORS, "grpo", "rloo")
"""Values of ``algorithm.adv_estimator`` the local engine runs: the step-credit estimators (gigpo, hgpo, graphgpo,
g2po) and verl's grpo and rloo."""


def load_config(overrides: Sequence[str] = (), config_path: str | Path | None = None) -> DictConfig:
    """The defaults (``local_trainer.yaml`` or ``config_path``) merged with dotlist ``overrides`` and validated.

    Raises:
        ValueError: an override names an unknown key (the message lists the known top-level sections), is not
            ``key=value``, or a value is out of range (see :func:`validate_config`).
    """
    base = OmegaConf.load(Path(config_path) if config_path else DEFAULT_CONFIG)
    OmegaConf.set_struct(base, True)
    OmegaConf.set_struct(base.env.kwargs, False)  # environment arguments are free-form
    OmegaConf.set_struct(base.env.registry, False)  # the user's environments: {name: "package.module:Class"}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value (e.g. trainer.seed=3)")
    try:
        cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
    except Exception as exc:  # noqa: BLE001 - omegaconf raises several types; re-raised with the fix
        raise ValueError(
            f"bad override: {exc}. Keys are those of {DEFAULT_CONFIG.name} (sections: {', '.join(base.keys())}); "
            "environment arguments go under env.kwargs.*"
        ) from exc
    validate_config(cfg)
    return cfg


# Every numeric and boolean key of local_trainer.yaml outside algorithm.gigpo (GiGPOConfig checks those) and
# trainer.credit_log_* (CreditLogOptions): (kind, lowest allowed value or None, what it means). Checked before the
# run starts, so a typo such as trainer.save_freq=abc fails at once, not after the first iteration.
_NUMBERS: dict[str, tuple[str, float | None, str]] = {
    "actor_rollout_ref.rollout.n": ("int", 1, "episodes per task"),
    "actor_rollout_ref.rollout.temperature": ("float", 0.0, "sampling temperature"),
    "actor_rollout_ref.rollout.top_p": ("float", 0.0, "nucleus sampling mass, in (0, 1]"),
    "actor_rollout_ref.rollout.top_k": ("int", -1, "top-k sampling, -1 = off"),
    "actor_rollout_ref.rollout.response_length": ("int", 1, "generated tokens per step"),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": ("bool", None, "sample in validation"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": ("float", 0.0, "validation temperature"),
    "actor_rollout_ref.rollout.val_kwargs.n": ("int", 1, "validation episodes per task"),
    "actor_rollout_ref.actor.optim.lr": ("float", 0.0, "learning rate"),
    "actor_rollout_ref.actor.optim.weight_decay": ("float", 0.0, "AdamW weight decay"),
    "actor_rollout_ref.actor.clip_ratio": ("float", 0.0, "PPO clip range"),
    "actor_rollout_ref.actor.ppo_epochs": ("int", 1, "passes over each iteration's rows"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("int", 1, "sequences per micro-batch"),
    "actor_rollout_ref.actor.grad_clip": ("float", 0.0, "gradient-norm clipping"),
    "actor_rollout_ref.actor.use_kl_loss": ("bool", None, "KL loss to the initial model"),
    "actor_rollout_ref.actor.kl_loss_coef": ("float", 0.0, "KL loss coefficient"),
    "actor_rollout_ref.actor.entropy_coeff": ("float", None, "entropy bonus coefficient"),
    "data.train_batch_size": ("int", 1, "tasks per iteration"),
    "data.max_prompt_length": ("int", 1, "prompt token budget"),
    "data.val_size": ("int", 0, "validation tasks, 0 = no validation"),
    "algorithm.gamma": ("float", 0.0, "discount of R_t, in [0, 1]"),
    "algorithm.norm_adv_by_std_in_grpo": ("bool", None, "GRPO: divide by the group std"),
    "env.max_steps": ("int", 1, "steps per episode"),
    "env.history_length": ("int", 0, "past steps in the prompt"),
    "env.invalid_action_penalty": ("float", None, "penalty of an invalid action"),
    "trainer.total_training_steps": ("int", 1, "iterations"),
    "trainer.test_freq": ("int", None, "validate every N iterations; <= 0: start and end only"),
    "trainer.save_freq": ("int", None, "checkpoint every N iterations; <= 0: after the last only"),
    "trainer.seed": ("int", 0, "seed of the run"),
    "trainer.resume": ("bool", None, "continue the run in the folder"),
    "trainer.overwrite": ("bool", None, "delete the run in the folder first"),
    "trainer.allow_config_change": ("bool", None, "resume with a changed config"),
    "local.constrain_to_actions": ("bool", None, "decode action tokens only"),
    "local.max_batch_size": ("int", 1, "requests per batched generation"),
    "local.env_workers": ("int", 0, "environment threads, 0 = inline"),
    "local.num_threads": ("int", 1, "torch threads, null = torch's default"),
    "local.progress": ("bool", None, "progress bar"),
    "local.plot": ("bool", None, "write learning_curve.png"),
}
_NULLABLE = frozenset({"local.num_threads"})


def _check_numbers(cfg: DictConfig) -> None:
    """Type and lower bound of every key of :data:`_NUMBERS`; raises ``ValueError`` naming the key, the value
    and what the key means."""
    for key, (kind, lowest, meaning) in _NUMBERS.items():
        value = OmegaConf.select(cfg, key)
        if value is None and key in _NULLABLE:
            continue
        is_bool = isinstance(value, bool)
        ok = {
            "bool": is_bool,
            "int": isinstance(value, int) and not is_bool,
            "float": isinstance(value, int | float) and not is_bool and math.isfinite(value),
        }[kind]
        if not ok:
            what = {"bool": "true or false", "int": "an integer", "float": "a finite number"}[kind]
            raise ValueError(f"{key} must be {what} ({meaning}), got {value!r}")
        if lowest is not None and value < lowest:
            raise ValueError(f"{key} must be >= {lowest:g} ({meaning}), got {value!r}")


def validate_config(cfg: DictConfig) -> None:
    """Check values and combinations; raise ``ValueError`` saying what to change."""
    _check_numbers(cfg)
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    if not 0.0 < rollout.top_p <= 1.0:
        raise ValueError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {rollout.top_p!r}")
    if cfg.algorithm.gamma > 1.0:
        raise ValueError(f"algorithm.gamma must be in [0, 1], got {cfg.algorithm.gamma!r}")
    if cfg.algorithm.adv_estimator not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: the local engine runs {ESTIMATORS}")
    positive = {
        "actor_rollout_ref.rollout.n": rollout.n,
        "actor_rollout_ref.rollout.response_length": rollout.response_length,
        "actor_rollout_ref.rollout.val_kwargs.n": rollout.val_kwargs.n,
        "actor_rollout_ref.actor.ppo_epochs": actor.ppo_epochs,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": actor.ppo_micro_batch_size_per_gpu,
        "data.train_batch_size": cfg.data.train_batch_size,
        "data.max_prompt_length": cfg.data.max_prompt_length,
        "env.max_steps": cfg.env.max_steps,
        "trainer.total_training_steps": cfg.trainer.total_training_steps,
        "local.max_batch_size": cfg.local.max_batch_size,
    }
    for key, value in positive.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if not isinstance(cfg.local.env_workers, int) or cfg.local.env_workers < 0:
        raise ValueError(f"local.env_workers must be an integer >= 0 (0 = inline), got {cfg.local.env_workers!r}")
    if not isinstance(cfg.data.val_size, int) or cfg.data.val_size < 0:
        raise ValueError(f"data.val_size must be an integer >= 0 (0 = no validation), got {cfg.data.val_size!r}")
    mini = actor.ppo_mini_batch_size
    if mini is not None and (not isinstance(mini, int) or not 1 <= mini <= cfg.data.train_batch_size):
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini!r} must be null or in [1, data.train_batch_size]"
        )
    warning = group_size_warning(
        cfg.algorithm.adv_estimator, rollout.n, step_advantage_w=cfg.algorithm.gigpo.get("step_advantage_w")
    )
    if warning:
        logger.warning(warning)
    if not float(actor.optim.lr) > 0:
        raise ValueError(f"actor_rollout_ref.actor.optim.lr must be > 0, got {actor.optim.lr!r}")
    if not float(actor.clip_ratio) > 0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio must be > 0, got {actor.clip_ratio!r}")
    if rollout.temperature < 0 or rollout.val_kwargs.temperature < 0:
        raise ValueError("rollout temperatures must be >= 0 (0 = greedy)")
    if rollout.temperature == 0:
        raise ValueError(
            "actor_rollout_ref.rollout.temperature=0 makes every episode of a group identical (nothing to compare); "
            "use a temperature > 0 for training (val_kwargs.do_sample=false gives greedy validation)"
        )
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    get_policy_loss_fn(actor.policy_loss.loss_mode)  # raises with the list of known losses
    CreditLogOptions.from_trainer(cfg.trainer)  # trainer.credit_log_*: raises naming the key
    check_invalid_action(cfg.env.invalid_action)  # env.invalid_action: the episode runner's own check
    known = {*list_envs(), *(str(k) for k in cfg.env.registry or {})}
    if cfg.env.name not in known:
        raise ValueError(
            f"env.name={cfg.env.name!r} is not a registered environment; known environments: "
            f"{', '.join(sorted(known))} (add yours with env.registry.<name>=package.module:Class)"
        )
    UpdateSettings.from_config(cfg)  # trainer.v1.gigpo_sync.*: the validator verl's gigpo_sync mode uses
    EnvExecution.from_config(cfg.env)  # env.step_timeout_s, env.reset_timeout_s, env.num_workers: raises naming the key
    gigpo_config(cfg)  # validates algorithm.gigpo.* and the successors' sections, whichever estimator runs


def gigpo_config(cfg: DictConfig):
    """The step-credit settings (``algorithm.adv_estimator``, ``algorithm.gamma``, ``algorithm.gigpo`` and the
    successors' sections) as a validated :class:`verl_gigpo.config.GiGPOConfig` (raises ``ValueError`` naming the
    key)."""
    from verl_gigpo.config import GiGPOConfig

    return GiGPOConfig.from_algorithm(cfg.algorithm, env=cfg.env)
