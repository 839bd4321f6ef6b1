"""The ``gigpo_env_agent`` verl agent loop: one environment episode -> one training row per step.

verl builds one instance per trajectory and calls ``run(sampling_params, **row)`` with the dataset row's fields. The
episode is played by the shared runner (:func:`verl_gigpo.rollout.run_episode`) against verl's server manager; each
step becomes an ``AgentLoopOutput`` whose ``extra_fields`` are the row of
:func:`verl_gigpo.rollout.rows.episode_rows`, which the ``gigpo_sync`` trainer mode reads back. Environment calls run
in a worker-wide thread pool and environment pool (docs/environments-execution.md). What verl's fields carry and why
the placeholder row: docs/verl-integration.md ("The agent loop").
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from environments import register_envs
from verl_gigpo import AGENT_LOOP_NAME
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.credit.records import CREDIT_DIR, CreditLogOptions
from verl_gigpo.rollout import (
    ChatPromptEncoder,
    EnvPool,
    Episode,
    EpisodeConfig,
    TaskSpec,
    chat_template_kwargs_from,
    run_episode,
)
from verl_gigpo.rollout.episode_log import EpisodeLogOptions, PartWriter, episode_record, logged_validation
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.execution.threads import EnvThreadPool
from verl_gigpo.rollout.rows import IMAGES_FIELD, episode_rows
from verl_gigpo.rollout.seeding import (
    DRAW_FIELD,
    HOLD_S,
    HOLD_STREAM_ENV,
    VALIDATION_STREAM,
    EpisodeSeeds,
    seed_param,
    seeded_sampling_from,
    training_stream,
)
from verl_gigpo.rollout.transcripts import TranscriptWriter, episode_records
from verl_gigpo.rollout.vision import save_images
from verl_gigpo.verl_glue.contract import check_contract

__all__ = ["GiGPOEnvAgentLoop", "credit_images_due", "episode_config_from", "episode_to_outputs", "step_image_refs"]


def episode_config_from(config: Any) -> EpisodeConfig:
    """The :class:`EpisodeConfig` of a verl trainer config; ValueError naming the key as set in verl's config."""
    env = config.get("env", None)
    if env is None:
        raise ValueError(
            f"the '{AGENT_LOOP_NAME}' agent loop needs the env.* config section; run with "
            "`python -m verl_gigpo.main` (config verl_gigpo/config/gigpo_trainer.yaml)"
        )
    key_mode = GiGPOConfig.from_algorithm(config.algorithm).env_key_mode
    rollout = config.actor_rollout_ref.rollout
    return EpisodeConfig.from_env(
        env,
        max_prompt_length=rollout.prompt_length,
        max_response_length=rollout.response_length,
        key_mode=key_mode,
        field_keys={"max_prompt_length": "data.max_prompt_length", "max_response_length": "data.max_response_length"},
    )


@dataclass(frozen=True)
class LoopSettings:
    """What the agent loop reads from verl's config (:func:`loop_settings`)."""

    episode_config: EpisodeConfig
    execution: EnvExecution
    episode_options: EpisodeLogOptions
    text_chars: int
    seeded: bool
    credit: CreditLogOptions


_SETTINGS: dict[int, tuple[Any, LoopSettings]] = {}  # id(config) -> (config, its settings); the config kept alive
_SETTINGS_LOCK = threading.Lock()
_SETTINGS_KEPT = 4


def loop_settings(config: Any) -> LoopSettings:
    """The :class:`LoopSettings` of a verl config, parsed once per process and config object (``env.registry``
    registered then); ValueError naming a bad key."""
    with _SETTINGS_LOCK:
        cached = _SETTINGS.get(id(config))
        if cached is not None and cached[0] is config:
            return cached[1]
        episode_config = episode_config_from(config)  # first: it names a missing env section
        env_cfg, trainer = config.env, config.get("trainer", None)
        execution = EnvExecution.from_config(env_cfg)
        register_envs(env_cfg.get("registry", None))
        credit = CreditLogOptions.from_trainer(trainer)  # texts for credit records
        # trainer.log_episodes*: validation episodes go to episodes_parts/; logged training episodes need the texts
        options = EpisodeLogOptions.from_trainer(trainer)
        train_texts = options.max_chars + 1 if options.train_freq else 0
        text_chars = max(credit.max_chars if credit.enabled else 0, train_texts if options.enabled else 0)
        seeded = seeded_sampling_from(env_cfg)
        settings = LoopSettings(episode_config, execution, options, text_chars, seeded, credit)
        if len(_SETTINGS) >= _SETTINGS_KEPT:  # a config object per trajectory would otherwise pile up
            _SETTINGS.pop(next(iter(_SETTINGS)))
        _SETTINGS[id(config)] = (config, settings)
        return settings


def episode_to_outputs(
    episode: Episode,
    *,
    placeholder_prompt_ids: list[int],
    eos_id: int,
    weight_version: int | None = None,
    text_chars: int = 0,
    image_refs: Sequence[list[str]] | None = None,
) -> list[AgentLoopOutput]:
    """One ``AgentLoopOutput`` per row of :func:`~verl_gigpo.rollout.rows.episode_rows` (its fields become
    ``extra_fields``). ``weight_version`` fills ``min/max_global_steps`` when nothing was generated; an episode that
    failed at reset gets one placeholder row (``placeholder_prompt_ids``, response ``[eos_id]``, mask 0);
    ``text_chars`` > 0 adds the observation and action texts; ``image_refs`` (one list per step) adds each step's
    stored PNGs as the ``images`` field. Why: docs/verl-integration.md ("The agent loop").
    """
    rows = episode_rows(episode, text_chars=text_chars)
    min_versions = [
        r.generation_info["min_global_steps"] for r in rows if r.generation_info.get("min_global_steps") is not None
    ]
    max_versions = [
        r.generation_info["max_global_steps"] for r in rows if r.generation_info.get("max_global_steps") is not None
    ]
    verl_fields = {
        "min_global_steps": min(min_versions) if min_versions else weight_version,
        "max_global_steps": max(max_versions) if max_versions else weight_version,
        "reward_extra_info": {
            "acc": float(episode.won),  # verl makes "acc" its core validation metric: val-core/<source>/acc/mean@n
            "episode_length": float(episode.length),
            "invalid_actions": float(episode.num_invalid),
            # the trainer mode's per-type validation (val-core/<env>/<type>/*) reads these two and removes them
            # before verl's statistics (GiGPOTrainerSync._val_metrics_update)
            "task_type": episode.task_type or "",
            "env_error": float(episode.env_error is not None),
        },
    }
    failed = episode.env_error is not None
    per_step_time = episode.timing.get("generate", 0.0) / max(episode.length, 1)
    outputs = []
    for i, row in enumerate(rows):
        images, fields = None, {**row.fields, **verl_fields}
        if row.placeholder:
            prompt_ids, response_ids, logprobs = list(placeholder_prompt_ids), [eos_id], [0.0]
        else:
            prompt_ids, response_ids, logprobs = row.prompt_ids, row.response_ids, row.response_logprobs
            images = episode.steps[i].images or None  # rows are the steps, in order
            if image_refs is not None and image_refs[i]:  # the credit records' PNGs (verl keeps no raw image)
                fields[IMAGES_FIELD] = list(image_refs[i])
        last = i == len(rows) - 1
        outputs.append(
            AgentLoopOutput(
                prompt_ids=prompt_ids,
                response_ids=response_ids,
                response_mask=[0 if failed else 1] * len(response_ids),
                response_logprobs=logprobs,
                reward_score=float(episode.episode_return) if last else None,
                num_turns=0 if row.placeholder else 2,
                metrics=AgentLoopMetrics() if row.placeholder else AgentLoopMetrics(generate_sequences=per_step_time),
                extra_fields=fields,
                # verl's postprocess turns images into multi_modal_inputs (pixel_values, image_grid_thw) and 3-D
                # rope positions for the actor; text rows leave the field unset, as before
                **({"multi_modal_data": {"images": images}} if images else {}),
            )
        )
    return outputs


def credit_images_due(credit: CreditLogOptions, row: dict[str, Any]) -> bool:
    """Whether the dataset row ``row`` is a training row (the trainer mode's draw field) of an iteration whose credit
    records are written (``credit.due(row["global_steps"])``), so its steps' images are stored; never validation."""
    return DRAW_FIELD in row and credit.due(int(row.get("global_steps") or 0))


def step_image_refs(episode: Episode, folder: str | Path) -> list[list[str]]:
    """Store each step's images as PNGs in ``folder`` (the run's ``credit/``); one list of their paths relative to
    ``folder`` per step, the ``image_refs`` of :func:`episode_to_outputs`."""
    return [save_images(step.images, folder) for step in episode.steps]


def _one_per_key(lock: threading.Lock, table: dict[str, Any], key: str, make: Any) -> Any:
    """``table[key]``, made by ``make(key)`` on first use, under ``lock`` (one worker-wide object per key)."""
    with lock:
        if key not in table:
            table[key] = make(key)
        return table[key]


@register(AGENT_LOOP_NAME)
class GiGPOEnvAgentLoop(AgentLoopBase):
    """Plays one environment episode per trajectory and returns one training row per step (see module doc)."""

    # worker-wide objects, each made once by the first agent loop that asks, under its own lock (making the
    # environment pool starts processes: it holds up no one who wants the thread pool or a writer)
    _executor: ClassVar[EnvThreadPool | None] = None
    _executor_lock: ClassVar[threading.Lock] = threading.Lock()
    #: environments are reused across the worker's episodes (building an ALFWorld engine is expensive)
    _env_pool: ClassVar[EnvPool | None] = None
    _env_pool_lock: ClassVar[threading.Lock] = threading.Lock()
    #: env.transcript_dir -> the writer of this process
    _transcripts: ClassVar[dict[str, TranscriptWriter]] = {}
    _transcripts_lock: ClassVar[threading.Lock] = threading.Lock()
    #: trainer.default_local_dir -> the writer of this process's logged validation episodes
    _episode_parts: ClassVar[dict[str, PartWriter]] = {}
    _episode_parts_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        settings = loop_settings(self.config)  # parsed once per process, not per trajectory
        self.episode_config, self.execution = settings.episode_config, settings.execution
        env_cfg = self.config.env
        self.default_env_name = env_cfg.get("name", None)
        self.env_kwargs = dict(env_cfg.get("kwargs", None) or {})
        # data.apply_chat_template_kwargs (AgentLoopBase reads it), e.g. enable_thinking=false for Qwen3; the local
        # engine passes the same key through the same reader
        self.encoder = ChatPromptEncoder(
            self.tokenizer,
            chat_template_kwargs=chat_template_kwargs_from(self.apply_chat_template_kwargs),
            processor=self.processor,  # verl's model_config.processor: None for a text model
        )
        trainer = self.config.get("trainer", None)
        self.episode_options, self.text_chars = settings.episode_options, settings.text_chars
        self.episode_parts = self.part_writer(str(trainer.default_local_dir)) if self.episode_options.enabled else None
        # trainer.credit_log_freq: the driver's records name the images this loop stores in <run dir>/credit/images/
        self.credit = settings.credit
        self.credit_dir = Path(str(trainer.default_local_dir)) / CREDIT_DIR if self.credit.enabled else None
        folder = env_cfg.get("transcript_dir", None)  # env.transcript_dir: every episode, one line per step
        self.transcripts = self.transcript_writer(str(folder)) if folder else None
        rollout = self.config.actor_rollout_ref.rollout
        self.seeded = settings.seeded
        self.rollout_seed, self.seed_param = int(rollout.get("seed", 0) or 0), seed_param(rollout.get("name", None))

    @classmethod
    def executor(cls) -> EnvThreadPool:
        """The worker-wide thread pool environment calls run in (``GIGPO_ENV_THREADS``, default 64)."""
        with cls._executor_lock:
            if cls._executor is None:
                threads = int(os.getenv("GIGPO_ENV_THREADS", "64"))
                cls._executor = EnvThreadPool(threads, name="gigpo-env")
            return cls._executor

    @classmethod
    def transcript_writer(cls, folder: str) -> TranscriptWriter:
        """The worker-wide writer of ``env.transcript_dir`` (one file per process)."""
        return _one_per_key(cls._transcripts_lock, cls._transcripts, folder, TranscriptWriter)

    @classmethod
    def part_writer(cls, run_dir: str) -> PartWriter:
        """The worker-wide writer of logged validation episodes (``<run_dir>/episodes_parts/``)."""
        return _one_per_key(cls._episode_parts_lock, cls._episode_parts, run_dir, PartWriter)

    def env_pool(self) -> EnvPool:
        """The worker-wide environment pool (``env.num_workers``; ``auto``: the node's cores over its agent-loop
        workers)."""
        cls = type(self)
        with cls._env_pool_lock:
            if cls._env_pool is None:
                agent_workers = int(self.config.actor_rollout_ref.rollout.agent.get("num_workers", 8) or 1)
                nodes = int(self.config.trainer.get("nnodes", 1) or 1)
                workers = self.execution.resolve_workers(engine_processes=math.ceil(agent_workers / nodes))
                cls._env_pool = EnvPool(num_workers=workers, execution=self.execution)
            return cls._env_pool

    def episode_seeds(self, task: TaskSpec, row: dict[str, Any]) -> EpisodeSeeds | None:
        """The request seeds of member ``session_id`` of ``task``'s group: training rows in their iteration's and
        draw's stream, others in the validation stream; None with ``env.seeded_sampling=false``."""
        if not self.seeded:
            return None
        draw = row.get(DRAW_FIELD)
        stream = VALIDATION_STREAM if draw is None else training_stream(int(row["global_steps"]), int(draw))
        return EpisodeSeeds(self.rollout_seed, stream, task, int(row.get("session_id", 0)), self.seed_param)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """Play the episode of the dataset row ``kwargs`` (env_name, seed, split, uid, session_id)."""
        env_name = kwargs.get("env_name") or self.default_env_name
        if not env_name:
            raise ValueError("the dataset row has no env_name and env.name is not set")
        if "seed" not in kwargs:
            raise ValueError(
                f"the dataset row has no 'seed' column (fields: {sorted(kwargs)}); write task rows with "
                "`python -m verl_gigpo.data.prepare`"
            )
        task = TaskSpec(
            env_name=str(env_name),
            seed=int(kwargs["seed"]),
            split=str(kwargs.get("split") or "train"),
            env_kwargs=self.env_kwargs,
        )
        traj_id = f"{kwargs.get('uid', 'nouid')}_{kwargs.get('session_id', 0)}"
        seeds = self.episode_seeds(task, kwargs)
        episode = await run_episode(
            task,
            generator=self.server_manager,
            encoder=self.encoder,
            tokenizer=self.tokenizer,
            config=self.episode_config,
            traj_id=traj_id,
            sampling_params=sampling_params,
            seeds=seeds,
            executor=self.executor(),
            env_pool=self.env_pool(),
            execution=self.execution,
        )
        if self.transcripts is not None:
            records = episode_records(episode, group=kwargs.get("uid", "nouid"), image_folder=self.transcripts.folder)
            self.transcripts.write(records)
        held = os.environ.get(HOLD_STREAM_ENV)
        if held and seeds is not None and seeds.stream.startswith(held):  # make e2e: a kill must land mid-rollout
            await asyncio.sleep(HOLD_S)
        options = self.episode_options
        # a row without the trainer mode's draw field is a validation row (as for the request seeds)
        if (
            self.episode_parts is not None
            and DRAW_FIELD not in kwargs
            and logged_validation(task.seed, int(kwargs.get("session_id", 0)), options.episodes)
        ):
            step = int(kwargs.get("global_steps", 0) or 0)
            self.episode_parts.write(episode_record(episode, kind="val", iteration=step, max_chars=options.max_chars))
        image_refs = None
        if credit_images_due(self.credit, kwargs) and any(step.images for step in episode.steps):
            image_refs = await asyncio.to_thread(step_image_refs, episode, self.credit_dir)
        placeholder = []
        if not episode.steps:
            placeholder = self.tokenizer.encode(f"environment {env_name} failed: {episode.env_error}")[:64] or [0]
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        version = kwargs.get("global_steps")
        return episode_to_outputs(
            episode,
            placeholder_prompt_ids=placeholder,
            eos_id=eos,
            weight_version=int(version) - 1 if version is not None else None,
            text_chars=self.text_chars,
            image_refs=image_refs,
        )


check_contract(__name__)  # register and AgentLoopBase, as verl 0.9.1 defines them
