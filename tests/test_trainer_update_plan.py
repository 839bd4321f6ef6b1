"""The ``gigpo_sync`` trainer mode's split of an iteration's step rows into optimizer steps (``trainer.v1.gigpo_sync``).

Hand-computed cases of :func:`verl_gigpo.verl_glue.trainer.plan_mini_batches` and the settings reader; the plan reaching
the workers through verl's own ``_update_actor`` on the trainer mode built by its constructor; the measurement of verl's
public route (``ppo_mini_batch_size = mini_batch_rows / rollout.n`` with ``actor.shuffle=true``) against the plan,
through verl's own padding multiple, ``_update_actor`` and the workers' mini-batch split. That verl's actor really
takes this many optimizer steps is checked on the real pipeline in ``tests/test_e2e_verl_cpu.py`` (optimizer state of
the checkpoints).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl_gigpo.verl_glue.trainer import MiniBatchPlan, UpdateSettings, plan_mini_batches

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


def _trainer(tmp_path: Path, *overrides: str):
    """The real GiGPOTrainerSync, built by its constructor from ``verl_gigpo/config/gigpo_trainer.yaml`` and
    ``overrides`` (no Ray, no model: verl builds its workers later, in ``init_workers``); a :class:`_WorkerGroup`
    stands in for the remote workers ``init_workers`` would give it."""
    from verl_gigpo.verl_glue.trainer import GiGPOTrainerSync

    base = [
        f"actor_rollout_ref.model.path={tmp_path}",
        f"trainer.default_local_dir={tmp_path}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.rollout.temperature=1.0",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        trainer = GiGPOTrainerSync(compose(config_name="gigpo_trainer", overrides=[*base, *overrides]))
    trainer.actor_rollout_wg = _WorkerGroup()
    return trainer


def _trainer_without_workers(tmp_path: Path, plan: MiniBatchPlan | None, *, shuffle: bool = True):
    """:func:`_trainer` with two tasks of n = 4 per iteration; ``plan`` is the split ``_balance_batch`` would have
    planned for the iteration."""
    trainer = _trainer(
        tmp_path,
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.shuffle=false",
        "actor_rollout_ref.rollout.n=4",
        f"trainer.v1.gigpo_sync.mini_batch_rows={'null' if plan is None else 256}",
        f"trainer.v1.gigpo_sync.shuffle_rows={str(shuffle).lower()}",
    )
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
    assert trainer.mini_batch_plan is None  # used once: the next iteration's _balance_batch plans the next


def test_an_update_that_never_reaches_the_worker_group_is_refused(tmp_path, monkeypatch):
    """If verl's _update_actor stopped calling actor_rollout_wg.update_actor, the plan would silently not apply."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    from verl_gigpo.verl_glue.verl_version import VerlMismatchError

    trainer = _trainer_without_workers(tmp_path, plan_mini_batches(rows=100, max_rows=30, multiple=1))
    monkeypatch.setattr(PPOTrainer, "_update_actor", lambda self, batch, metrics: batch)  # restored afterwards
    with pytest.raises(VerlMismatchError, match=r"PPOTrainer\._update_actor.*did not call it"):
        trainer._update_actor(KVBatchMeta(), {})


def test_the_row_count_lives_only_inside_balance_batch(tmp_path):
    """_get_required_batch_multiple plans only while _balance_batch runs; any other call gets verl's answer and
    leaves this iteration's plan alone."""
    trainer = _trainer(
        tmp_path,
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        "trainer.v1.gigpo_sync.mini_batch_rows=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    )
    assert trainer._get_required_batch_multiple(1) == 8  # verl's: ppo_mini_batch_size * n
    assert trainer.mini_batch_plan is None
    with trainer._splitting(37):
        assert trainer._get_required_batch_multiple(1) == 13  # ceil(37 / 3)
    assert trainer.mini_batch_plan == MiniBatchPlan(rows=37, mini_batch_rows=13, num_mini_batches=3)
    assert trainer._get_required_batch_multiple(1) == 8
    assert trainer.mini_batch_plan.rows == 37


def test_without_a_plan_verl_splits_by_tasks(tmp_path):
    from transfer_queue import KVBatchMeta

    trainer = _trainer_without_workers(tmp_path, None)
    trainer._update_actor(KVBatchMeta(), {})
    [info] = trainer.actor_rollout_wg.calls
    assert info["mini_batch_size"] == 8 and info["dataloader_kwargs"] == {"shuffle": False}  # 2 tasks * n=4


def test_the_swap_is_undone_when_the_update_fails():
    from transfer_queue import KVBatchMeta

    from verl_gigpo.verl_glue.trainer import planned_update_actor

    class Failing:
        def update_actor(self, data):  # a class method, not bound on the instance
            raise RuntimeError("worker died")

    group = Failing()
    with pytest.raises(RuntimeError, match="worker died"):
        with planned_update_actor(group, plan_mini_batches(rows=10, max_rows=5, multiple=1), shuffle=False):
            group.update_actor(KVBatchMeta())
    assert "update_actor" not in vars(group)


# ------------------------------------------------------------------ verl's public route, measured against the plan
N, M = 4, 16  # rollout.n and mini_batch_rows; the public route sets ppo_mini_batch_size = M / N


def _split_through_verl(trainer, rows: int) -> dict:
    """The rows of one iteration through verl's own code: the padding multiple of ``_get_required_batch_multiple``
    (inside ``_balance_batch``, one data-parallel rank), verl's padding rule (``upsample_batch_to_divisible_size``
    appends rows up to the next multiple), ``_update_actor``'s ``extra_info`` and the split of
    ``TrainingWorker.train_mini_batch`` (``verl.utils.tensordict_utils.make_iterator`` with that ``extra_info``; one
    optimizer step per mini-batch).

    Returns:
        ``padding`` rows, ``mini_batch_rows``, ``steps`` (optimizer steps), ``real`` (real rows per mini-batch) and
        ``seen`` (every real row index taken, in order).
    """
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.utils import tensordict_utils as tu

    with trainer._splitting(rows):
        multiple = trainer._get_required_batch_multiple(1)
    padded = rows + (-rows) % multiple
    trainer._update_actor(KVBatchMeta(), {})
    info = trainer.actor_rollout_wg.calls[-1]
    batch = TensorDict({"row": torch.arange(padded)}, batch_size=[padded])
    mini_batches = list(
        tu.make_iterator(
            batch,
            info["mini_batch_size"],
            info["epochs"],
            seed=info["seed"],
            dataloader_kwargs=info["dataloader_kwargs"],
        )
    )
    real = [mb["row"][mb["row"] < rows] for mb in mini_batches]
    return {
        "padding": padded - rows,
        "mini_batch_rows": info["mini_batch_size"],
        "shuffle": info["dataloader_kwargs"]["shuffle"],
        "steps": len(mini_batches),
        "real": [len(r) for r in real],
        "seen": torch.cat(real).tolist(),
    }


@pytest.mark.parametrize("rows", [5, 37, 50, 83, 205])  # step rows vary per episode: none a multiple of n = 4
def test_public_route_same_rows_and_steps_but_not_the_same_split(tmp_path, rows):
    """The answer to "could ppo_mini_batch_size = mini_batch_rows / rollout.n with actor.shuffle=true replace the
    overrides?" (docs/verl-integration.md, "Why not verl's public route"): the same rows and optimizer steps, not the
    same split.

    The plan pads to its adapted mini-batch size m = ceil(R / k) rounded to the multiple (here 1), so fewer than
    ``multiple`` padding rows and equal mini-batches; the public route always pads to a multiple of M, up to M - 1
    padding rows (verl's 128-token no-op rows, through every log-prob and update pass), so its mini-batches mix real
    and padding rows at random (a short batch: one mini-batch of M rows, mostly padding)."""
    micro = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]
    micro += ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"]
    planned = _trainer(
        tmp_path, f"actor_rollout_ref.rollout.n={N}", f"trainer.v1.gigpo_sync.mini_batch_rows={M}", *micro
    )
    public = _trainer(
        tmp_path,
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={M // N}",
        "actor_rollout_ref.actor.shuffle=true",
        "trainer.v1.gigpo_sync.mini_batch_rows=null",
        *micro,
    )
    plan, route = _split_through_verl(planned, rows), _split_through_verl(public, rows)
    # the same rows, each once per epoch, and the same number of optimizer steps, both shuffled
    assert sorted(plan["seen"]) == sorted(route["seen"]) == list(range(rows))
    assert plan["steps"] == route["steps"] == math.ceil(rows / M)
    assert plan["shuffle"] and route["shuffle"]
    # not the same split: the public route's mini-batches are M rows whatever R is, padded by up to M - 1 rows
    expected = plan_mini_batches(rows, M, 1)
    assert plan["mini_batch_rows"] == expected.mini_batch_rows == math.ceil(rows / plan["steps"])
    assert plan["padding"] == plan["steps"] * expected.mini_batch_rows - rows < plan["steps"]
    assert max(plan["real"]) - min(plan["real"]) <= plan["padding"]  # equal mini-batches but for < k padding rows
    assert route["mini_batch_rows"] == M and route["padding"] == (-rows) % M
    if expected.mini_batch_rows == M:  # R just under a multiple of M (205 = 13 x 16 - 3): the same split
        assert route["padding"] == plan["padding"]
    else:
        assert route["padding"] > plan["padding"]


def test_public_route_refused_by_verl_at_the_reference_settings():
    """ALFWorld (recipes/reference_settings.yaml): 16 tasks of n = 8, mini_batch_rows 256. The public route needs
    ppo_mini_batch_size = 256 / 8 = 32 tasks, and verl's own config check (``ActorConfig.validate``, run by
    ``verl.utils.config.validate_config`` before training) refuses a mini-batch larger than the 16 tasks of an
    iteration: step rows outnumber tasks x n, which verl's mini-batch size counts in."""
    from verl.workers.config import FSDPActorConfig

    actor = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=256 // 8, ppo_micro_batch_size_per_gpu=1, rollout_n=8)
    with pytest.raises(ValueError, match=r"train_batch_size \(16\).*ppo_mini_batch_size \(32\)"):
        actor.validate(n_gpus=1, train_batch_size=16)
    FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, rollout_n=8).validate(
        n_gpus=1, train_batch_size=16
    )  # what the plan runs with: verl's mini-batch setting is not the row count
