"""The ``gigpo_sync`` verl V1 trainer mode: verl's synchronous PPO trainer with a GiGPO advantage step.

Select it with ``trainer.v1.trainer_mode=gigpo_sync`` (``verl_gigpo/config/gigpo_trainer.yaml`` does). The advantage
step reads the agent loop's step rows from TransferQueue and runs the step-credit estimators (and grpo/rloo) on them,
with verl's padding rows and failed episodes excluded; other estimators go to verl unchanged. The actor update is
split by rows (``trainer.v1.gigpo_sync.mini_batch_rows``). Every overridden verl member is a row of
:data:`verl_gigpo.verl_glue.contract.CONTRACT`, checked at import. Why each override exists, and why not verl's own
mini-batch setting: docs/verl-integration.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import response_to_nested

from verl_gigpo import AGENT_LOOP_NAME, STEP_CREDIT_ESTIMATORS, TRAINER_MODE, verl_logger
from verl_gigpo.advantage import GiGPOTerms
from verl_gigpo.advantage.outcome import OUTCOME_ESTIMATORS, outcome_advantages
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.rules import (
    Range,
    ValidationSampling,
    group_size_warning,
    kl_in_reward_problem,
    penalty_mode,
    training_sampling_problem,
    validation_sampling,
)
from verl_gigpo.credit.records import CreditLogger, CreditLogOptions
from verl_gigpo.rollout import metrics as rollout_metrics
from verl_gigpo.rollout.dynamic import DynamicSampling
from verl_gigpo.rollout.episode_log import (
    EpisodeLog,
    EpisodeLogOptions,
    drain_parts,
    logger_names,
    training_records,
)
from verl_gigpo.rollout.health import HealthMonitor, HealthOptions
from verl_gigpo.rollout.seeding import DRAW_FIELD
from verl_gigpo.rollout.step_rows import StepBatch, UpdateSettings
from verl_gigpo.verl_glue.contract import CONTRACT, check_contract
from verl_gigpo.verl_glue.dead_actor import ActorWatch, guard_replay_buffer
from verl_gigpo.verl_glue.verl_version import VerlMismatchError, check_verl_version, installed_verl_version

__all__ = [
    "OVERRIDDEN",
    "GiGPOTrainerSync",
    "MiniBatchPlan",
    "StepBatch",
    "UpdateSettings",
    "apply_validation_sampling",
    "episode_metrics",
    "plan_mini_batches",
    "planned_update_actor",
    "validation_type_metrics",
]

logger = verl_logger(__name__)

check_verl_version(installed_verl_version())  # the overrides below were checked against these verl versions only


@dataclass(frozen=True)
class MiniBatchPlan:
    """One iteration's split: ``rows`` before padding, ``mini_batch_rows`` per optimizer step, ``num_mini_batches``
    optimizer steps per PPO epoch."""

    rows: int
    mini_batch_rows: int
    num_mini_batches: int


def plan_mini_batches(rows: int, max_rows: int, multiple: int) -> MiniBatchPlan:
    """Split ``rows`` step rows into equal mini-batches of at most about ``max_rows`` rows (docs/verl-integration.md).

    ``k = ceil(rows / max_rows)``, ``m = ceil(ceil(rows / k) / multiple) * multiple``; ValueError if any input < 1.
    """
    if rows < 1 or max_rows < 1 or multiple < 1:
        raise ValueError(f"rows ({rows}), max_rows ({max_rows}) and multiple ({multiple}) must all be >= 1")
    k = math.ceil(rows / max_rows)
    m = math.ceil(math.ceil(rows / k) / multiple) * multiple
    return MiniBatchPlan(rows=rows, mini_batch_rows=m, num_mini_batches=math.ceil(rows / m))


def episode_metrics(steps: StepBatch) -> dict[str, float]:
    """``env/*`` and ``episode/*`` metrics of a batch of step rows, padding excluded (docs/metrics.md)."""
    return rollout_metrics.episode_metrics(steps.trajectory_summaries())


def validation_type_metrics(data_sources: list, infos: dict[str, list]) -> dict[str, float]:
    """``val-core/<data_source>/<type>/*`` from verl's per-episode ``data_sources`` and ``reward_extra_infos_dict``
    (``infos``); episodes without a ``task_type`` are left out."""
    types = infos.get("task_type")
    if not types:
        return {}
    by_source: dict[str, list[rollout_metrics.TrajectorySummary]] = {}
    for i, task_type in enumerate(types):
        if task_type is None:
            continue

        def value(key: str, i: int = i) -> float:
            column = infos.get(key) or []
            return float(column[i]) if i < len(column) and column[i] is not None else 0.0

        summary = rollout_metrics.TrajectorySummary(
            won=value("acc") > 0.5,
            length=int(value("episode_length")),
            episode_return=value("reward"),
            num_invalid=int(value("invalid_actions")),
            env_error=value("env_error") > 0.5,
            task_type=str(task_type) or None,
        )
        by_source.setdefault(str(data_sources[i]), []).append(summary)
    out: dict[str, float] = {}
    for source, summaries in sorted(by_source.items()):
        out.update(rollout_metrics.type_metrics(source, summaries))
    return out


def apply_validation_sampling(config: Any) -> ValidationSampling:
    """Write validation's sampling into ``config.actor_rollout_ref.rollout.val_kwargs`` (in place; ``do_sample``
    false: temperature 0, top_p 1, top_k -1), log it once and return it (docs/verl-integration.md, item 1)."""
    val_kwargs = config.actor_rollout_ref.rollout.val_kwargs
    sampling = validation_sampling(val_kwargs)
    if sampling.greedy:
        with open_dict(val_kwargs):
            val_kwargs.update(sampling.params)
        (logger.warning if sampling.ignored else logger.info)(sampling.message)
    return sampling


@contextmanager
def planned_update_actor(worker_group: Any, plan: MiniBatchPlan, *, shuffle: bool) -> Iterator[None]:
    """While open, ``worker_group.update_actor(data)`` runs verl's with ``plan.mini_batch_rows`` rows per
    mini-batch and ``shuffle`` in ``data.extra_info`` (docs/verl-integration.md, item 6).

    Raises:
        VerlMismatchError: the block ended without calling ``worker_group.update_actor``.
    """
    verl_update_actor = worker_group.update_actor
    calls = []

    def update_actor(data: KVBatchMeta, *args: Any, **kwargs: Any) -> Any:
        data.extra_info["global_batch_size"] = plan.mini_batch_rows
        data.extra_info["mini_batch_size"] = plan.mini_batch_rows
        data.extra_info["dataloader_kwargs"] = {**data.extra_info.get("dataloader_kwargs", {}), "shuffle": shuffle}
        calls.append(plan)
        return verl_update_actor(data, *args, **kwargs)

    own = "update_actor" in vars(worker_group)  # RayWorkerGroup binds its remote methods on the instance
    worker_group.update_actor = update_actor
    try:
        yield
    finally:
        if own:
            worker_group.update_actor = verl_update_actor
        else:
            del worker_group.update_actor
    if not calls:
        raise VerlMismatchError(
            "PPOTrainer._update_actor",
            "calls self.actor_rollout_wg.update_actor(batch) once",
            "it did not call it",
            use="trainer.v1.gigpo_sync.mini_batch_rows (the planned split was not applied)",
        )


@register_trainer(TRAINER_MODE)
class GiGPOTrainerSync(PPOTrainerSync):
    """verl's synchronous V1 PPO trainer with GiGPO's advantage step and a row-split actor update; each override is
    explained in docs/verl-integration.md."""

    def __init__(self, config: Any):
        algorithm = config.algorithm
        # per-step credit records every trainer.credit_log_freq iterations, in trainer.default_local_dir/credit
        credit = CreditLogOptions.from_trainer(config.trainer, estimator=algorithm.adv_estimator)
        self.credit_logger = CreditLogger(credit, config.trainer.default_local_dir)
        # whole episodes (trainer.log_episodes*): validation ones from the agent loops' parts, training ones here
        self.episode_options = EpisodeLogOptions.from_trainer(config.trainer)
        self.episode_log = EpisodeLog(
            config.trainer.default_local_dir,
            loggers=logger_names(config.trainer.get("logger", None)),
            project=str(config.trainer.get("project_name", "verl_gigpo")),
            experiment=str(config.trainer.get("experiment_name", "run")),
        )
        if algorithm.adv_estimator in STEP_CREDIT_ESTIMATORS:
            problem = kl_in_reward_problem(algorithm.get("use_kl_in_reward", False), algorithm.adv_estimator)
            if problem:  # verl_gigpo.verl_glue.preflight says it before Ray; this covers verl's own entry point
                raise ValueError(problem)
            self.gigpo_config = GiGPOConfig.from_algorithm(algorithm, env=config.get("env", None))
            agent = config.actor_rollout_ref.rollout.agent.default_agent_loop
            if agent != AGENT_LOOP_NAME:
                logger.warning(
                    "adv_estimator=%s with default_agent_loop=%s: rows must carry the step fields of the %r "
                    "agent loop (set an agent_name column in the dataset, or the default agent loop)",
                    algorithm.adv_estimator,
                    agent,
                    AGENT_LOOP_NAME,
                )
            warning = group_size_warning(
                algorithm.adv_estimator,
                config.actor_rollout_ref.rollout.n,
                step_advantage_w=self.gigpo_config.step_advantage_w,
            )
            if warning:
                logger.warning(warning)
        rollout = config.actor_rollout_ref.rollout
        problem = training_sampling_problem(rollout.get("do_sample", True), rollout.temperature)
        if problem:  # verl_gigpo.verl_glue.preflight says it before Ray; this covers verl's own entry point
            raise ValueError(problem)
        self.validation_sampling = apply_validation_sampling(config)  # before verl builds any agent-loop worker
        self.update_settings = UpdateSettings.from_config(config)
        self.global_steps = 0  # verl sets it in init() (_load_checkpoint); the advantage step may run before that
        self._rows_to_split: int | None = None
        self.mini_batch_plan: MiniBatchPlan | None = None
        self._logprob_checked = False  # the launch's first bypass-mode iteration recomputes old log-probs
        self._draws: tuple[int, int] = (0, 0)  # (global_steps, training tasks drawn in it so far)
        # training-health alarms (trainer.health), checked in _compute_metrics; health.jsonl in the run folder
        kl_key = "actor/kl_loss" if config.actor_rollout_ref.actor.get("use_kl_loss", False) else "actor/ppo_kl"
        options = HealthOptions.from_trainer(config.trainer)
        self.health = HealthMonitor(options, kl_key=kl_key, run_dir=config.trainer.default_local_dir)
        super().__init__(config)
        if getattr(self, "registered_mode", None) != config.trainer.v1.trainer_mode:  # set through our setter
            raise VerlMismatchError(
                "PPOTrainer.__init__",
                "it sets self.trainer_mode from trainer.v1.trainer_mode",
                "it did not",
                use="gigpo_sync trainer mode (its trainer_mode property)",
            )

    # verl switches its synchronous code paths on the literal trainer_mode == "sync" (docs/verl-integration.md, item 2)
    @property
    def trainer_mode(self) -> str:
        """Always ``"sync"`` for verl's internal checks (the registered name is :data:`TRAINER_MODE`)."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        """verl's, after numbering the batch's rows as this iteration's next training draws (:data:`DRAW_FIELD`)."""
        step, drawn = self._draws if self._draws[0] == self.global_steps else (self.global_steps, 0)
        tu.assign_non_tensor_stack(batch, DRAW_FIELD, list(range(drawn, drawn + len(batch))))
        self._draws = (step, drawn + len(batch))
        return super()._submit_batch_to_rollout(batch)

    def _build_replay_buffer(self):
        """verl's replay buffer, or the dynamic-sampling one, polling every ``trainer.v1.sampler.poll_interval`` s
        (null: verl's 2 s) and watching for dead actors; ValueError on a bad interval or ``filter_groups`` option."""
        dynamic = DynamicSampling.from_algorithm(self.config.algorithm)
        buffer = self._dynamic_replay_buffer(dynamic) if dynamic.enable else super()._build_replay_buffer()
        interval = (self.config.trainer.v1.get("sampler") or {}).get("poll_interval")
        if interval is not None:
            Range(
                "trainer.v1.sampler.poll_interval",
                "float",
                "seconds between verl's ReplayBuffer's checks of TransferQueue for finished rollouts; null = verl's 2",
                low=0,
                low_open=True,
            ).check(interval)
            buffer.poll_interval = float(interval)
        return guard_replay_buffer(buffer, ActorWatch(self._watched_actors))

    def _watched_actors(self) -> list[Any]:
        """The Ray actors whose death would leave verl waiting on rollouts: agent-loop workers, rollout servers."""
        manager = getattr(self, "agent_loop_manager", None)
        handles = list(getattr(manager, "agent_loop_workers", None) or [])
        servers = getattr(self, "llm_server_manager", None)
        for replica in servers.get_replicas() if servers is not None else []:
            handles.extend(getattr(replica, "servers", None) or [])
        return handles

    def _dynamic_replay_buffer(self, dynamic: DynamicSampling) -> Any:
        """The dynamic-sampling replay buffer, built with verl's sync-buffer arguments plus the keep test's settings;
        ValueError with a ``trainer.v1.sampler.custom_sampler``."""
        # imported here: importing verl's replay_buffer module first imports verl.trainer.ppo.v1, whose import hook
        # (verl_gigpo.plugin) imports this module
        from verl_gigpo.verl_glue.replay_buffer import DynamicReplayBuffer

        sampler = self.config.trainer.v1.sampler
        custom = sampler.get("custom_sampler", None) or {}
        if custom.get("path") or custom.get("name"):
            raise ValueError(
                "algorithm.filter_groups.enable=true runs this package's replay buffer "
                "(verl_gigpo.verl_glue.replay_buffer); "
                f"it cannot be combined with trainer.v1.sampler.custom_sampler={dict(custom)}"
            )
        filter_groups = self.config.algorithm.filter_groups
        return DynamicReplayBuffer(
            trainer_mode=self.trainer_mode,
            trainer_config=self.config.trainer.v1.get(self.trainer_mode, {}),
            max_off_policy_threshold=sampler.max_off_policy_threshold,
            max_off_policy_strategy=sampler.max_off_policy_strategy,
            sampler_kwargs=sampler.sampler_kwargs,
            refill_fn=self._add_prompts_to_generate,
            sync_refill_failed_groups=bool(sampler.get("sync_refill_failed_groups", False)),
            train_batch_size=self.config.data.train_batch_size,
            gen_batch_size=1,
            max_inflight_gen_batches=filter_groups.get("max_inflight_gen_batches", 1),
            dynamic=dynamic,
            gigpo=getattr(self, "gigpo_config", None),
            penalty_mode=penalty_mode(self.config.get("env", None) or {}),
        )

    # ------------------------------------------------------------------ mini-batches counted in rows
    # the three overrides below change only verl's padding multiple, mini-batch size and shuffle flag
    # (docs/verl-integration.md, items 4-6)

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's balancing, during which ``_get_required_batch_multiple`` knows the row count and plans the split."""
        with self._splitting(len(batch)):
            return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    @contextmanager
    def _splitting(self, rows: int) -> Iterator[None]:
        """While open, :meth:`_get_required_batch_multiple` plans the split of ``rows`` step rows."""
        self._rows_to_split = rows
        try:
            yield
        finally:
            self._rows_to_split = None

    def _micro_multiple(self) -> int:
        """Rows every worker call needs per data-parallel rank: the lcm of the fixed micro-batch sizes."""
        arr = self.config.actor_rollout_ref
        sizes = []
        if not arr.actor.get("use_dynamic_bsz", False):
            sizes.append(arr.actor.get("ppo_micro_batch_size_per_gpu"))
        if not arr.rollout.get("log_prob_use_dynamic_bsz", False):
            sizes.append(arr.rollout.get("log_prob_micro_batch_size_per_gpu"))
        if self.use_reference_policy and not arr.ref.get("log_prob_use_dynamic_bsz", False):
            sizes.append(arr.ref.get("log_prob_micro_batch_size_per_gpu"))
        return math.lcm(1, *(int(x) for x in sizes if x))

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        """Inside :meth:`_balance_batch` with ``mini_batch_rows`` set: the planned mini-batch size (kept in
        :attr:`mini_batch_plan`); otherwise verl's."""
        rows, max_rows = self._rows_to_split, self.update_settings.mini_batch_rows
        if rows is None:  # not verl's padding call: verl's answer, this iteration's plan untouched
            return super()._get_required_batch_multiple(dp_size)
        if max_rows is None or self.use_critic or self.config.trainer.critic_warmup > self.global_steps:
            self.mini_batch_plan = None
            return super()._get_required_batch_multiple(dp_size)
        self.mini_batch_plan = plan_mini_batches(rows, max_rows, dp_size * self._micro_multiple())
        return self.mini_batch_plan.mini_batch_rows

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update with this iteration's plan (used once) and the row shuffle."""
        plan, self.mini_batch_plan = self.mini_batch_plan, None
        if plan is None:
            return super()._update_actor(batch, metrics)
        metrics["update/rows"] = float(plan.rows)
        metrics["update/mini_batch_rows"] = float(plan.mini_batch_rows)
        metrics["update/num_mini_batches"] = float(plan.num_mini_batches)
        with planned_update_actor(self.actor_rollout_wg, plan, shuffle=self.update_settings.shuffle_rows):
            return super()._update_actor(batch, metrics)

    # ------------------------------------------------------------------ old log-probs in bypass mode
    def _logprob_check_due(self) -> bool:
        """Whether bypass mode recomputes old log-probs now: first iteration, then every ``logprob_check_freq``-th."""
        freq = self.update_settings.logprob_check_freq
        if freq == 0:
            return False
        return not self._logprob_checked or self.global_steps % freq == 0

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's old-log-prob step; in bypass mode, verl's full pass on the iterations :meth:`_logprob_check_due`
        picks (docs/verl-integration.md, item 8)."""
        correction = self.config.algorithm.get("rollout_correction", None)
        if correction is None or not correction.get("bypass_mode", False) or not self._logprob_check_due():
            return super()._compute_old_log_prob(batch, metrics)
        self._logprob_checked = True
        with open_dict(correction):
            correction.bypass_mode = False  # read by verl's _compute_old_log_prob, for this call only
        try:
            return super()._compute_old_log_prob(batch, metrics)
        finally:
            with open_dict(correction):
                correction.bypass_mode = True

    # ------------------------------------------------------------------ training health
    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch):
        """verl's metrics, then the training-health checks (``health/*``) on the iteration's whole ``metrics``."""
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        self._check_health(metrics, int(global_steps))

    def _check_health(self, metrics: dict, step: int) -> None:
        """``health/*`` into ``metrics``; stop on a new alarm with ``action=stop``; the summary on the last step."""
        metrics.update(self.health.observe(step, metrics))
        stop = self.health.stop_requested
        if stop:
            self._stop_for_health(step)
        if stop or step >= self.total_training_steps:
            logger.info(self.health.summary())

    def _stop_for_health(self, step: int) -> None:
        """``trainer.health.action=stop``: checkpoint unless ``fit`` saved one, one line, end ``fit``."""
        save_freq = self.config.trainer.save_freq
        if not (save_freq > 0 and (step % save_freq == 0 or step >= self.total_training_steps)):
            self._save_checkpoint()
        signals = sorted({a.signal for a in self.health.alarms if a.iteration == step})
        logger.warning(
            "stopped at iteration %d by trainer.health.action=stop (%s); checkpoint %s/global_step_%d; resume with "
            "the same command (trainer.resume_mode=auto resumes from it), adding trainer.health.ignore=[%s] to "
            "silence",
            step,
            ", ".join(signals),
            self.config.trainer.default_local_dir,
            step,
            ",".join(signals),
        )
        self.total_training_steps = step  # fit() loops while global_steps <= total_training_steps

    # ------------------------------------------------------------------ validation per task type
    def _val_metrics_update(
        self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns, expected_acc_counts=None
    ) -> dict[str, float]:
        """verl's validation metrics plus :func:`validation_type_metrics` (``task_type``, ``env_error`` removed)."""
        infos = dict(reward_extra_infos_dict)
        by_type = validation_type_metrics(data_sources, infos)
        infos.pop("task_type", None)
        infos.pop("env_error", None)
        metrics = super()._val_metrics_update(
            data_sources, sample_uids, infos, sample_turns, expected_acc_counts=expected_acc_counts
        )
        return {**metrics, **by_type}

    def _read_steps(self, batch: KVBatchMeta) -> tuple[StepBatch, TensorDict]:
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "response_mask", "extra_fields"]
        )
        is_padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        steps = StepBatch.from_rows(list(data["uid"]), list(data["extra_fields"]), is_padding)
        return steps, data

    def _write_credit(self, terms: GiGPOTerms, steps: StepBatch) -> None:
        """Every ``trainer.credit_log_freq`` iterations, the per-step credit records (:mod:`verl_gigpo.credit`)."""
        if not self.credit_logger.options.enabled or not self.credit_logger.due(self.global_steps):
            return
        self.credit_logger.write(self.global_steps, terms, steps)

    def _validate(self) -> dict[str, float]:
        """verl's validation, then the episodes the agent loops wrote (``trainer.log_episodes``)."""
        metrics = super()._validate()
        if self.episode_options.enabled:
            self.episode_log.write(drain_parts(self.config.trainer.default_local_dir), step=self.global_steps)
        return metrics

    def _log_training_episodes(self, steps: StepBatch, terms: GiGPOTerms | None, advantages: Any) -> None:
        """Every ``trainer.log_episodes_train_freq`` iterations, the first trajectory of the first groups."""
        options = self.episode_options
        if not options.train_due(self.global_steps):
            return
        records = training_records(
            steps,
            n=options.episodes,
            iteration=self.global_steps,
            max_chars=options.max_chars,
            terms=terms,
            advantages=advantages,
        )
        self.episode_log.write(records, step=self.global_steps)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """Env/episode metrics, then the step-credit or grpo/rloo advantages (verl's for other estimators and with
        ``use_kl_in_reward``)."""
        steps, data = self._read_steps(batch)
        metrics.update(episode_metrics(steps))
        estimator = self.config.algorithm.adv_estimator
        outcome = estimator in OUTCOME_ESTIMATORS and not self.config.algorithm.get("use_kl_in_reward", False)
        if estimator not in STEP_CREDIT_ESTIMATORS and not outcome:
            return super()._compute_advantage(batch, metrics)

        nested_mask = data["response_mask"]
        response_mask = nested_mask.to_padded_tensor(0)  # (N, L)
        fields: dict[str, torch.Tensor] = {}
        correction = self._rollout_correction(batch, response_mask, metrics)
        if correction is not None:  # verl's IS weights / rejection, applied before the advantages as verl does
            response_mask = correction["response_mask"]  # (N, L), rejected tokens 0
            fields.update(correction)
        if outcome:  # one advantage per trajectory, broadcast over its tokens; returns = advantages, as verl's
            norm = bool(self.config.algorithm.get("norm_adv_by_std_in_grpo", True))
            env = self.config.get("env", None) or {}
            per_row = outcome_advantages(  # (N,)
                steps,
                estimator,
                norm_adv_by_std=norm,
                penalty_mode=penalty_mode(env),
                invalid_action_penalty=float(env.get("invalid_action_penalty", 0.0) or 0.0),
            )
            advantages = torch.as_tensor(per_row, dtype=torch.float32)[:, None] * response_mask  # (N, L)
            fields.update(advantages=advantages, returns=advantages)
            self._log_training_episodes(steps, None, per_row)  # trainer.log_episodes_train_freq
        else:
            terms = steps.advantage_terms(self.gigpo_config, response_mask)  # the entry both engines use
            advantages, returns = terms.token_level(response_mask)  # (N, L), (N, L)
            self._write_credit(terms, steps)  # trainer.credit_log_freq
            self._log_training_episodes(steps, terms, None)  # trainer.log_episodes_train_freq
            metrics.update(terms.stats)
            fields.update(advantages=advantages, returns=returns)
        output = TensorDict(
            {name: response_to_nested(value, nested_mask) for name, value in fields.items()}, batch_size=len(batch)
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    def _rollout_correction(
        self, batch: KVBatchMeta, response_mask: torch.Tensor, metrics: dict
    ) -> dict[str, torch.Tensor] | None:
        """verl's rollout correction for the GiGPO path, under verl's condition: None when it does not apply, else
        ``response_mask`` (N, L) after rejection and, with ``rollout_is``, ``rollout_is_weights`` (N, L)."""
        from verl import DataProto
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        config = self.config.algorithm.get("rollout_correction", None)
        if config is None or config.get("bypass_mode", False):
            return None
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["old_log_probs", "rollout_log_probs"]
        )
        if "rollout_log_probs" not in data.keys() or "old_log_probs" not in data.keys():
            return None
        width = response_mask.shape[1]
        tensors = {name: data[name].to_padded_tensor(0.0)[:, :width] for name in ("old_log_probs", "rollout_log_probs")}
        proto = DataProto.from_dict(tensors={**tensors, "response_mask": response_mask})
        proto, corr_metrics = compute_rollout_correction_and_add_to_batch(proto, config)
        metrics.update(corr_metrics)
        out = {"response_mask": proto.batch["response_mask"]}
        if "rollout_is_weights" in proto.batch.keys():
            out["rollout_is_weights"] = proto.batch["rollout_is_weights"]
        return out


#: the members of verl's trainer that :class:`GiGPOTrainerSync` overrides, from the contract table
OVERRIDDEN = tuple(e.name for e in CONTRACT if e.ours == __name__ and e.kind == "overrides" and e.guard == "signature")
check_contract(__name__)  # the overrides above, trainer_mode, and the trainer members and literals this module reads
