"""Dynamic sampling on verl's pipeline (CPU, a real TransferQueue, verl's own ReplayBuffer loop): the
``DynamicReplayBuffer`` judges each finished group with the shared keep test, evicts the dropped ones through verl's
DAPO path, has fresh prompts dispatched within the iteration's budget, and selects a full batch; the ``gigpo_sync``
trainer mode builds it when ``algorithm.filter_groups.enable`` is set.

The prompts are dispatched by a stand-in for the trainer's ``_add_prompts_to_generate`` + verl's agent-loop worker:
it writes what the worker writes to TransferQueue (the prompt's status tag, one row per step keyed
``{uid}_{session}_{step}`` with the agent loop's ``extra_fields``), with the groups' outcomes chosen by the test.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_dir
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_gigpo.config import GiGPOConfig
from verl_gigpo.rollout.dynamic import DynamicSampling
from verl_gigpo.verl_glue.replay_buffer import DynamicReplayBuffer
from verl_gigpo.verl_glue.trainer import GiGPOTrainerSync

pytestmark = pytest.mark.slow  # a Ray cluster and TransferQueue (the ray_tq fixture)

ROOT = Path(__file__).resolve().parents[1]

#: per kind of group, two trajectories' (step rewards, anchor keys, won): mixed outcomes (kept by both filters), all
#: won in 2 and 3 steps from s0 (equal returns, differing R_0: kept by the signal filter only), all lost with no state
#: in common (dropped by both)
KINDS = {
    "mixed": [([0.0, 1.0], ["s0", "s1"], True), ([0.0, 0.0], ["s0", "s3"], False)],
    "win": [([0.0, 1.0], ["s0", "s1"], True), ([0.0, 0.0, 1.0], ["s0", "s2", "s1"], True)],
    "flat": [([0.0, 0.0], ["a0", "a1"], False), ([0.0, 0.0], ["b0", "b1"], False)],
}


class Rollouts:
    """Dispatches prompts as the trainer + agent-loop worker would, each with the next kind of group from ``kinds``;
    ``self.uids`` lists them in dispatch order. The groups finish at once, or with ``gradual`` one at a time, each
    when :meth:`finish_one` is called (by a thread of the test), in dispatch order."""

    def __init__(self, kinds: list[str], *, gradual: bool = False):
        self.kinds, self.uids, self.gradual = list(kinds), [], gradual
        self.waiting: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, num_prompts: int) -> int:
        for _ in range(num_prompts):
            uid = f"g{len(self.uids):03d}"
            self.uids.append(uid)
            kind = self.kinds.pop(0)
            if self.gradual:
                tq.kv_put(
                    key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": 1}
                )
                with self.lock:
                    self.waiting.append((uid, kind))
            else:
                self._finish(uid, kind)
        return num_prompts

    def finish_one(self) -> bool:
        """Finish the oldest running group; False when none is running."""
        with self.lock:
            if not self.waiting:
                return False
            uid, kind = self.waiting.pop(0)
        self._finish(uid, kind)
        return True

    def _finish(self, uid: str, kind: str) -> None:
        """Write the group's rows and mark its prompt finished, as the agent-loop worker does."""
        keys, fields = [], []
        for session, (rewards, anchors, won) in enumerate(KINDS[kind]):
            for step, (reward, anchor) in enumerate(zip(rewards, anchors, strict=True)):
                keys.append(f"{uid}_{session}_{step}")
                extra = {"traj_id": f"{uid}_{session}", "step_id": step, "anchor_key": anchor}
                extra.update(step_reward=reward, env_reward=reward, action_valid=True, won=won, env_error=False)
                fields.append({"uid": uid, "extra_fields": extra, "responses": torch.tensor([1, 2])})
        tags = [{"status": "success", "global_steps": 1} for _ in keys]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": 1})


def _buffer(rollouts: Rollouts, dynamic: DynamicSampling, batch_size: int) -> DynamicReplayBuffer:
    return DynamicReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.01,
        refill_fn=rollouts,
        train_batch_size=batch_size,
        gen_batch_size=1,
        dynamic=dynamic,
        gigpo=GiGPOConfig(),
    )


def _train_keys() -> set[str]:
    listing = tq.kv_list("train") or {}
    return set(listing.get("train", {}))


def _clear_train() -> None:
    keys = sorted(_train_keys())
    if keys:
        tq.kv_clear(keys=keys, partition_id="train")


@pytest.fixture
def clean(ray_tq):
    """An empty ``train`` partition before and after the test."""
    _clear_train()
    yield
    _clear_train()


def test_dropped_groups_are_replaced_by_fresh_prompts(clean):
    # round 1: flat, mixed, win; the refills: mixed, flat, then more than the buffer will ask for
    rollouts = Rollouts(["flat", "mixed", "win", "mixed", "flat", "mixed", "mixed", "mixed"])
    buffer = _buffer(rollouts, DynamicSampling(enable=True, filter="signal", max_rounds=3), 3)
    rollouts(3)  # the iteration's first batch, which verl's prepare_step submits before sampling
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=3)
    g = rollouts.uids
    # the flat groups were evicted (verl refilled 2 per eviction); the batch: the kept groups in dispatch order
    assert g == ["g000", "g001", "g002", "g003", "g004"]
    assert sorted({key.split("_")[0] for key in batch.keys}) == ["g001", "g002", "g003"]
    assert len(batch.keys) == 4 + 5 + 4  # every row of the three groups (mixed, win, mixed)
    assert metrics["training/filter_groups/evicted_samples"] == 2
    assert not any(key.startswith(("g000", "g004")) for key in _train_keys())
    assert metrics["dynamic/rounds"] == 2
    assert metrics["dynamic/kept_fraction_round_1"] == pytest.approx(2 / 3)
    assert metrics["dynamic/kept_fraction_round_2"] == pytest.approx(1 / 2)
    assert metrics["dynamic/kept_groups"] == 3 and metrics["dynamic/kept_by_step_signal_only"] == 1  # g002
    assert metrics["dynamic/short_groups"] == 0 and metrics["dynamic/episodes_played"] == 10


def test_the_budget_ends_the_iteration_with_a_full_batch(clean):
    """max_num_gen_batches=2, every group flat: round 1 is evicted and replaced once; the replacements, also flat,
    are kept to fill the batch (the budget is spent), as the reference's last try keeps everything."""
    rollouts = Rollouts(["flat"] * 10)
    buffer = _buffer(rollouts, DynamicSampling(enable=True, filter="episode", max_rounds=2), 2)
    rollouts(2)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert rollouts.uids == ["g000", "g001", "g002", "g003"]  # 2 x 2 prompts: the budget
    assert sorted({key.split("_")[0] for key in batch.keys}) == ["g002", "g003"]
    assert metrics["dynamic/rounds"] == 2 and metrics["dynamic/kept_fraction"] == 0
    assert metrics["dynamic/short_groups"] == 2 and metrics["dynamic/kept_groups"] == 0


def test_groups_finishing_one_at_a_time_still_give_a_full_batch(clean):
    """Groups finish one by one while others run, every one flat, budget 2 x 3 prompts: evictions stop where the
    groups present plus the prompts the budget allows no longer exceed the batch, so verl's loop ends with 3 groups
    instead of waiting for refills the budget cannot give."""
    rollouts = Rollouts(["flat"] * 20, gradual=True)
    buffer = _buffer(rollouts, DynamicSampling(enable=True, filter="episode", max_rounds=2), 3)
    rollouts(3)
    stop = threading.Event()

    def finish() -> None:
        while not stop.is_set():
            rollouts.finish_one()
            stop.wait(0.02)

    worker = threading.Thread(target=finish, daemon=True)
    worker.start()
    try:
        batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=3)
    finally:
        stop.set()
        worker.join()
    assert len(rollouts.uids) == 6  # the budget, all dispatched
    assert len({key.split("_")[0] for key in batch.keys}) == 3
    assert metrics["dynamic/short_groups"] == 3 and metrics["training/filter_groups/evicted_samples"] == 3


def test_the_trainer_mode_builds_the_dynamic_buffer(ray_tq, tmp_path):
    overrides = [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.filter=signal",
        "algorithm.filter_groups.max_num_gen_batches=4",
        "data.train_batch_size=3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.model.path=" + str(tmp_path),
        "trainer.n_gpus_per_node=1",
        f"trainer.default_local_dir={tmp_path}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        cfg = compose(config_name="gigpo_trainer", overrides=overrides)
    trainer = GiGPOTrainerSync(cfg)
    buffer = trainer.replay_buffer
    assert type(buffer) is DynamicReplayBuffer
    assert buffer.dynamic == DynamicSampling(enable=True, filter="signal", max_rounds=4)
    assert buffer.gigpo == trainer.gigpo_config and buffer.train_batch_size == 3 and buffer.gen_batch_size == 1
    cfg.trainer.v1.sampler.custom_sampler.path = "my.py"
    with pytest.raises(ValueError, match="custom_sampler"):
        GiGPOTrainerSync(cfg)
