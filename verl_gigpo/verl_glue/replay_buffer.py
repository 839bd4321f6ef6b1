"""Dynamic sampling on verl's pipeline: verl's synchronous V1 ReplayBuffer whose DAPO filter is the shared keep test.

The keep test needs a whole episode group's step rows, and the first place that holds them is verl's buffer when the
group is finished: :class:`DynamicReplayBuffer` reads them from TransferQueue and calls
:func:`verl_gigpo.rollout.dynamic.group_signal` (the local engine's function), adds the reference's per-iteration
budget, orders kept groups first and adds the ``dynamic/*`` metrics. How and why: docs/dynamic-sampling.md
("On verl's pipeline"); the verl members it relies on: docs/verl-integration.md and the contract table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from verl_gigpo import verl_logger
from verl_gigpo.rollout.dynamic import DynamicSampling, GroupRecord, dynamic_metrics, group_records, group_signal
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.contract import check_contract

__all__ = ["FILTER_METRIC", "DynamicReplayBuffer"]

logger = verl_logger(__name__)

#: the ``filter_groups_metric`` name this buffer passes to verl's (it switches verl's DAPO path on; the filter is ours)
FILTER_METRIC = "gigpo_group_signal"


class DynamicReplayBuffer(ReplayBuffer):
    """verl's sync ``ReplayBuffer`` with dynamic sampling by :func:`~verl_gigpo.rollout.dynamic.group_signal`.

    ``dynamic``: ``algorithm.filter_groups`` (enabled); ``gigpo``: the step-credit estimator's :class:`GiGPOConfig`
    (None for other estimators); ``penalty_mode``: the episode score's mode when ``gigpo`` is None. verl's own
    arguments otherwise (``gen_batch_size`` must be 1); ValueError if not.
    """

    def __init__(
        self, *args: Any, dynamic: DynamicSampling, gigpo: Any = None, penalty_mode: str = "reward", **kwargs: Any
    ):
        kwargs["filter_groups_metric"] = FILTER_METRIC
        super().__init__(*args, **kwargs)
        if not dynamic.enable:
            raise ValueError("DynamicReplayBuffer needs algorithm.filter_groups.enable=true")
        if self.gen_batch_size != 1 or not self.train_batch_size:
            raise ValueError(
                f"DynamicReplayBuffer needs gen_batch_size=1 and a train_batch_size, got {self.gen_batch_size} and "
                f"{self.train_batch_size} (verl sets data.gen_batch_size=1 when algorithm.filter_groups.enable)"
            )
        self.dynamic, self.gigpo, self.penalty_mode = dynamic, gigpo, penalty_mode
        self._dispatch = self.refill_fn  # the trainer's: submits an exact number of fresh prompts
        self.refill_fn = self._refill
        self._start_iteration(self.train_batch_size)

    # ------------------------------------------------------------------ one iteration's state
    def _start_iteration(self, batch_size: int) -> None:
        """Reset the iteration's budget, dispatch order and records (its first ``batch_size`` prompts dispatched)."""
        self._target = batch_size
        self._budget = self.dynamic.max_rounds * batch_size
        self._dispatched = batch_size
        self._order: dict[str, int] = {}  # uid -> dispatch index (0, 1, ...) in this iteration
        self._records: dict[str, GroupRecord] = {}

    def _refill(self, num_prompts: int) -> int:
        """Dispatch up to ``num_prompts`` fresh prompts within the iteration's budget; returns how many."""
        allowed = min(num_prompts, self._budget - self._dispatched)
        if allowed <= 0:
            return 0
        self._dispatched += allowed
        return self._dispatch(allowed)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        """verl's ``sample``; for training, one iteration of dynamic sampling with its ``dynamic/*`` metrics.
        ValueError for a ``batch_size`` other than ``data.train_batch_size`` (``parameter_sync_step`` > 1)."""
        if partition_id == "val":
            return super().sample(global_steps, partition_id, batch_size)
        if batch_size != self.train_batch_size:
            raise ValueError(
                f"dynamic sampling samples whole iterations of data.train_batch_size={self.train_batch_size} groups, "
                f"not {batch_size} (set trainer.v1.sync.parameter_sync_step=1)"
            )
        self._start_iteration(batch_size)
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        selected = {key.split("_")[0] for key in batch.keys}
        records = sorted(self._records.values(), key=lambda r: self._order.get(r.group_id, len(self._order)))
        metrics.update(dynamic_metrics(records, selected, batch_size))
        if metrics["dynamic/short_groups"] > 0:
            logger.warning(
                "step %d: %d of %d groups passed algorithm.filter_groups.filter=%s within max_num_gen_batches=%d; "
                "%d group(s) it dropped fill the batch",
                global_steps,
                int(metrics["dynamic/kept_groups"]),
                batch_size,
                self.dynamic.filter,
                self.dynamic.max_rounds,
                int(metrics["dynamic/short_groups"]),
            )
        return batch, metrics

    # ------------------------------------------------------------------ verl's DAPO hooks
    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        """The uids of newly finished groups to evict (judged once each, evicted while the budget can replace them)
        and ``{shared episode score: groups}``."""
        if partition_id == "val":
            return set(), Counter()
        present = (
            self.pending_keys[partition_id]
            | self.running_keys[partition_id]
            | self.finished_keys[partition_id]
            | self.failure_keys[partition_id]
        )
        for uid in sorted(present - self._order.keys()):  # new prompts: numbered in the order they were dispatched
            self._order[uid] = len(self._order)
        cache = self._dapo_classification_cache[partition_id]
        for uid in cache.keys() - self.finished_keys[partition_id]:
            del cache[uid]
        new = sorted(self.finished_keys[partition_id] - cache.keys(), key=lambda uid: self._order[uid])
        if not new:
            return set(), Counter()
        dropped = self._judge(partition_id, new)
        spare = len(present) + (self._budget - self._dispatched) - self._target  # groups that may still go
        evict = dict(list(dropped.items())[: max(0, spare)])
        for uid in new:
            cache[uid] = evict.get(uid)
        return set(evict), Counter(evict.values())

    def _judge(self, partition_id: str, uids: list[str]) -> dict[str, float]:
        """Keep test on the finished groups ``uids``: records them, returns ``{uid: score}`` of those it drops."""
        wanted = set(uids)
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in wanted]
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["uid", "extra_fields"])
            steps = StepBatch.from_rows(list(data["uid"]), list(data["extra_fields"]), [False] * len(keys))
        else:
            steps = StepBatch.from_rows([], [], [])
        signal = group_signal(steps, self.dynamic.filter, self.gigpo, penalty_mode=self.penalty_mode)
        judged = {}
        for record in group_records(steps, signal, 0):
            judged[record.group_id] = replace(record, round=self._order[record.group_id] // self._target + 1)
        score = {str(g): float(x) for g, x in zip(signal.group_ids, signal.score, strict=True)}
        dropped = {}
        for uid in uids:  # a finished group with no row (nothing to judge) is dropped, as a group of failed episodes
            record = judged.get(uid) or GroupRecord(
                uid, self._order[uid] // self._target + 1, False, False, False, 0, 0, 0
            )
            self._records[uid] = record
            if not record.keep:
                dropped[uid] = score.get(uid, 0.0)
        return dropped

    def _select_prompt_uids(self, partition_id: str, sampleable_keys: set[str], batch_size: int):
        """Training: the kept groups first, then the others, each in dispatch order (verl's return value)."""
        if partition_id == "val":
            return super()._select_prompt_uids(partition_id, sampleable_keys, batch_size)

        def rank(uid: str) -> tuple[bool, int, str]:
            record = self._records.get(uid)
            return (record is None or not record.keep, self._order.get(uid, len(self._order)), uid)

        ordered = sorted(sampleable_keys, key=rank)
        return ordered[:batch_size], dict(self.partitions[partition_id]), dict(self.prompt_global_steps[partition_id])


check_contract(__name__)  # the ReplayBuffer members above, as verl 0.9.1 defines them
