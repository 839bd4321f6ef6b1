"""Driver-side checks of the composed Hydra config, run by ``python -m verl_gigpo.main`` before verl starts Ray.

verl reads ``algorithm.gigpo.*`` and ``env.*`` only inside its Ray actors, so a typo there would surface minutes
after launch, or never. :func:`preflight` checks them, the rules both engines share, verl's V1 path, the logging and
dynamic-sampling options and the files a run reads, through the readers the trainer mode and the agent loop use;
every message names the key as the user types it. The list: docs/runs.md ("Checks before Ray starts"); why:
docs/verl-integration.md ("Before Ray").
"""

from __future__ import annotations

import logging
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from environments import env_class, list_envs
from verl_gigpo import AGENT_LOOP_NAME, STEP_CREDIT_ESTIMATORS, TRAINER_MODE
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.rules import (
    RANGES,
    SHARED_KEYS,
    bypass_mode_problem,
    estimator_problem,
    group_size_warning,
    kl_in_reward_problem,
    training_sampling_problem,
    validation_sampling,
)
from verl_gigpo.credit.records import CreditLogOptions
from verl_gigpo.rollout.episode import chat_template_kwargs_from
from verl_gigpo.rollout.episode_log import EpisodeLogOptions
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.health import HealthOptions
from verl_gigpo.rollout.seeding import seeded_sampling_from
from verl_gigpo.verl_glue.agent_loop import episode_config_from

__all__ = ["ENV_KEYS", "GiGPOConfigError", "config_problems", "config_warnings", "file_problems", "preflight"]

logger = logging.getLogger(__name__)

#: the keys of the ``env`` section (see verl_gigpo/config/gigpo_trainer.yaml)
ENV_KEYS = ("name", "max_steps", "history_length", "invalid_action_penalty", "invalid_action", "kwargs", "registry")
ENV_KEYS += ("invalid_action_penalty_mode", "transcript_dir")
#: the prompt and reply-parsing options (env.prompt.*, env.parse.*), checked by episode_config_from
#: (PromptOptions.from_config, parse_style_from_config)
ENV_KEYS += ("prompt", "parse")
#: the ``env`` keys of environment execution (deadlines, worker processes), checked by EnvExecution.from_config
ENV_KEYS += ("step_timeout_s", "reset_timeout_s", "num_workers")
#: the request seeds (verl_gigpo.rollout.seeding), checked by seeded_sampling_from
ENV_KEYS += ("seeded_sampling",)

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
            f"the config has {len(self.problems)} problem(s), found before starting Ray "
            "(verl_gigpo.verl_glue.preflight):\n"
            f"{lines}"
        )


def preflight(config: Any) -> None:
    """Check the composed trainer config (a ``DictConfig`` or dict) on the driver; raise :class:`GiGPOConfigError`
    listing every problem of :func:`config_problems` and :func:`file_problems`; log :func:`config_warnings`."""
    problems = config_problems(config) + file_problems(config)
    if problems:
        raise GiGPOConfigError(problems)
    for warning in config_warnings(config):
        logger.warning(warning)


def config_problems(config: Any) -> list[str]:
    """Every problem of the GiGPO keys of ``config``, one message each (the readers' own); ``[]`` if none."""
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    rule_problems = _rule_problems(config)
    problems = _path_problems(config) + rule_problems
    env = config.get("env", None)
    env_problems, env_readable = _env_problems(env)
    # the estimators' env values (the penalty mode; the successors' inherited history and penalty): all of env when
    # the env checks passed, else the mode alone, so a bad env value is named once, by its own check
    env_ok = env_readable and not env_problems and not any(p.startswith("env.") for p in rule_problems)
    estimator_env = (
        env
        if env_ok or not isinstance(env, Mapping)
        else {"invalid_action_penalty_mode": env.get("invalid_action_penalty_mode", None)}
    )
    gigpo_problems = _gigpo_problems(config.get("algorithm", None), estimator_env)
    problems += gigpo_problems + env_problems
    try:  # data.apply_chat_template_kwargs: the reader the agent loop's prompt encoder calls
        chat_template_kwargs_from(OmegaConf.select(config, "data.apply_chat_template_kwargs", default=None))
    except ValueError as exc:
        problems.append(str(exc))
    try:  # trainer.credit_log_*: the reader the trainer mode and the agent loop call
        CreditLogOptions.from_trainer(config.get("trainer", None))
    except ValueError as exc:
        problems.append(str(exc))
    # trainer.log_episodes* and trainer.health.*: the readers the trainer mode, the agent loop and the local engine call
    for reader in (EpisodeLogOptions.from_trainer, HealthOptions.from_trainer):
        try:
            reader(config.get("trainer", None))
        except ValueError as exc:
            problems.append(str(exc))
    bypass = bypass_mode_problem(
        OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False),
        OmegaConf.select(config, "actor_rollout_ref.rollout.calculate_log_probs", default=True),
    )
    if bypass:
        problems.append(bypass)
    sampling = training_sampling_problem(
        OmegaConf.select(config, "actor_rollout_ref.rollout.do_sample", default=True),
        OmegaConf.select(config, "actor_rollout_ref.rollout.temperature", default=1.0),
    )
    if sampling:
        problems.append(sampling)
    from verl_gigpo.rollout.step_rows import UpdateSettings  # the trainer mode's reader of trainer.v1.gigpo_sync

    try:
        UpdateSettings.from_config(config)
    except ValueError as exc:
        problems.append(str(exc))
    problems += _dynamic_sampling_problems(config)
    if not gigpo_problems and env_readable:
        # the agent loop's own reader: env section present, prompt/response lengths (the env.* ranges are checked
        # above by the same rules, verl_gigpo.config.rules, which EpisodeConfig applies)
        try:
            episode_config_from(config)
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
    return problems


def _dynamic_sampling_problems(config: DictConfig) -> list[str]:
    """``algorithm.filter_groups`` and, when enabled, what verl's path needs (``gigpo_sync``, no custom sampler)."""
    from verl_gigpo.rollout.dynamic import DynamicSampling

    try:
        dynamic = DynamicSampling.from_algorithm(config.get("algorithm", None))
    except ValueError as exc:
        return [str(exc)]
    if not dynamic.enable:
        return []
    problems = []
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    if mode != TRAINER_MODE:
        problems.append(
            f"algorithm.filter_groups.enable=true needs trainer.v1.trainer_mode={TRAINER_MODE} (got {mode}): its "
            "replay buffer runs the keep test on whole groups of step rows; verl's own DAPO filter compares one "
            "reward per row and ignores max_num_gen_batches"
        )
    custom = OmegaConf.select(config, "trainer.v1.sampler.custom_sampler", default=None) or {}
    if custom.get("path") or custom.get("name"):
        problems.append(
            "algorithm.filter_groups.enable=true runs this package's replay buffer; unset "
            "trainer.v1.sampler.custom_sampler.path/name"
        )
    sync_step = OmegaConf.select(config, "trainer.v1.sync.parameter_sync_step", default=1)
    if sync_step != 1:
        problems.append(
            f"algorithm.filter_groups.enable=true samples whole iterations: trainer.v1.sync.parameter_sync_step="
            f"{sync_step} must be 1"
        )
    return problems


def config_warnings(config: Any) -> list[str]:
    """What is valid but worth a warning: a group size of 1, ``full_determinism`` without request seeds, greedy
    validation settings under another trainer mode."""
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    estimator = OmegaConf.select(config, "algorithm.adv_estimator", default=None)
    n = OmegaConf.select(config, "actor_rollout_ref.rollout.n", default=None)
    warning = group_size_warning(
        str(estimator), n, step_advantage_w=OmegaConf.select(config, "algorithm.gigpo.step_advantage_w", default=None)
    )
    warnings = [warning] if warning else []
    deterministic = OmegaConf.select(config, "actor_rollout_ref.rollout.full_determinism", default=False)
    if deterministic and OmegaConf.select(config, "env.seeded_sampling", default=True) is False:
        warnings.append(
            "actor_rollout_ref.rollout.full_determinism=true with env.seeded_sampling=false: verl then gives every "
            "request of a replica the same seed, so the members of a group, which share one prompt, sample the same "
            "tokens; set env.seeded_sampling=true (a seed per task, member and step)"
        )
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    val_kwargs = OmegaConf.select(config, "actor_rollout_ref.rollout.val_kwargs", default=None) or {}
    sampling = validation_sampling(val_kwargs)
    if mode != TRAINER_MODE and sampling.ignored:
        warnings.append(
            f"actor_rollout_ref.rollout.val_kwargs.do_sample=false with {', '.join(sampling.ignored)}: verl's "
            f"trainer mode {mode} decodes validation with those settings, not greedily (only trainer.v1.trainer_mode="
            f"{TRAINER_MODE} makes do_sample=false greedy); set val_kwargs.temperature=0 for greedy validation"
        )
    return warnings


def _truthy(value: str | None) -> bool:
    """An environment flag as huggingface_hub reads it (``1``, ``true``, ``yes``, ``on``)."""
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _model_problem(key: str, value: Any) -> str | None:
    """``key`` must be a folder holding ``config.json`` or a fetchable hub id (cached under ``HF_HUB_OFFLINE=1``)."""
    text = str(value)
    if "://" in text:
        return None
    local = Path(os.path.expanduser(text))
    if local.exists():
        if not (local / "config.json").is_file():
            return (
                f"{key}={text} is not a Hugging Face model folder (no config.json in it); point it at the folder "
                "that holds config.json, the weights and the tokenizer"
            )
        return None
    build = "`python -m verl_gigpo.dev.tiny_model --out DIR` builds a tiny one"
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return f"{key}={text} does not exist: set it to a model folder (holding config.json; {build}) or a hub id"
    offline = [v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if _truthy(os.environ.get(v))]
    if offline:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(text, "config.json"), str):
            return (
                f"{key}={text} is no local folder, and as a Hugging Face hub id it cannot be fetched: {offline[0]}="
                f"{os.environ[offline[0]]} disables the hub and the model is not in the local cache. Download it "
                f"where the hub is reachable (`huggingface-cli download {text}`) or set {key} to a model folder "
                f"({build})"
            )
    return None


def _listed(value: Any) -> list[str]:
    """A ``data.*_files`` value (one path or a list) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def file_problems(config: Any) -> list[str]:
    """The files and folders a run reads (model, data, the environment's own data); one message per problem."""
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    problems = []
    model = OmegaConf.select(config, "actor_rollout_ref.model", default=None) or {}
    for key in ("path", "tokenizer_path", "hf_config_path"):
        value = model.get(key, None)
        if value is None and key != "path":
            continue
        problem = (
            _model_problem(f"actor_rollout_ref.model.{key}", value)
            if value not in (None, "")
            else "actor_rollout_ref.model.path is not set: set it to a model folder or a Hugging Face hub id"
        )
        if problem:
            problems.append(problem)
    env_name = OmegaConf.select(config, "env.name", default=None)
    prepare = f"`python -m verl_gigpo.data.prepare --env {env_name or 'NAME'} --train-size N --out DIR`"
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(config, key, default=None)
        files = _listed(value)
        if not files:
            problems.append(f"{key} is not set: write task files with {prepare} and set {key}=DIR/<split>.parquet")
        for name in files:
            if "://" not in name and not Path(os.path.expanduser(name)).exists():
                problems.append(
                    f"{key}={name} does not exist: write the task files with {prepare} (train.parquet and "
                    f"val.parquet) and set data.train_files and data.val_files to them"
                )
    return problems + _env_data_problems(config.get("env", None)) + _logger_problems(config)


def _wandb_key_found() -> bool:
    """Whether wandb would find credentials without asking: ``WANDB_API_KEY``, an identity-token file, an offline or
    disabled ``WANDB_MODE``, or a netrc entry (``NETRC`` or ``~/.netrc``) for a W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    if os.environ.get("WANDB_MODE", "").strip().lower() in ("offline", "disabled", "dryrun"):
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        hosts = netrc.netrc(str(path)).hosts
    except (OSError, netrc.NetrcParseError):
        return path.is_file()  # a netrc wandb may still read: do not guess
    base = os.environ.get("WANDB_BASE_URL", "")
    wanted = {"api.wandb.ai", urlparse(base if "://" in base else f"//{base}").hostname}
    return any(host in wanted for host in hosts)


def _logger_problems(config: DictConfig) -> list[str]:
    """``trainer.logger`` with wandb and no W&B credentials: verl's tracker would stop the run after start-up."""
    loggers = _listed(OmegaConf.select(config, "trainer.logger", default=None))
    if "wandb" not in loggers or _wandb_key_found():
        return []
    return [
        f"trainer.logger={loggers} includes wandb, but no W&B credentials were found (WANDB_API_KEY, `wandb login`'s "
        "~/.netrc entry): log in, set WANDB_MODE=offline, or log without it, e.g. trainer.logger=[console,file]"
    ]


def _env_data_problems(env: Any) -> list[str]:
    """The environment's own check of its constructor arguments (:meth:`environments.TextEnv.setup_problems`)."""
    if not isinstance(env, Mapping) or env.get("name", None) not in list_envs():
        return []
    kwargs = env.get("kwargs", None) or {}
    if not isinstance(kwargs, Mapping):
        return []  # _env_problems says so
    kwargs = OmegaConf.to_container(kwargs, resolve=True) if isinstance(kwargs, DictConfig) else dict(kwargs)
    name = env["name"]
    try:
        cls = env_class(name)
    except ImportError as exc:
        return [f"env.name={name}: the environment cannot be imported: {exc}"]
    problems = []
    for argument, message in cls.setup_problems(kwargs):
        where = f"env.kwargs.{argument}={kwargs.get(argument)}" if argument in kwargs else f"env.name={name}"
        problems.append(f"{where}: {message}")
    return problems


def _path_problems(config: DictConfig) -> list[str]:
    """verl's V1 TransferQueue path, the only one that stores a list of outputs per episode."""
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


def _rule_problems(config: DictConfig) -> list[str]:
    """The rules both engines check, outside ``env.*``: the group size, ``use_kl_in_reward``, ``adv_estimator``."""
    problems = []
    for key in SHARED_KEYS:
        if not key.startswith("env."):
            problem = RANGES[key].problem(OmegaConf.select(config, key, default=None))
            if problem:
                problems.append(problem)
    estimator = OmegaConf.select(config, "algorithm.adv_estimator", default=None)
    kl = kl_in_reward_problem(OmegaConf.select(config, "algorithm.use_kl_in_reward", default=False), estimator)
    if kl and not any(p.startswith("algorithm.use_kl_in_reward=") for p in problems):
        problems.append(kl)
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    known = sorted({*ADV_ESTIMATOR_REGISTRY, *STEP_CREDIT_ESTIMATORS})
    wrong = estimator_problem(estimator, known, engine="verl (its registry, this plug-in's included)")
    if wrong:
        problems.append(wrong)
    return problems


def _gigpo_problems(algorithm: Any, env: Any = None) -> list[str]:
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
        GiGPOConfig.from_algorithm(algorithm, env=env if isinstance(env, Mapping) else None)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _env_problems(env: Any) -> tuple[list[str], bool]:
    """What :func:`~verl_gigpo.verl_glue.agent_loop.episode_config_from` and the registry leave unchecked (unknown
    keys, the name, number types, ``env.kwargs``); the problems, and whether the numbers' types can be cast."""
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
    type_problems = []  # the env.* rules of verl_gigpo.config.rules (the local engine checks them too)
    for key in SHARED_KEYS:
        if key.startswith("env."):
            problem = RANGES[key].problem(env.get(key.removeprefix("env."), None))
            if problem:
                type_problems.append(problem)
    for reader in (EnvExecution.from_config, seeded_sampling_from):  # the agent loop's own readers
        try:
            reader(env)
        except ValueError as exc:
            problems.append(str(exc))
    return problems + type_problems, not type_problems
