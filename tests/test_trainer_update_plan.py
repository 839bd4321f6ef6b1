"""The ``gigpo_sync`` trainer mode's split of an iteration's step rows into optimizer steps (``trainer.v1.gigpo_sync``).

Hand-computed cases of :func:`verl_gigpo.trainer.plan_mini_batches` and the settings reader; the plan reaching the
workers through verl's own ``_update_actor`` on the trainer mode built by its constructor. That verl's actor really
takes this many optimizer steps is checked on the real pipeline in ``tests/test_e2e_verl_cpu.py`` (optimizer state of
the checkpoints).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl_gigpo.trainer import MiniBatchPlan, UpdateSettings, plan_mini_batches

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("rows", "max_rows", "multiple", "expected"),
    [
        (2500, 2048, 8, MiniBatchPlan(rows=2500, mini_batch_rows=1256, num_mini_batches=2)),  # not 2 x 2048
        (2048, 2048, 8, MiniBatchPlan(rows=2048, mini_batch_rows=2048, num_mini_batches=1)),
        (6400, 2048, 8, MiniBatchPlan(rows=6400, mini_batch_rows=1600, num_mini_batches=4)),
        (96, 48, 16, MiniBatchPlan(rows=96, mini_batch_rows=48, num_mini_batches=2)),
        (81, 48, 16, MiniBatchPlan(rows=81, mini_batch_rows=48, num_mini_batches=2)),  # padded to 96 rows
        (5, 2048, 32, MiniBatchPlan(rows=5, mini_batch_rows=32, num_mini_batches=1)),  # tiny batch: one step
        # rounding m up to the multiple absorbs a mini-batch: 3 planned, 2 taken (each <= max_rows + multiple)
        (100, 40, 32, MiniBatchPlan(rows=100, mini_batch_rows=64, num_mini_batches=2)),
    ],
)
def test_plan_hand_computed(rows, max_rows, multiple, expected):
    plan = plan_mini_batches(rows, max_rows, multiple)
    assert plan == expected
    assert plan.mini_batch_rows % multiple == 0
    assert plan.num_mini_batches == math.ceil(rows / plan.mini_batch_rows)  # what verl does after padding
    assert plan.num_mini_batches * plan.mini_batch_rows - rows < plan.mini_batch_rows  # padding < one mini-batch


def test_plan_rejects_non_positive_sizes():
    for args in ((0, 8, 1), (8, 0, 1), (8, 8, 0)):
        with pytest.raises(ValueError, match="must all be >= 1"):
            plan_mini_batches(*args)


def _cfg(node):
    return OmegaConf.create({"trainer": {"v1": {"gigpo_sync": node}}})


def test_settings_defaults_match_the_reference_implementation():
    # the reference keeps rollout.n = 1, so its ppo_mini_batch_size (256 in its config and ALFWorld run) counts rows
    assert UpdateSettings.from_config(OmegaConf.create({})) == UpdateSettings(mini_batch_rows=256, shuffle_rows=True)
    assert UpdateSettings.from_config(_cfg({"mini_batch_rows": None})).mini_batch_rows is None  # verl's own split
    assert UpdateSettings.from_config(_cfg({"logprob_check_freq": 0})).logprob_check_freq == 0  # never in bypass mode


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"mini_batch_rows": 0}, r"mini_batch_rows=0 .*>= 1"),
        ({"mini_batch_rows": "2048"}, r"mini_batch_rows='2048' .*>= 1"),
        ({"mini_batch_rows": True}, r"mini_batch_rows=True .*>= 1"),
        ({"shuffle_rows": "yes"}, r"shuffle_rows='yes' .*true or false"),
        ({"logprob_check_freq": -1}, r"logprob_check_freq=-1 .*>= 0"),
        ({"logprob_check_freq": 2.5}, r"logprob_check_freq=2\.5 .*>= 0"),
        ({"mini_batch_size": 64}, r"unknown key\(s\) \['mini_batch_size'\] in trainer.v1.gigpo_sync"),
    ],
)
def test_settings_errors_name_the_key(node, message):
    with pytest.raises(ValueError, match=message):
        UpdateSettings.from_config(_cfg(node))


# ------------------------------------------------------------------ the update_actor swap, through verl's own method
class _WorkerGroup:
    """Stands in for verl's RayWorkerGroup (the remote workers are not under test): like it, binds ``update_actor``
    on the instance, and records the ``extra_info`` each call receives."""

    def __init__(self):
        self.calls: list[dict] = []

        def update_actor(data):
            self.calls.append(dict(data.extra_info))
            return {"metrics": {"mfu": 0.5, "pg_loss": 1.0}}

        self.update_actor = update_actor


def _trainer_without_workers(tmp_path: Path, plan: MiniBatchPlan | None, *, shuffle: bool = True):
    """The real GiGPOTrainerSync, built by its constructor from ``verl_gigpo/config/gigpo_trainer.yaml`` (no Ray, no
    model: verl builds its workers later, in ``init_workers``), with two tasks of n = 4 per iteration; a
    :class:`_WorkerGroup` stands in for the remote workers ``init_workers`` would give it, and ``plan`` is the split
    ``_balance_batch`` would have planned for the iteration."""
    from verl_gigpo.trainer import GiGPOTrainerSync

    overrides = [
        f"actor_rollout_ref.model.path={tmp_path}",
        f"trainer.default_local_dir={tmp_path}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.shuffle=false",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"trainer.v1.gigpo_sync.mini_batch_rows={'null' if plan is None else 256}",
        f"trainer.v1.gigpo_sync.shuffle_rows={str(shuffle).lower()}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        trainer = GiGPOTrainerSync(compose(config_name="gigpo_trainer", overrides=overrides))
    trainer.actor_rollout_wg = _WorkerGroup()
    trainer.mini_batch_plan = plan
    return trainer


def test_planned_rows_reach_update_actor_through_verls_update_actor(tmp_path):
    """verl's PPOTrainer._update_actor writes ppo_mini_batch_size * rollout.n = 8 rows; the plan's
    size and shuffle flag are what update_actor receives, and verl's own method is back afterwards."""
    from transfer_queue import KVBatchMeta

    plan = plan_mini_batches(rows=100, max_rows=30, multiple=1)
    trainer = _trainer_without_workers(tmp_path, plan, shuffle=True)
    original = trainer.actor_rollout_wg.update_actor
    metrics: dict = {}
    trainer._update_actor(KVBatchMeta(), metrics)
    [info] = trainer.actor_rollout_wg.calls
    assert info["global_batch_size"] == info["mini_batch_size"] == plan.mini_batch_rows == 25
    assert info["dataloader_kwargs"] == {"shuffle": True}
    assert info["epochs"] == 1 and info["temperature"] == 1.0  # verl's other entries untouched
    assert metrics["update/num_mini_batches"] == 4.0 and metrics["actor/pg_loss"] == 1.0
    assert trainer.actor_rollout_wg.update_actor is original


def test_without_a_plan_verl_splits_by_tasks(tmp_path):
    from transfer_queue import KVBatchMeta

    trainer = _trainer_without_workers(tmp_path, None)
    trainer._update_actor(KVBatchMeta(), {})
    [info] = trainer.actor_rollout_wg.calls
    assert info["mini_batch_size"] == 8 and info["dataloader_kwargs"] == {"shuffle": False}  # 2 tasks * n=4


def test_the_swap_is_undone_when_the_update_fails():
    from transfer_queue import KVBatchMeta

    from verl_gigpo.trainer import planned_update_actor

    class Failing:
        def update_actor(self, data):  # a class method, not bound on the instance
            raise RuntimeError("worker died")

    group = Failing()
    with pytest.raises(RuntimeError, match="worker died"):
        with planned_update_actor(group, plan_mini_batches(rows=10, max_rows=5, multiple=1), shuffle=False):
            group.update_actor(KVBatchMeta())
    assert "update_actor" not in vars(group)
