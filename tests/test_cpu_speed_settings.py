"""The `cpu` platform's speed settings reach verl's objects, and the start-up timeline records real calls.

The speed itself is measured by ``benchmarks/bench_verl_cpu.py`` (RESULTS.md), never asserted here; that the
settings keep the pipeline's numbers is checked by ``tests/test_cpu_micro_batches.py`` (row order, selection) and by
the end-to-end run (``tests/test_e2e_verl_cpu.py``: rollout and actor log-probs, synced weights).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl_gigpo.dev import timeline as tl
from verl_gigpo.verl_glue.cpu import check_cpu_config

ROOT = Path(__file__).resolve().parents[1]


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=list(overrides))


def _trainer(action_model_dir, *overrides: str):
    from verl_gigpo.verl_glue.trainer import GiGPOTrainerSync

    return GiGPOTrainerSync(_compose(f"actor_rollout_ref.model.path={action_model_dir}", *overrides))


def test_replay_buffer_polls_at_the_configured_interval(action_model_dir):
    assert _trainer(action_model_dir).replay_buffer.poll_interval == 2.0  # null: verl's own default
    assert _trainer(action_model_dir, "platform=cpu").replay_buffer.poll_interval == 0.1
    fast = _trainer(action_model_dir, "platform=cpu", "trainer.v1.sampler.poll_interval=0.5")
    assert fast.replay_buffer.poll_interval == 0.5


@pytest.mark.parametrize("value", ["0", "-1", "fast", "true"])
def test_a_bad_poll_interval_names_the_key(action_model_dir, value):
    with pytest.raises(ValueError, match=r"trainer\.v1\.sampler\.poll_interval=.*> 0"):
        _trainer(action_model_dir, f"trainer.v1.sampler.poll_interval={value}")


def test_the_cpu_platform_sorts_micro_batches_for_every_pass():
    cfg = _compose("platform=cpu", "actor_rollout_ref.actor.use_kl_loss=true")
    arr = cfg.actor_rollout_ref
    assert arr.actor.use_dynamic_bsz and arr.actor.ppo_max_token_len_per_gpu == 1024
    # verl's log-prob passes follow the actor's settings (oc.select interpolations in verl's config)
    assert arr.rollout.log_prob_use_dynamic_bsz and arr.rollout.log_prob_max_token_len_per_gpu == 1024
    assert arr.ref.log_prob_use_dynamic_bsz and arr.ref.log_prob_max_token_len_per_gpu == 1024
    assert not arr.model.use_remove_padding  # the sorted split is for padded rows
    assert cfg.ray_kwargs.ray_init.include_dashboard is False and cfg.reward.num_workers == 0
    check_cpu_config(cfg)


def test_no_reward_workers_only_with_the_agent_loop_that_scores_itself():
    cfg = _compose("platform=cpu", "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent")
    with pytest.raises(ValueError, match="reward.num_workers=0 with default_agent_loop=single_turn_agent"):
        check_cpu_config(cfg)
    check_cpu_config(
        _compose(
            "platform=cpu",
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
            "reward.num_workers=1",
        )
    )


def test_every_timed_call_exists_in_the_installed_verl():
    for module_name, path, _ in tl.SPANS:
        owner = importlib.import_module(module_name)
        for part in path.split("."):
            owner = getattr(owner, part)
        assert callable(owner), (module_name, path)


class _Owner:
    calls: list[tuple] = []

    def method(self, x, *, y=0):
        self.calls.append((x, y))
        return x + y

    @classmethod
    def create(cls, value):
        return (cls.__name__, value)


def test_wrapped_calls_behave_the_same_and_append_one_record_each(tmp_path, monkeypatch):
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(tl.ENV, str(path))
    module = type(importlib)("fake_module")
    module._Owner = type("Owner", (_Owner,), {})
    tl._wrap(module, "_Owner.method", "method_span")
    tl._wrap(module, "_Owner.create", "create_span")
    tl._wrap(module, "_Owner.method", "method_span")  # idempotent: not timed twice
    assert module._Owner().method(2, y=3) == 5 and module._Owner.create(7) == ("Owner", 7)
    with pytest.raises(TypeError):
        module._Owner().method()  # errors pass through; the call is still recorded
    records = tl.read_timeline(path)
    assert [r["label"] for r in records] == ["method_span", "create_span", "method_span"]
    assert all(r["end"] >= r["start"] for r in records)
    monkeypatch.delenv(tl.ENV)
    module._Owner().method(1)
    assert len(tl.read_timeline(path)) == 3  # without GIGPO_TIMELINE nothing is written


def test_bypass_mode_recomputes_on_each_launchs_first_iteration_and_every_nth(action_model_dir):
    """platform=cpu sets verl's bypass mode; the trainer mode picks the iterations whose old log-probs the actor
    recomputes anyway (the launch's first, then every logprob_check_freq-th), and turns bypass mode off for that
    call only (the e2e test checks the logged metrics of a real run)."""
    trainer = _trainer(action_model_dir, "platform=cpu", "trainer.v1.gigpo_sync.logprob_check_freq=4")
    correction = trainer.config.algorithm.rollout_correction
    assert correction.bypass_mode is True
    due = []
    for step in range(3, 13):  # a resumed launch: its first iteration is 3
        trainer.global_steps = step
        if trainer._logprob_check_due():
            due.append(step)
            trainer._logprob_checked = True
    assert due == [3, 4, 8, 12]
    # a checked iteration takes verl's non-bypass branch (which calls the actor worker group, absent here) and
    # leaves bypass mode on afterwards, whatever happens inside
    from transfer_queue import KVBatchMeta

    trainer.global_steps, trainer._logprob_checked = 16, True
    with pytest.raises(AttributeError, match="actor_rollout_wg"):
        trainer._compute_old_log_prob(KVBatchMeta(keys=["row0"], tags=[{}], partition_id="train"), {})
    assert correction.bypass_mode is True
    never = _trainer(action_model_dir, "platform=cpu", "trainer.v1.gigpo_sync.logprob_check_freq=0")
    assert not never._logprob_check_due()


def test_the_smoke_check_requires_the_rollout_vs_actor_gap_at_a_launchs_first_iteration():
    from verl_gigpo.dev.smoke import ROLLOUT_GAP_LIMIT, RunResult, check_runs

    def problems(first_row: dict) -> list[str]:
        # a launch that ends normally (the smoke's grpo launch is stopped on purpose by a kill: its own checks)
        run = RunResult("grpo_resume", Path("unused"), 0, 1.0)
        base = {"env/success_rate": 0.5, "episode/num_step_rows": 10, "actor/pg_loss": 0.1, "actor/grad_norm": 1.0}
        run.metrics = [{"step": 1, **base, **first_row}, {"step": 2, **base}]  # iteration 2 bypassed: no gap
        return check_runs({"grpo_resume": run}, Path("unused"))

    assert problems({"training/rollout_probs_diff_max": 7e-7}) == []
    [missing] = problems({})
    assert "iteration 1 logged no rollout-vs-actor gap" in missing and "logprob_check_freq >= 1" in missing
    [wrong] = problems({"training/rollout_probs_diff_max": 0.3})
    assert f"differ by 0.3 (allowed {ROLLOUT_GAP_LIMIT}): the served weights are not the actor's" in wrong
