"""The local engine's training loop (:class:`LocalTrainer`): GiGPO, HGPO, GraphGPO, G2PO, GRPO or RLOO for text
agents in one process, on a CPU or one GPU.

    python -m verl_gigpo.local.train [key=value ...] [--resume | --overwrite]

Defaults: ``verl_gigpo/config/local_trainer.yaml`` (verl's key names). One iteration: rollout of task groups,
step rows, advantages, PPO update. The steps, validation and the deviations from verl's trainer:
docs/local-engine.md; run folder and resuming: docs/runs.md; metric names: docs/metrics.md.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.advantage.outcome import outcome_advantages
from verl_gigpo.advantage.terms import AdvantageTerms
from verl_gigpo.config.resume import flatten_config
from verl_gigpo.config.rules import penalty_mode
from verl_gigpo.credit.records import CreditLogger, CreditLogOptions
from verl_gigpo.local.checkpoint import (
    read_checkpoint,
    restore_rng_states,
    rng_states,
    set_learning_rate,
    write_checkpoint,
)
from verl_gigpo.local.config import DEFAULT_CONFIG, check_loggers, gigpo_config, load_config
from verl_gigpo.local.plots import plot_metrics, run_title
from verl_gigpo.local.rollout import LocalRollout, local_device
from verl_gigpo.local.run_folder import prepare_run_folder
from verl_gigpo.local.setup import (
    update_settings,
)
from verl_gigpo.local.update import PPOActor
from verl_gigpo.rollout import Episode, TaskSpec
from verl_gigpo.rollout.dynamic import DynamicRounds, DynamicSampling, group_signal
from verl_gigpo.rollout.episode_log import (
    EpisodeLog,
    EpisodeLogOptions,
    episode_record,
    pick_validation,
    training_records,
)
from verl_gigpo.rollout.health import HealthMonitor, HealthOptions
from verl_gigpo.rollout.metrics import episode_metrics, run_names, summaries_from_episodes, type_metrics, val_names
from verl_gigpo.rollout.step_rows import StepBatch

__all__ = ["DEFAULT_CONFIG", "LocalTrainer", "load_config"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------- trainer
class LocalTrainer:
    """Train a Hugging Face causal LM on a text environment; ``cfg`` is a validated config (:func:`load_config`).

    Use :meth:`fit` for a whole run; :meth:`train_step` and :meth:`validate` are the pieces.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        if cfg.local.num_threads:
            torch.set_num_threads(int(cfg.local.num_threads))
        self.device = local_device(cfg)
        self.out_dir = Path(cfg.trainer.default_local_dir)
        prepare_run_folder(self.out_dir, resume=cfg.trainer.resume, overwrite=cfg.trainer.overwrite)
        # resuming: find and check the checkpoint now, before anything is built or written (applied in fit())
        self._resume_from = self._read_checkpoint() if cfg.trainer.resume else None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.gigpo = gigpo_config(cfg) if cfg.algorithm.adv_estimator in STEP_CREDIT_ESTIMATORS else None
        # the model, its generation server and the environments (the evaluation command plays through the same)
        self.rollouts = LocalRollout(cfg, self.gigpo)
        self.tokenizer, self.model, self.server = self.rollouts.tokenizer, self.rollouts.model, self.rollouts.server
        self.episode_config, self.allowed_ids = self.rollouts.episode_config, self.rollouts.allowed_ids
        self.env_kwargs = self.rollouts.env_kwargs
        update = update_settings(cfg)
        self.actor = PPOActor(
            self.model,
            cfg.actor_rollout_ref.actor,
            pad_token_id=self.server.pad_token_id,
            device=self.device,
            allowed_ids=self.allowed_ids,
            mini_batch_rows=update.mini_batch_rows,
            shuffle_rows=update.shuffle_rows,
            seed=cfg.trainer.seed,
            image_processor=self.rollouts.image_processor,
        )
        self.ref_model, self.optimizer = self.actor.ref_model, self.actor.optimizer
        self.task_rng = np.random.default_rng(cfg.trainer.seed)
        self.dynamic = DynamicSampling.from_algorithm(cfg.algorithm)  # algorithm.filter_groups
        self.episodes_played_total = 0  # training episodes played so far (rollout/episodes_played_total)
        self.iteration = 0
        self.history: list[dict[str, float]] = []
        # credit records (trainer.credit_log_*, verl_gigpo.credit)
        credit = CreditLogOptions.from_trainer(cfg.trainer, estimator=cfg.algorithm.adv_estimator)
        self.credit_logger = CreditLogger(credit, self.out_dir, seed=cfg.trainer.seed)
        self.gigpo_terms: AdvantageTerms | None = None  # the last iteration's terms (compute_advantages), as logged
        # whole episodes (trainer.log_episodes*) and the metrics backends besides metrics.jsonl (trainer.logger)
        self.episode_options = EpisodeLogOptions.from_trainer(cfg.trainer)
        loggers = check_loggers(cfg.trainer.get("logger", None))
        project, experiment = str(cfg.trainer.project_name), str(cfg.trainer.experiment_name)
        self.tracking = _tracking(cfg, loggers, project, experiment)
        self.episode_log = EpisodeLog(self.out_dir, loggers=loggers, project=project, experiment=experiment)
        self.last_checkpoint: Path | None = None
        # training-health alarms (trainer.health): checked on every iteration's metrics in fit()
        kl_key = "actor/kl_loss" if cfg.actor_rollout_ref.actor.use_kl_loss else "actor/ppo_kl"
        self.health = HealthMonitor(HealthOptions.from_trainer(cfg.trainer), kl_key=kl_key, run_dir=self.out_dir)

    # ------------------------------------------------------------------ rollout
    def rollout(
        self, tasks: list[TaskSpec], n: int, *, validation: bool, iteration: int | None = None, first_task: int = 0
    ) -> list[Episode]:
        """Play each task ``n`` times concurrently, episodes in (task, member) order (:meth:`LocalRollout.play`)."""
        return self.rollouts.play(tasks, n, validation=validation, iteration=iteration, first_task=first_task)

    # ------------------------------------------------------------------ advantages
    def compute_advantages(self, batch: StepBatch) -> tuple[np.ndarray, dict[str, float], AdvantageTerms | None]:
        """Advantages (N,) per step row, the estimator's metrics and its terms (None: grpo / rloo, no unmasked row).

        gigpo, hgpo, graphgpo, g2po: :meth:`GiGPOConfig.advantage_terms`; grpo / rloo: :func:`outcome_advantages`.
        """
        if not batch.row_mask.any():  # no episode ran without an environment error
            return np.zeros(len(batch)), {}, None
        if self.gigpo is not None:
            terms = batch.advantage_terms(self.gigpo)  # masked rows get 0; similarity keys merged there
            return np.asarray(terms.advantage, dtype=np.float64), dict(terms.stats), terms
        norm = bool(self.cfg.algorithm.norm_adv_by_std_in_grpo)
        env = self.cfg.env
        advantages = outcome_advantages(
            batch,
            self.cfg.algorithm.adv_estimator,
            norm_adv_by_std=norm,
            penalty_mode=penalty_mode(env),
            invalid_action_penalty=float(env.invalid_action_penalty),
        )
        return advantages, {}, None

    # ------------------------------------------------------------------ update
    def update(self, batch: StepBatch, advantages: np.ndarray) -> dict[str, float]:
        """PPO update on the batch's unmasked rows with ``advantages`` (N,); returns ``actor/*`` metrics."""
        return self.actor.update(batch, advantages, iteration=self.iteration)

    # ------------------------------------------------------------------ iteration, validation
    def train_step(self) -> dict[str, float]:
        """One iteration (rollout, advantages, update); returns its metrics (validation not included)."""
        self.iteration += 1
        t0 = time.perf_counter()
        stats = self.server.stats
        busy0, batches0, requests0 = stats["busy_s"], stats["batches"], stats["requests"]
        episodes, played, dynamic_metrics = self.play_iteration()
        self.episodes_played_total += len(played)
        t1 = time.perf_counter()
        credit_due = self.credit_logger.due(self.iteration)  # credit records: the rows keep their texts
        episodes_due = self.episode_options.train_due(self.iteration)  # so do logged training episodes
        texts = max(
            self.credit_logger.options.max_chars if credit_due else 0,
            self.episode_options.max_chars + 1 if episodes_due else 0,  # + 1: the episode log marks its own cut
        )
        # groups from the task draws; failed episodes masked
        batch = StepBatch.from_episodes(episodes, text_chars=texts)
        advantages, adv_metrics, self.gigpo_terms = self.compute_advantages(batch)
        if self.gigpo_terms is not None and credit_due:
            self.credit_logger.write(self.iteration, self.gigpo_terms, batch)
        if episodes_due:
            records = training_records(
                batch,
                n=self.episode_options.episodes,
                iteration=self.iteration,
                max_chars=self.episode_options.max_chars,
                terms=self.gigpo_terms,
                advantages=advantages,
            )
            self.episode_log.write(records, step=self.iteration)
        t2 = time.perf_counter()
        actor_metrics = self.update(batch, advantages)
        t3 = time.perf_counter()
        batches = self.server.stats["batches"] - batches0
        metrics = {
            **run_names(self.iteration, training=True),
            **episode_metrics(batch.trajectory_summaries()),
            **adv_metrics,
            "adv/abs_mean": float(np.abs(advantages[batch.row_mask]).mean()) if batch.row_mask.any() else 0.0,
            **actor_metrics,
            **dynamic_metrics,
            "rollout/batch_size_mean": (self.server.stats["requests"] - requests0) / batches if batches else 0.0,
            "rollout/episodes_played": float(len(played)),
            "rollout/episodes_played_total": float(self.episodes_played_total),
            "timing_s/rollout": t1 - t0,
            "timing_s/generate": self.server.stats["busy_s"] - busy0,
            "timing_s/env": sum(episode.timing["env"] for episode in played),
            "timing_s/adv": t2 - t1,
            "timing_s/update": t3 - t2,
        }
        return metrics

    def play_iteration(self) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """One iteration's training episodes: ``(episodes to train on, every episode played, dynamic/* metrics)``.

        With ``algorithm.filter_groups.enable``, rounds of fresh tasks until the kept groups fill the batch
        (:class:`~verl_gigpo.rollout.dynamic.DynamicRounds`); else both lists are the same.
        """
        cfg = self.cfg
        size, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
        iteration = self.iteration + 1  # verl's global_steps of this batch (the request seeds' iteration)
        if not self.dynamic.enable:
            episodes = self.rollout(self._draw_tasks(size), n, validation=False, iteration=iteration)
            return episodes, episodes, {}
        rounds = DynamicRounds(self.dynamic, target=size)
        mode = penalty_mode(cfg.env)  # the episode score of grpo / rloo (a step-credit estimator's config has its own)
        played: list[Episode] = []
        while not rounds.done:
            first = rounds.num_rounds * size
            episodes = self.rollout(self._draw_tasks(size), n, validation=False, iteration=iteration, first_task=first)
            steps = StepBatch.from_episodes(episodes)
            rounds.add(steps, group_signal(steps, self.dynamic.filter, self.gigpo, penalty_mode=mode))
            played += episodes
        selected = rounds.selected()
        metrics = rounds.metrics()
        if metrics["dynamic/short_groups"] > 0:
            logger.warning(
                "iteration %d: %d of %d groups passed algorithm.filter_groups.filter=%s in %d round(s) "
                "(algorithm.filter_groups.max_num_gen_batches); %d dropped group(s) of the last round fill the batch",
                self.iteration,
                rounds.kept_count,
                size,
                self.dynamic.filter,
                rounds.num_rounds,
                int(metrics["dynamic/short_groups"]),
            )
        order = {group: i for i, group in enumerate(selected)}
        chosen = sorted((ep for ep in played if ep.group_id in order), key=lambda ep: order[ep.group_id])
        return chosen, played, metrics

    def _draw_tasks(self, count: int) -> list[TaskSpec]:
        """The next ``count`` training task seeds of ``env.train_split`` from the run's task RNG."""
        cfg = self.cfg
        seeds = self.task_rng.integers(0, 2**31 - 1, size=count)
        return [TaskSpec(cfg.env.name, int(s), cfg.env.train_split, self.env_kwargs) for s in seeds]

    def validate(self) -> dict[str, float]:
        """Play the fixed validation tasks; returns ``val/*`` and ``val-core/<env.name>/<type>/*`` metrics."""
        cfg = self.cfg
        if cfg.data.val_size == 0:
            return {}
        start = time.perf_counter()
        episodes = self.rollouts.validation_episodes()
        options = self.episode_options
        if options.enabled:  # trainer.log_episodes: member 0 of tasks 0..N-1, the same at every validation
            records = [
                episode_record(ep, kind="val", iteration=self.iteration, max_chars=options.max_chars)
                for ep in pick_validation(episodes, options.episodes)
            ]
            self.episode_log.write(records, step=self.iteration)
        summaries = summaries_from_episodes(episodes)
        val = episode_metrics(summaries, prefix="val", episode_prefix="val")
        by_type = type_metrics(cfg.env.name, summaries)
        return {**val, **by_type, **val_names(cfg.env.name, val, seconds=time.perf_counter() - start)}

    def fit(self) -> list[dict[str, float]]:
        """Train until ``trainer.total_training_steps`` (or ``total_training_episodes``), resuming first when asked;
        returns all metrics lines (also in ``metrics.jsonl``) and writes the plot and the final checkpoint."""
        cfg = self.cfg
        total = cfg.trainer.total_training_steps
        budget = cfg.trainer.get("total_training_episodes", None)

        def budget_spent() -> bool:
            return budget is not None and self.episodes_played_total >= budget

        if cfg.trainer.resume:
            self.load_checkpoint()
        metrics_path = self.out_dir / "metrics.jsonl"
        metrics_path.write_text("".join(json.dumps(m) + "\n" for m in self.history))
        if self.iteration == 0:
            first = {**run_names(0, training=False), **self.validate()}
            self._record(first, metrics_path)
            logger.info("validation before training: %s", _fmt(first))
        bar = _progress(cfg, initial=self.iteration, total=total)
        while self.iteration < total and not budget_spent():
            start = time.perf_counter()
            metrics = self.train_step()
            metrics["timing_s/step"] = time.perf_counter() - start  # verl's name: the iteration without validation
            last = self.iteration == total or budget_spent()
            if last or (cfg.trainer.test_freq > 0 and self.iteration % cfg.trainer.test_freq == 0):
                metrics.update(self.validate())
            metrics["timing_s/iteration"] = time.perf_counter() - start
            metrics.update(self.health.observe(self.iteration, metrics))  # trainer.health: health/*, alarms
            self._record(metrics, metrics_path)
            saved = last or (cfg.trainer.save_freq > 0 and self.iteration % cfg.trainer.save_freq == 0)
            if saved:
                self.save_checkpoint()
            if self.health.stop_requested:  # trainer.health.action=stop: a checkpoint, then one line
                path = self.out_dir / "checkpoints" if saved else self.save_checkpoint()
                signals = sorted({a.signal for a in self.health.alarms if a.iteration == self.iteration})
                logger.warning(
                    "stopped at iteration %d by trainer.health.action=stop (%s); checkpoint %s; resume with: %s "
                    "(add trainer.health.ignore=[%s] to silence)",
                    self.iteration,
                    ", ".join(signals),
                    path,
                    resume_command(cfg),
                    ",".join(signals),
                )
                break
            if bar is not None:
                post = {"success": f"{metrics['env/success_rate']:.2f}"}
                val = [m["val/success_rate"] for m in self.history if "val/success_rate" in m]
                if val:
                    post["val"] = f"{val[-1]:.2f}"
                bar.set_postfix(post)
                bar.update(1)
        if bar is not None:
            bar.close()
        logger.info(self.health.summary())
        if cfg.local.plot:
            plot_metrics(self.history, self.out_dir / "learning_curve.png", title=run_title(cfg))
        return self.history

    def _record(self, metrics: dict[str, float], path: Path) -> None:
        self.history.append(metrics)
        with path.open("a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        if self.tracking is not None:
            self.tracking.log(data=metrics, step=int(metrics["step"]))

    def close(self) -> None:
        """Stop the server, the environments and their workers, the event loop; close the loggers."""
        self.rollouts.close()
        self.episode_log.close()
        if self.tracking is not None:
            self.tracking.finish()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/iter_K/state.pt`` (model, optimizer, RNG states, iteration, metrics so far)."""
        state = {
            "iteration": self.iteration,
            "episodes_played_total": self.episodes_played_total,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **rng_states(self.task_rng, self.server.generator),
            "history": self.history,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }
        self.last_checkpoint = write_checkpoint(self.out_dir / "checkpoints", self.iteration, state)
        return self.last_checkpoint

    def load_checkpoint(self) -> int:
        """Restore the last checkpoint (model, optimizer, RNGs, iteration, metrics); returns its iteration (0: none).

        Raises:
            ValueError: the config differs from the checkpoint's in keys that may not change on resume.
        """
        found, self._resume_from = self._resume_from or self._read_checkpoint(), None
        if found is None:
            logger.warning("trainer.resume: no checkpoint in %s, starting from scratch", self.out_dir)
            return 0
        state, path = found
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        set_learning_rate(self.optimizer, float(self.cfg.actor_rollout_ref.actor.optim.lr))
        restore_rng_states(state, self.task_rng, self.server.generator)
        self.iteration = int(state["iteration"])
        self.history = list(state["history"])
        for line in self.history:  # the alarms' windows, bests and cool-downs, as an uninterrupted run has them
            if "training/global_step" in line:
                self.health.observe(int(line["training/global_step"]), line, replay=True)
        n, size = self.cfg.actor_rollout_ref.rollout.n, self.cfg.data.train_batch_size
        # a checkpoint without the count comes from a run of data.train_batch_size x rollout.n episodes an iteration
        self.episodes_played_total = int(state.get("episodes_played_total", self.iteration * size * n))
        logger.info("resumed from %s (iteration %d)", path, self.iteration)
        return self.iteration

    def _read_checkpoint(self) -> tuple[dict[str, Any], Path] | None:
        """The checkpoint to resume from and its path (:func:`read_checkpoint`), None when there is none."""
        return read_checkpoint(self.out_dir / "checkpoints", self.cfg, device=self.device)


def _tracking(cfg: DictConfig, loggers: list[str], project: str, experiment: str):
    """verl's ``Tracking`` over ``trainer.logger`` (None when it is empty)."""
    if not loggers:
        return None
    from verl.utils.tracking import Tracking

    config = OmegaConf.to_container(cfg, resolve=True)
    return Tracking(project_name=project, experiment_name=experiment, default_backend=loggers, config=config)


def resume_command(cfg: DictConfig) -> str:
    """The command that resumes this run: every key that differs from ``local_trainer.yaml``, and ``--resume``."""
    defaults = flatten_config(OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG), resolve=True))
    current = flatten_config(OmegaConf.to_container(cfg, resolve=True))
    skip = {"trainer.resume", "trainer.overwrite"}
    items = [f"{k}={_dot(v)}" for k, v in current.items() if k not in skip and (k not in defaults or defaults[k] != v)]
    return " ".join(["python -m verl_gigpo.local.train", *(shlex.quote(i) for i in items), "--resume"])


def _dot(value: Any) -> str:
    """A value as an OmegaConf dotlist item writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_dot(v) for v in value) + "]"
    return str(value)


def _fmt(metrics: dict[str, float]) -> str:
    """The ``val/*`` metrics as ``key=value`` text for the log."""
    return ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if k.startswith("val/"))


def _progress(cfg: DictConfig, *, initial: int, total: int):
    """A tqdm bar over the iterations, or None when ``local.progress`` is off."""
    if not cfg.local.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=f"{cfg.algorithm.adv_estimator} {cfg.env.name}", unit="it")


if __name__ == "__main__":  # python -m verl_gigpo.local.train: the command line lives in local/cli.py
    from verl_gigpo.local.cli import main

    sys.exit(main())
