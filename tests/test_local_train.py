"""The local engine on a tiny real model and the real gridnav environment (CPU-only): one iteration changes the
parameters for every estimator, micro-batching and de-duplication are exact, resume equals an uninterrupted run,
and bad configs fail clearly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from verl_gigpo.local.train import LocalTrainer, load_config, main

# An easy gridnav variant (3x3, no walls, goal 1-2 steps away, 4 steps): a random policy wins about half the
# episodes, so groups have mixed outcomes and the advantages are not all zero.
EASY = ["env.kwargs.size=3", "env.kwargs.walls=0", "env.kwargs.min_path=1", "env.max_steps=4"]


def _cfg(model_dir, out_dir, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.default_local_dir={out_dir}",
            "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=3",
            "data.val_size=4",
            "local.progress=false",
            "local.plot=false",
            *EASY,
            *extra,
        ]
    )


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("estimator", ["gigpo", "gigpo-similarity", "grpo", "rloo"])
def test_one_iteration_updates_the_model_cpu(tiny_model_dir, tmp_path, estimator):
    extra = [f"algorithm.adv_estimator={estimator.split('-')[0]}"]
    if estimator == "gigpo-similarity":  # observation texts grouped by similarity (verl_gigpo.anchors)
        extra += ["algorithm.gigpo.key_mode=similarity", "algorithm.gigpo.similarity_threshold=0.95"]
    trainer = LocalTrainer(_cfg(tiny_model_dir, tmp_path, *extra))
    try:
        before = _params(trainer.model)
        metrics = trainer.train_step()
        after = _params(trainer.model)
    finally:
        trainer.close()
    assert 0 < metrics["env/success_rate"] < 1  # mixed outcomes -> a learning signal
    assert metrics["adv/abs_mean"] > 0
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert math.isfinite(metrics[key]), key
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # identical (prompt, response-but-last) rows are forwarded once; the actor's log-probs of the sampled
    # tokens equal the server's up to float rounding
    assert metrics["rollout/forward_rows"] < metrics["rollout/rows"]
    assert metrics["rollout/logprob_diff_max"] < 1e-4
    assert metrics["rollout/batch_size_mean"] > 1  # concurrent episodes shared batched generations
    if estimator.startswith("gigpo"):
        assert trainer.episode_config.key_mode == ("observation" if "similarity" in estimator else "state")
        assert metrics["gigpo/num_episode_groups"] == 3
        assert metrics["gigpo/step_group_size_mean"] > 1
    for key in ("timing_s/rollout", "timing_s/generate", "timing_s/env", "timing_s/adv", "timing_s/update"):
        assert metrics[key] >= 0


def test_micro_batching_and_epochs_with_kl_and_entropy_cpu(tiny_model_dir, tmp_path):
    """Micro-batch size 1 and 256 give the same update (losses are normalised by the whole mini-batch);
    two epochs over two mini-batches with a KL term and an entropy bonus run and stay finite."""
    results = []
    for micro in (1, 256):
        cfg = _cfg(
            tiny_model_dir, tmp_path / str(micro), f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"
        )
        trainer = LocalTrainer(cfg)
        try:
            metrics = trainer.train_step()
            results.append((_params(trainer.model), metrics))
        finally:
            trainer.close()
    (p1, m1), (p2, m2) = results
    # same loss and same gradient (its norm before clipping); parameters are not compared element-wise because
    # Adam's first step moves every weight by +-lr whatever the size of its gradient, so float noise in a
    # near-zero gradient entry can flip a sign
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], abs=1e-6)
    assert m1["actor/entropy"] == pytest.approx(m2["actor/entropy"], rel=1e-6)
    assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-5)
    assert m1["actor/grad_norm"] > 0

    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "ppo",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
    )
    trainer = LocalTrainer(cfg)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["actor/kl_loss"] > 0  # the later optimizer steps move away from the reference
    assert all(math.isfinite(metrics[k]) for k in ("actor/pg_loss", "actor/kl_loss", "actor/ppo_kl"))


def test_resume_gives_the_same_run_cpu(tiny_model_dir, tmp_path):
    common = ["trainer.test_freq=1", "trainer.save_freq=1"]
    straight = LocalTrainer(_cfg(tiny_model_dir, tmp_path / "a", "trainer.total_training_steps=2", *common))
    try:
        history_a = straight.fit()
        params_a = _params(straight.model)
    finally:
        straight.close()

    first = LocalTrainer(_cfg(tiny_model_dir, tmp_path / "b", "trainer.total_training_steps=1", *common))
    try:
        first.fit()
    finally:
        first.close()
    resumed = LocalTrainer(
        _cfg(tiny_model_dir, tmp_path / "b", "trainer.total_training_steps=2", "trainer.resume=true", *common)
    )
    try:
        history_b = resumed.fit()  # trainer.resume=true: restores iteration 1 (model, optimizer, RNGs, metrics)
        params_b = _params(resumed.model)
    finally:
        resumed.close()

    assert all(torch.equal(params_a[k], params_b[k]) for k in params_a)

    def comparable(history):
        # wall-clock timings differ between runs; everything else must be identical
        return [{k: v for k, v in m.items() if not k.startswith("timing_s/")} for m in history]

    assert comparable(history_a) == comparable(history_b)
    assert [m["training_step"] for m in history_b] == [0.0, 1.0, 2.0]
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert comparable(lines) == comparable(history_b)


def test_config_errors_are_clear_cpu(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="sections"):
        load_config(["trainer.no_such_key=1"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(["trainer.seed"])
    with pytest.raises(ValueError, match="adv_estimator"):
        load_config(["algorithm.adv_estimator=ppo"])
    with pytest.raises(ValueError, match="rollout.n"):
        load_config(["actor_rollout_ref.rollout.n=0"])
    with pytest.raises(ValueError, match="temperature=0"):
        load_config(["actor_rollout_ref.rollout.temperature=0"])
    with pytest.raises(ValueError, match="norm"):
        load_config(["algorithm.gigpo.norm=max"])
    with pytest.raises(ValueError, match="tiny_model"):
        LocalTrainer(load_config([f"actor_rollout_ref.model.path={tmp_path / 'missing'}"]))


def test_cli_writes_metrics_plot_and_checkpoint_cpu(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
            "data.val_size=2", "local.progress=false", *EASY]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "validation success:" in printed and str(out / "metrics.jsonl") in printed
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["training_step"] for m in lines] == [0.0, 1.0]
    assert "val/success_rate" in lines[0] and "val/success_rate" in lines[1]
    assert np.isfinite(lines[1]["actor/pg_loss"])
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
