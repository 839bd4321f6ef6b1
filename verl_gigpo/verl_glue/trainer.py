"""The ``gigpo_sync`` verl V1 trainer mode: verl's synchronous PPO trainer with a GiGPO advantage step.

Select it with ``trainer.v1.trainer_mode=gigpo_sync`` (``verl_gigpo/config/gigpo_trainer.yaml`` does). What it does:

* every estimator: the rows' ``extra_fields`` (written by the ``gigpo_env_agent`` agent loop) are read from
  TransferQueue and turned into ``env/*`` and ``episode/*`` metrics;
* ``algorithm.adv_estimator=gigpo`` (or a successor: ``hgpo``, ``graphgpo``, ``g2po``): per-step rewards, trajectory
  ids, step ids, anchor keys, episode outcomes and action validity go to the configured estimator,
  :meth:`verl_gigpo.config.GiGPOConfig.advantage_terms`, through :meth:`StepBatch.advantage_terms` (as on the local
  engine); verl's padding rows (tag ``is_padding``, deep
  copies of a real row) and rows of episodes whose environment failed are excluded from every statistic and get 0;
  advantages/returns are written back to TransferQueue; ``gigpo/*`` metrics come from the estimator;
* ``grpo`` and ``rloo``: verl's own ``core_algos`` functions on one score per trajectory (its return), the rows of
  failed episodes and verl's padding rows excluded as above, each trajectory's advantage broadcast to its rows
  (:func:`verl_gigpo.advantage.outcome.outcome_advantages`, which the local engine calls too). With no failed
  episode, GRPO equals verl's own V1 step (the final row of each session). With ``algorithm.use_kl_in_reward``,
  verl's own ``_compute_advantage`` runs unchanged;
* any other estimator: verl's own ``_compute_advantage``, unchanged, on the same rollouts;
* verl's rollout correction (``algorithm.rollout_correction.rollout_is`` / ``rollout_rs``) runs on the GiGPO path
  too, through verl's own ``compute_rollout_correction_and_add_to_batch``, before the advantages (as verl does);
* the actor update is split by rows, not by tasks (``trainer.v1.gigpo_sync``, every estimator): verl 0.9.1 makes
  mini-batches of ``ppo_mini_batch_size * rollout.n`` rows, which for one row per environment step means an
  optimizer step per ~one task's trajectories (up to ~50 per ALFWorld iteration). With ``mini_batch_rows: M`` the R
  rows of an iteration are split into ``k = ceil(R / M)`` equal mini-batches (see :func:`plan_mini_batches`),
  shuffled across groups first (``shuffle_rows``). The reference implementation keeps ``rollout.n = 1`` (groups
  come from its environments), so its actor takes ``ppo_mini_batch_size`` step rows per optimizer step:
  ``M = 256`` there gives ~25 optimizer steps for a 6,400-row ALFWorld iteration.

Why not verl's public route. verl's own setting, ``actor.ppo_mini_batch_size = mini_batch_rows / rollout.n`` with
``actor.shuffle=true``, was measured against the plan through verl's own code (``PPOTrainer.
_get_required_batch_multiple``, its padding rule, ``PPOTrainer._update_actor`` and the split of ``TrainingWorker.
train_mini_batch``; ``tests/test_trainer_update_plan.py``, "verl's public route") for step-row counts that are no
multiple of n. It takes the same rows (each once per epoch, shuffled) in the same number of optimizer steps,
``ceil(R / M)``, but not the same split, and verl refuses it at the reference's settings:

* verl pads the batch to a multiple of ``ppo_mini_batch_size * n = M`` whatever R is: up to M - 1 padding rows
  (verl's 128-token no-op rows, through the old-log-prob, reference and update passes), which the shuffle scatters
  over the mini-batches, so their real rows differ (R = 2,500, M = 2,048: 1,596 padding rows and mini-batches of
  ~1,250 real rows each at random, against the plan's 2 x 1,256 rows with 12 padding rows; R = 5, M = 256: one
  mini-batch of 5 rows and 251 padding rows). The plan adapts the mini-batch size to R (:func:`plan_mini_batches`),
  fewer than ``multiple`` padding rows per mini-batch; the splits agree only when ``ceil(R / ceil(R / M))`` rounds
  to M;
* verl's ``ActorConfig.validate`` (run by ``verl.utils.config.validate_config``) refuses ``ppo_mini_batch_size``
  above ``data.train_batch_size`` (without dynamic batch sizes): the ALFWorld reference (16 tasks, n = 8,
  M = 256) would need 32;
* ``rollout.n`` must divide M (n = 6 cannot give 256 rows).

So the overrides 4-6 below and the ``update_actor`` swap stay.

Contract with verl. :class:`GiGPOTrainerSync` subclasses ``verl.trainer.ppo.v1.PPOTrainerSync`` and is registered
with ``verl.trainer.ppo.v1.register_trainer``. It overrides or wraps these members of ``PPOTrainer``
(``verl.trainer.ppo.v1.trainer_base``, verl 0.9.1); each is private to verl and may change in another release. Two
guards (:mod:`verl_gigpo.verl_glue.verl_version`) run when this module is imported: the version guard
(:data:`~verl_gigpo.verl_glue.verl_version.SUPPORTED_VERL_VERSIONS`), then the entries of this module in
:data:`verl_gigpo.verl_glue.contract.CONTRACT` (:func:`~verl_gigpo.verl_glue.contract.check_contract`),
which refuse a verl whose overridden methods (:data:`OVERRIDDEN`) are gone or take other parameters, and a
``trainer_mode`` that became a class member; the constructor and :func:`planned_update_actor` check the two
behaviours they rely on at run time (a :class:`~verl_gigpo.verl_glue.verl_version.VerlMismatchError` each):

1. ``__init__`` — wrapped: reads and checks the GiGPO config first, refuses greedy training rollouts, and makes
   ``val_kwargs.do_sample=false`` greedy (:func:`apply_validation_sampling`), then verl's. verl's
   ``verl.trainer.main_ppo.TaskRunnerV1.run`` builds the trainer and then the agent-loop manager from the same
   config object, so the agent-loop workers receive the greedy settings.
2. ``trainer_mode`` (an attribute verl's ``__init__`` sets from ``trainer.v1.trainer_mode``) — replaced by a
   property that reads ``"sync"``; its setter keeps the registered name (:data:`~verl_gigpo.TRAINER_MODE`) in
   ``registered_mode`` (checked after verl's ``__init__``). Why not the registered name: verl compares the attribute
   with the literal ``"sync"`` to pick its synchronous code paths (``_build_replay_buffer``: ``ReplayBuffer`` vs
   ``ReplayBufferAsync``; ``_init_dataloader``'s exact refill; ``_load_checkpoint``, ``_save_checkpoint``,
   ``_reissue_inflight_prompts``, ``_submit_batch_to_rollout``) and
   reads ``trainer.v1.<trainer_mode>.*`` settings (``parameter_sync_step``, the buffer's ``trainer_config``); this
   mode IS synchronous PPO and uses verl's ``trainer.v1.sync`` settings, so reporting another name would need every
   one of those methods overridden.
3. ``_build_replay_buffer`` — wrapped: sets ``ReplayBuffer.poll_interval`` (the constructor's default, 2 s, no config
   key) from ``trainer.v1.sampler.poll_interval``; with ``algorithm.filter_groups.enable`` (dynamic sampling) it
   builds :class:`verl_gigpo.verl_glue.replay_buffer.DynamicReplayBuffer` instead of verl's ``ReplayBuffer``, with the
   arguments verl gives its sync buffer when ``filter_groups`` is enabled; that module lists the buffer members it
   relies on. Either buffer then checks, before each poll (``ReplayBuffer._wait_for_next_poll``) and after each
   ``sample``, that the agent-loop workers (``agent_loop_manager.agent_loop_workers``, set by ``fit``) and the
   rollout servers (``llm_server_manager.get_replicas()``; each replica's ``servers``) are alive
   (:func:`verl_gigpo.verl_glue.dead_actor.guard_replay_buffer`): verl's ``sample`` waits without a deadline.
4. ``_balance_batch`` — wrapped: while verl's runs, the number of rows before padding is known to the
   ``_get_required_batch_multiple(dp_size)`` call it makes (:meth:`GiGPOTrainerSync._splitting`): verl passes that
   call the data-parallel size only, and the plan needs the row count. The count lives for that one call, so the
   result does not depend on verl's later call order; the plan it makes is used by the same iteration's
   ``_update_actor`` and then dropped.
5. ``_get_required_batch_multiple`` — replaced when ``mini_batch_rows`` is set (the planned mini-batch size), verl's
   otherwise and outside ``_balance_batch``.
6. ``_update_actor`` — wrapped: verl writes ``ppo_mini_batch_size * rollout.n`` into the batch's ``extra_info`` and
   calls ``self.actor_rollout_wg.update_actor(batch)`` with no hook in between; :func:`planned_update_actor` swaps
   that one method on the worker group for the duration of the call (verl binds it on the instance,
   ``WorkerGroup._bind_worker_method``) and refuses an update that never called it.
7. ``_compute_advantage`` — replaced for the step-credit estimators and for grpo/rloo without ``use_kl_in_reward``,
   verl's for the others; its rollout correction uses verl's condition (configured, not bypass mode, rollout
   log-probs present) and function (``verl.trainer.ppo.rollout_corr_helper.
   compute_rollout_correction_and_add_to_batch``).
8. ``_compute_old_log_prob`` — wrapped: in bypass mode (``algorithm.rollout_correction.bypass_mode``: rollout
   log-probs copied as the old ones, no actor pass, so neither ``actor/entropy`` nor the rollout-vs-actor metrics)
   it runs verl's own non-bypass branch on the checked iterations (``trainer.v1.gigpo_sync.logprob_check_freq``) by
   turning ``bypass_mode`` off for that one call.
9. ``_submit_batch_to_rollout`` — wrapped: numbers the iteration's training draws (:data:`~verl_gigpo.rollout.
   seeding.DRAW_FIELD`, a non-tensor column of each submitted row; a later dynamic-sampling refill continues the
   count), which the agent loop's request seeds read (:mod:`verl_gigpo.rollout.seeding`); then verl's.
10. ``_validate`` — wrapped: verl's, then, with ``trainer.log_episodes``, the validation episodes the agent loops
    wrote to ``episodes_parts/`` are gathered and logged (:mod:`verl_gigpo.rollout.episode_log`; verl's ``fit``
    logs the validation's metrics after ``_validate`` returns, at the same step).
11. ``_val_metrics_update`` — wrapped: verl's ``_validate`` hands it every validation episode's final-row
    ``reward_extra_info`` (lists by key) and data source; the per-type ``val-core/<data_source>/<type>/*`` keys
    (:func:`verl_gigpo.rollout.metrics.type_metrics`, the local engine's function) are computed from the agent
    loop's ``acc``, ``episode_length``, ``invalid_actions``, ``task_type`` and ``env_error``, and the last two are
    removed before verl's statistics (which average every key).
12. ``_compute_metrics`` — wrapped: verl's V1 ``fit()`` has no per-iteration hook; this member runs once per
    iteration with the iteration's whole metrics dict (validation included) just before ``fit`` logs it, so the
    training-health checks run there (:class:`~verl_gigpo.rollout.health.HealthMonitor`, ``trainer.health``) and add
    ``health/*``. With ``action=stop`` it saves a checkpoint (verl's ``_save_checkpoint``, unless ``fit`` saved this
    iteration) and sets ``total_training_steps`` to this iteration, which ends ``fit``'s loop after the log.

It reads verl's attributes ``config``, ``use_critic``, ``use_reference_policy`` (set in ``PPOTrainer.__init__``),
``total_training_steps`` (``PPOTrainer._init_dataloader``; written by item 12),
``actor_rollout_wg`` (``PPOTrainer._setup``) and ``global_steps`` (``PPOTrainer._load_checkpoint``), and the
``is_padding`` tag of verl's padding rows (``verl.trainer.ppo.padding_utils.upsample_batch_to_divisible_size``).
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
    """The split of one iteration: ``rows`` before padding, ``mini_batch_rows`` per optimizer step after padding,
    ``num_mini_batches`` optimizer steps per PPO epoch (the batch is padded to ``num_mini_batches * mini_batch_rows``
    rows with verl's zero-mask padding rows)."""

    rows: int
    mini_batch_rows: int
    num_mini_batches: int


def plan_mini_batches(rows: int, max_rows: int, multiple: int) -> MiniBatchPlan:
    """Split ``rows`` step rows into equal mini-batches of at most about ``max_rows`` rows.

    ``k = ceil(rows / max_rows)`` mini-batches of ``m = ceil(ceil(rows / k) / multiple) * multiple`` rows, ``multiple``
    being what the workers need (data-parallel size x micro-batch size); verl pads the batch to a multiple of ``m``,
    so the actor takes ``ceil(rows / m)`` optimizer steps (``k``, or fewer when rounding ``m`` up absorbs one).
    E.g. 2,500 rows, 2,048, multiple 8: k = 2, m = 1,256 (not 2 x 2,048 with 1,596 padding rows).

    Raises:
        ValueError: ``rows``, ``max_rows`` or ``multiple`` < 1.
    """
    if rows < 1 or max_rows < 1 or multiple < 1:
        raise ValueError(f"rows ({rows}), max_rows ({max_rows}) and multiple ({multiple}) must all be >= 1")
    k = math.ceil(rows / max_rows)
    m = math.ceil(math.ceil(rows / k) / multiple) * multiple
    return MiniBatchPlan(rows=rows, mini_batch_rows=m, num_mini_batches=math.ceil(rows / m))


def episode_metrics(steps: StepBatch) -> dict[str, float]:
    """``env/*`` and ``episode/*`` metrics of a batch of step rows (padding rows excluded): the engines' shared
    definitions (:func:`verl_gigpo.rollout.metrics.episode_metrics`, documented there and in
    docs/metrics.md) over :meth:`StepBatch.trajectory_summaries`. Trajectories whose environment failed count only in
    ``env/env_error_rate``, ``episode/num_trajectories``, ``episode/num_step_rows`` and the seconds."""
    return rollout_metrics.episode_metrics(steps.trajectory_summaries())


def validation_type_metrics(data_sources: list, infos: dict[str, list]) -> dict[str, float]:
    """The per-type validation keys (:func:`verl_gigpo.rollout.metrics.type_metrics`) of verl's validation lists:
    ``data_sources`` (one per episode) and ``infos`` (verl's ``reward_extra_infos_dict``: the agent loop's
    ``reward_extra_info`` by key, one entry per episode, None where a row lacked the key). Episodes without a
    ``task_type`` entry (another agent loop) are left out; none at all: empty."""
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
    """Write what validation decodes with into ``config.actor_rollout_ref.rollout.val_kwargs`` (in place) and log
    it once: with ``do_sample`` false, ``temperature`` 0, ``top_p`` 1 and ``top_k`` -1
    (:func:`verl_gigpo.config.rules.validation_sampling`, the rule the local engine follows too).

    verl 0.9.1 builds a validation request's sampling parameters from ``val_kwargs.temperature``, ``top_p`` and
    ``top_k`` alone (``AgentLoopWorkerTQ.generate_sequences``); ``do_sample`` feeds only an assertion of
    ``verl.utils.config.validate_config``. Writing the greedy values into the config is what makes every rollout
    backend (vLLM, SGLang, the ``hf`` backend) decode greedily: temperature 0 is greedy in each.

    Args:
        config: verl's whole trainer config (a ``DictConfig``; struct mode is respected outside ``val_kwargs``).

    Returns:
        the validation sampling, as written.
    """
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
    mini-batch and ``shuffle`` in ``data.extra_info``.

    verl 0.9.1 has no extension point for this: ``PPOTrainer._update_actor`` writes ``global_batch_size`` and
    ``mini_batch_size`` = ``ppo_mini_batch_size * rollout.n`` and the shuffle flag into ``extra_info`` and then calls
    ``self.actor_rollout_wg.update_actor(batch)``. So the worker group's ``update_actor`` (bound on the instance by
    ``verl.single_controller.base.worker_group.WorkerGroup._bind_worker_method``) is replaced by one that overwrites
    those three entries, and restored on exit.

    Raises:
        VerlMismatchError: the block ended without calling ``worker_group.update_actor`` (verl's ``_update_actor``
            no longer reaches the workers through it, so the plan was not applied).
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
    """verl's synchronous V1 PPO trainer whose advantage step understands GiGPO's step rows and whose actor update
    is split by rows; the verl members it overrides or wraps are listed, with verl's file and line, in the module
    docstring ("Contract with verl")."""

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

    # verl 0.9.1 switches its synchronous code paths (ReplayBuffer vs ReplayBufferAsync, refill and checkpoint
    # logic) on the literal ``trainer_mode == "sync"``; this mode IS synchronous PPO, so it reports "sync" there
    # and keeps the registered name apart.
    @property
    def trainer_mode(self) -> str:
        """Always ``"sync"`` for verl's internal checks (the registered name is :data:`TRAINER_MODE`)."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        """verl's, after numbering the batch's rows as this iteration's next training draws (:data:`DRAW_FIELD`,
        counted on across dynamic-sampling refills): the request seeds of a draw's episodes depend on it."""
        step, drawn = self._draws if self._draws[0] == self.global_steps else (self.global_steps, 0)
        tu.assign_non_tensor_stack(batch, DRAW_FIELD, list(range(drawn, drawn + len(batch))))
        self._draws = (step, drawn + len(batch))
        return super()._submit_batch_to_rollout(batch)

    # verl 0.9.1 has no setting for how often its ReplayBuffer polls TransferQueue for finished rollouts: the
    # constructor's default, 2 s (verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.__init__), is used by
    # PPOTrainer._build_replay_buffer, so an iteration's rollout phase lasts a multiple of 2 s however fast the
    # rollout is.
    def _build_replay_buffer(self):
        """verl's replay buffer, or with ``algorithm.filter_groups.enable`` the
        :class:`~verl_gigpo.verl_glue.replay_buffer. DynamicReplayBuffer` (:meth:`_dynamic_replay_buffer`); polling
        every ``trainer.v1.sampler.poll_interval`` seconds when that is set (null: verl's 2 s).

        Raises:
            ValueError: ``poll_interval`` is not a number > 0; bad ``algorithm.filter_groups`` options.
        """
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
        """The Ray actors whose death would leave verl waiting on rollouts: the agent-loop workers (set by ``fit``)
        and the rollout replicas' servers (:mod:`verl_gigpo.verl_glue.dead_actor`)."""
        manager = getattr(self, "agent_loop_manager", None)
        handles = list(getattr(manager, "agent_loop_workers", None) or [])
        servers = getattr(self, "llm_server_manager", None)
        for replica in servers.get_replicas() if servers is not None else []:
            handles.extend(getattr(replica, "servers", None) or [])
        return handles

    def _dynamic_replay_buffer(self, dynamic: DynamicSampling) -> Any:
        """The replay buffer of dynamic sampling, built with the arguments verl's ``_build_replay_buffer`` gives its
        sync ``ReplayBuffer`` when ``algorithm.filter_groups`` is enabled (``gen_batch_size=1``: verl's
        ``PPOTrainer._init_dataloader`` fetches one prompt at a time then), plus the keep test's settings: the
        step-credit estimator's (``algorithm.adv_estimator`` gigpo, hgpo, graphgpo, g2po) or, for another estimator,
        the penalty mode.

        Raises:
            ValueError: a custom sampler (``trainer.v1.sampler.custom_sampler``) with dynamic sampling.
        """
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
    # verl 0.9.1 has no setting for this (verl's public route, ppo_mini_batch_size = mini_batch_rows / rollout.n, is
    # measured in the module docstring and refused there): it pads the batch to a multiple of
    # _get_required_batch_multiple(dp_size) in _balance_batch() and passes mini_batch_size = ppo_mini_batch_size *
    # rollout.n rows to the actor in _update_actor(). The three overrides below change only those numbers (and the
    # shuffle flag).

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's balancing, which pads the batch to ``_get_required_batch_multiple(dp_size)`` rows: while it runs,
        that call knows the number of rows before padding (:meth:`_splitting`) and plans their split."""
        with self._splitting(len(batch)):
            return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    @contextmanager
    def _splitting(self, rows: int) -> Iterator[None]:
        """While open, :meth:`_get_required_batch_multiple` plans the split of ``rows`` step rows.

        verl calls ``_get_required_batch_multiple(dp_size)`` from ``PPOTrainer._balance_batch`` with the
        data-parallel size only, and the plan needs the row count too; the count lives for the duration of that one
        call (not across verl's later steps), so a call from anywhere else gets verl's answer.
        """
        self._rows_to_split = rows
        try:
            yield
        finally:
            self._rows_to_split = None

    def _micro_multiple(self) -> int:
        """Rows every worker call needs per data-parallel rank: the micro-batch sizes of the update and of the
        old/reference log-prob passes (each must divide a rank's share unless dynamic batch sizes are on)."""
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
        """Inside :meth:`_balance_batch` with ``mini_batch_rows`` set (and no critic, past ``critic_warmup``): the
        planned mini-batch size (:func:`plan_mini_batches`), kept in :attr:`mini_batch_plan` for this iteration's
        :meth:`_update_actor`. Otherwise verl's (and, inside :meth:`_balance_batch`, no plan)."""
        rows, max_rows = self._rows_to_split, self.update_settings.mini_batch_rows
        if rows is None:  # not verl's padding call: verl's answer, this iteration's plan untouched
            return super()._get_required_batch_multiple(dp_size)
        if max_rows is None or self.use_critic or self.config.trainer.critic_warmup > self.global_steps:
            self.mini_batch_plan = None
            return super()._get_required_batch_multiple(dp_size)
        self.mini_batch_plan = plan_mini_batches(rows, max_rows, dp_size * self._micro_multiple())
        return self.mini_batch_plan.mini_batch_rows

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update with the planned rows per mini-batch and the row shuffle (``trainer.v1.gigpo_sync``);
        the plan is used once (the next iteration's :meth:`_balance_batch` makes the next)."""
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
        """Whether this iteration recomputes the old log-probs in bypass mode: the launch's first iteration, then
        every ``logprob_check_freq``-th (0: never)."""
        freq = self.update_settings.logprob_check_freq
        if freq == 0:
            return False
        return not self._logprob_checked or self.global_steps % freq == 0

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's old-log-prob step. In bypass mode (``algorithm.rollout_correction.bypass_mode=true``) verl copies
        the rollout's log-probs; on the iterations :meth:`_logprob_check_due` picks, verl's full pass runs instead,
        so ``actor/entropy`` and ``training/rollout_probs_diff_max`` (largest |p_rollout - p_actor| of a token) are
        logged and a broken weight sync shows. The old log-probs it writes are the actor's, equal to the rollout's
        wherever that check passes."""
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
        """verl's metrics, then the training-health checks on the iteration's whole ``metrics`` (``health/*``; module
        docstring, item 12); the run's alarm summary is logged on its last iteration."""
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        self._check_health(metrics, int(global_steps))

    def _check_health(self, metrics: dict, step: int) -> None:
        """``health/*`` into ``metrics`` (:meth:`HealthMonitor.observe`); with ``action=stop`` and a new alarm,
        :meth:`_stop_for_health`; the summary line on the run's last iteration."""
        metrics.update(self.health.observe(step, metrics))
        stop = self.health.stop_requested
        if stop:
            self._stop_for_health(step)
        if stop or step >= self.total_training_steps:
            logger.info(self.health.summary())

    def _stop_for_health(self, step: int) -> None:
        """``trainer.health.action=stop``: a checkpoint of this iteration (unless ``fit`` saved one), one line, and
        ``fit``'s loop ends after this iteration's log."""
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
        """verl's validation metrics plus ``val-core/<data_source>/<type>/*`` (:func:`validation_type_metrics`);
        the agent loop's ``task_type`` and ``env_error`` are removed from ``reward_extra_infos_dict`` first."""
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
        """Every ``trainer.credit_log_freq`` iterations, write this batch's per-step credit records from the
        estimator's ``terms`` (:mod:`verl_gigpo.credit`; texts from the rows the agent loop wrote). Off: returns
        at once (verl sets ``global_steps`` only when training starts)."""
        if not self.credit_logger.options.enabled or not self.credit_logger.due(self.global_steps):
            return
        self.credit_logger.write(self.global_steps, terms, steps)

    def _validate(self) -> dict[str, float]:
        """verl's validation, then its logged episodes (``trainer.log_episodes``): the records the agent loops
        appended to ``episodes_parts/``, written at this step (:class:`verl_gigpo.rollout.episode_log.EpisodeLog`)."""
        metrics = super()._validate()
        if self.episode_options.enabled:
            self.episode_log.write(drain_parts(self.config.trainer.default_local_dir), step=self.global_steps)
        return metrics

    def _log_training_episodes(self, steps: StepBatch, terms: GiGPOTerms | None, advantages: Any) -> None:
        """Every ``trainer.log_episodes_train_freq`` iterations, the first trajectory of the first
        ``trainer.log_episodes`` groups with their advantage terms (texts from the rows the agent loop wrote)."""
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
        """Env/episode metrics for every estimator; the advantages of ``adv_estimator`` gigpo, hgpo, graphgpo or g2po
        (the step-credit estimators) and of grpo or rloo (:func:`~verl_gigpo.advantage.outcome.outcome_advantages`,
        as the local engine computes them; verl's step when ``use_kl_in_reward`` is set), else verl's."""
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
        """verl's rollout correction (``algorithm.rollout_correction``) for the GiGPO path, under the same condition
        as verl's ``_compute_advantage`` (configured, not bypass mode, rollout log-probs present): verl's own
        ``compute_rollout_correction_and_add_to_batch`` on ``old_log_probs``/``rollout_log_probs``.

        Returns:
            None when it does not apply, else ``response_mask`` (N, L) after rejection sampling and, when
            ``rollout_is`` is set, ``rollout_is_weights`` (N, L); ``rollout_corr/*`` metrics go to ``metrics``.
        """
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


#: the members of verl's trainer that :class:`GiGPOTrainerSync` overrides (module docstring, "Contract with verl"),
#: from the contract table
OVERRIDDEN = tuple(e.name for e in CONTRACT if e.ours == __name__ and e.kind == "overrides" and e.guard == "signature")
check_contract(__name__)  # the overrides above, trainer_mode, and the trainer members and literals this module reads
