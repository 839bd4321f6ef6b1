"""Request seeds (verl_gigpo.rollout.seeding) on the local engine with a tiny real model and real gridnav (CPU-only):
validations repeat, whatever the estimator; the members of a group differ; switched off, sampling does not repeat.
verl's agent loop is checked with real verl objects in tests/test_verl_agent_loop_trainer.py."""

from __future__ import annotations

import hashlib

import pytest

from verl_gigpo.local.config import load_config
from verl_gigpo.local.rollout import LocalRollout
from verl_gigpo.local.train import LocalTrainer
from verl_gigpo.rollout import TaskSpec
from verl_gigpo.rollout.seeding import (
    VALIDATION_STREAM,
    EpisodeSeeds,
    request_seed,
    seed_param,
    seeded_sampling_from,
    training_stream,
)

TASK = TaskSpec("gridnav", 3, "test")


def test_the_seed_is_a_stable_hash_of_every_part():
    base = request_seed(42, VALIDATION_STREAM, TASK, 1, 2)
    # the documented formula (docs/reproducibility.md): BLAKE2b-64 of the parts joined by "|", its top 31 bits; the
    # pinned value holds it fixed across processes, Python versions and releases (a change re-rolls every run)
    digest = hashlib.blake2b(b"42|val|gridnav|test|3|1|2", digest_size=8).digest()
    assert base == int.from_bytes(digest, "little") >> 33 == 811158392
    others = [
        request_seed(43, VALIDATION_STREAM, TASK, 1, 2),
        request_seed(42, training_stream(1, 0), TASK, 1, 2),
        request_seed(42, VALIDATION_STREAM, TaskSpec("gridnav", 4, "test"), 1, 2),
        request_seed(42, VALIDATION_STREAM, TaskSpec("gridnav", 3, "train"), 1, 2),
        request_seed(42, VALIDATION_STREAM, TaskSpec("sokoban", 3, "test"), 1, 2),
        request_seed(42, VALIDATION_STREAM, TASK, 0, 2),
        request_seed(42, VALIDATION_STREAM, TASK, 1, 3),
    ]
    assert len({base, *others}) == 8
    assert all(0 <= s < 2**31 for s in [base, *others])
    assert training_stream(2, 5) != training_stream(5, 2)
    # env_kwargs are not part of the task's identity (the row's env, split and seed are)
    assert request_seed(42, VALIDATION_STREAM, TaskSpec("gridnav", 3, "test", {"size": 5}), 1, 2) == base


def test_episode_seeds_set_the_backends_parameter_and_replace_a_generator():
    seeds = EpisodeSeeds(7, VALIDATION_STREAM, TASK, 0, seed_param("sglang"))
    params = seeds.sampling_params({"temperature": 1.0, "generator": object()}, step=4)
    assert params == {"temperature": 1.0, "sampling_seed": seeds.at(4)}
    assert seed_param("vllm") == seed_param("hf") == seed_param(None) == "seed"


@pytest.mark.parametrize("value", ["maybe", 1, None])
def test_a_bad_seeded_sampling_value_is_refused_naming_the_key(value, tiny_model_dir):
    with pytest.raises(ValueError, match="env.seeded_sampling must be true or false"):
        seeded_sampling_from({"seeded_sampling": value})
    if value == "maybe":
        with pytest.raises(ValueError, match="env.seeded_sampling"):
            load_config([f"actor_rollout_ref.model.path={tiny_model_dir}", "env.seeded_sampling=maybe"])


def _cfg(model_dir, out_dir, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.default_local_dir={out_dir}",
            "env.name=gridnav",
            "env.max_steps=6",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
            "actor_rollout_ref.rollout.val_kwargs.n=2",
            "data.train_batch_size=2",
            "data.val_size=4",
            "local.progress=false",
            "local.plot=false",
            *extra,
        ]
    )


def _replies(episodes) -> list[list[list[int]]]:
    return [[list(step.response_ids) for step in episode.steps] for episode in episodes]


def test_validations_repeat_whatever_the_estimator_and_members_differ(tiny_model_dir, tmp_path):
    """Two validations of one model sample the same episodes; so does a validation of a run with another estimator
    (common random numbers); the sampled members of a group differ; with env.seeded_sampling=false two validations
    draw from the server's advancing generator and differ."""
    played = {}
    for estimator in ("gigpo", "grpo"):
        trainer = LocalTrainer(_cfg(tiny_model_dir, tmp_path / estimator, f"algorithm.adv_estimator={estimator}"))
        try:
            played[estimator] = [_replies(trainer.rollouts.validation_episodes()) for _ in range(2)]
            training = trainer.rollout([TaskSpec("gridnav", 5, "train")], 4, validation=False, iteration=1)
        finally:
            trainer.close()
    assert played["gigpo"][0] == played["gigpo"][1] == played["grpo"][0] == played["grpo"][1]
    first_replies = {tuple(map(tuple, replies))[:1] for replies in _replies(training)}
    assert len(first_replies) > 1  # one prompt, four seeds: the members do not all reply alike

    unseeded = LocalRollout(_cfg(tiny_model_dir, tmp_path / "off", "env.seeded_sampling=false"))
    try:
        assert _replies(unseeded.validation_episodes()) != _replies(unseeded.validation_episodes())
    finally:
        unseeded.close()
