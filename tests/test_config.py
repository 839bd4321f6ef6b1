"""CPU tests of GiGPOConfig: defaults, validation messages, from_mapping with dicts and OmegaConf, and that
its estimator kwargs drive the real estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_gigpo.advantage import compute_gigpo_advantage
from verl_gigpo.config import GiGPOConfig


def test_defaults_follow_the_paper():
    cfg = GiGPOConfig()
    assert (cfg.gamma, cfg.step_advantage_w, cfg.norm, cfg.epsilon) == (0.95, 1.0, "mean_std", 1e-6)
    assert (cfg.episode_stats, cfg.key_mode, cfg.similarity_threshold) == ("trajectory", "observation", 0.9)
    assert cfg.env_key_mode == "observation" and cfg.anchor_similarity_threshold is None


def test_estimator_kwargs_drive_the_estimator():
    cfg = GiGPOConfig(gamma=0.5, norm="mean", step_advantage_w=0.0, episode_stats="step")
    kwargs = cfg.estimator_kwargs()
    assert kwargs == {"gamma": 0.5, "step_advantage_w": 0.0, "norm": "mean", "epsilon": 1e-6, "episode_stats": "step"}
    # Group of two one-step trajectories with rewards 1 and 0: norm="mean", w=0 -> advantages +0.5 and -0.5.
    adv, ret = compute_gigpo_advantage(
        torch.tensor([1.0, 0.0]), torch.ones(2, 3), np.zeros(2), np.arange(2), np.zeros(2, int), ["s", "s"], **kwargs
    )
    torch.testing.assert_close(adv, torch.tensor([[0.5] * 3, [-0.5] * 3]))
    torch.testing.assert_close(ret, torch.tensor([[1.0] * 3, [0.0] * 3]))


@pytest.mark.parametrize(
    ("key_mode", "env_key_mode", "threshold"),
    [
        ("observation", "observation", None),
        ("state", "state", None),
        ("history:3", "history:3", None),
        ("similarity", "observation", 0.8),
    ],
)
def test_key_modes(key_mode, env_key_mode, threshold):
    cfg = GiGPOConfig(key_mode=key_mode, similarity_threshold=0.8)
    assert cfg.env_key_mode == env_key_mode
    assert cfg.anchor_similarity_threshold == threshold


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("gamma", -0.1, r"gamma=-0\.1 .*\[0, 1\].*0\.95"),
        ("gamma", 1.01, r"gamma=1\.01 .*\[0, 1\]"),
        ("gamma", "0.95", r"gamma='0.95' must be a number"),
        ("gamma", float("nan"), r"gamma=nan must be a number"),
        ("step_advantage_w", -1.0, r"step_advantage_w=-1\.0 .*>= 0.*1\.0"),
        ("step_advantage_w", float("inf"), r"step_advantage_w=inf .*finite"),
        ("step_advantage_w", True, r"step_advantage_w=True .*number"),
        (
            "norm",
            "mean_norm",
            r"norm='mean_norm'.*mode='mean_norm' meant 'mean'.*'mean_std'.*'mean'",
        ),
        ("norm", "mean_std_norm", r"'mean_std_norm' is 'mean_std'"),
        ("norm", "std", r"norm='std'.*'mean_std'"),
        ("epsilon", 0.0, r"epsilon=0\.0 .*> 0"),
        ("episode_stats", "steps", r"episode_stats='steps'.*'trajectory'.*'step'"),
        ("key_mode", "history", r"key_mode='history'.*'observation'.*'history:K'"),
        ("key_mode", "history:x", r"key_mode='history:x' is not valid"),
        ("similarity_threshold", 0.0, r"similarity_threshold=0\.0 .*\(0, 1\]"),
        ("similarity_threshold", 1.5, r"similarity_threshold=1\.5 .*\(0, 1\]"),
        ("similarity_threshold", None, r"similarity_threshold=None must be a number"),
    ],
)
def test_validation_messages(field, value, match):
    with pytest.raises(ValueError, match=match):
        GiGPOConfig(**{field: value})


def test_numbers_are_normalised_to_float():
    cfg = GiGPOConfig(gamma=1, step_advantage_w=np.float32(0.5), similarity_threshold=np.int64(1))
    assert type(cfg.gamma) is float and cfg.gamma == 1.0
    assert type(cfg.step_advantage_w) is float and cfg.step_advantage_w == 0.5
    assert type(cfg.similarity_threshold) is float


def test_from_mapping_dict_and_dictconfig():
    assert GiGPOConfig.from_mapping({"gamma": 0.9, "norm": "mean"}) == GiGPOConfig(gamma=0.9, norm="mean")
    assert GiGPOConfig.from_mapping(None) == GiGPOConfig()
    # A Hydra-style node with an interpolation and a null (= default).
    root = OmegaConf.create(
        {
            "discount": 0.97,
            "algorithm": {
                "gigpo": {
                    "gamma": "${discount}",
                    "step_advantage_w": 0.5,
                    "key_mode": "similarity",
                    "similarity_threshold": 0.95,
                    "epsilon": None,
                }
            },
        }
    )
    cfg = GiGPOConfig.from_mapping(root.algorithm.gigpo)
    assert cfg == GiGPOConfig(gamma=0.97, step_advantage_w=0.5, key_mode="similarity", similarity_threshold=0.95)
    assert cfg.anchor_similarity_threshold == 0.95 and cfg.env_key_mode == "observation"


@pytest.mark.parametrize("gamma", [True, "0.9", -0.5])
def test_algorithm_gamma_is_checked_as_every_gamma(gamma):
    # verl's algorithm.gamma went through float() first: True became 1.0 and "0.9" became 0.9, values that
    # algorithm.gigpo.gamma and the estimator reject. One rule now, with one message.
    with pytest.raises(ValueError) as from_algorithm:
        GiGPOConfig.from_algorithm({"gamma": gamma})
    with pytest.raises(ValueError) as direct:
        GiGPOConfig(gamma=gamma)
    # the same rule and words, with the key named as it is typed in verl's config
    assert str(from_algorithm.value) == f"algorithm.{direct.value}"
    assert GiGPOConfig.from_algorithm({"gamma": 1}).gamma == 1.0  # an int is a number


def test_from_mapping_rejects_unknown_keys_and_non_mappings():
    with pytest.raises(ValueError, match=r"unknown .*key\(s\) \['mode'\].*\['gamma', "):
        GiGPOConfig.from_mapping(OmegaConf.create({"gamma": 0.9, "mode": "mean_norm"}))
    with pytest.raises(ValueError, match=r"dict or DictConfig.*list"):
        GiGPOConfig.from_mapping([("gamma", 0.9)])
    with pytest.raises(ValueError, match=r"gamma=2\.0 .*\[0, 1\]"):
        GiGPOConfig.from_mapping({"gamma": 2.0})


# ---------------------------------------------------------------------------------------------- the successors


def test_method_and_sections_from_algorithm():
    algorithm = {
        "adv_estimator": "graphgpo",
        "gamma": 0.9,
        "gigpo": {"norm": "mean"},
        "hgpo": {"history_length": None, "alpha": 2},
        "graphgpo": {"omega": 0.2, "progress": True},
        "g2po": {"invalid_penalty": None},
    }
    cfg = GiGPOConfig.from_algorithm(algorithm, env={"history_length": 4, "invalid_action_penalty": 0.3})
    assert (cfg.method, cfg.gamma, cfg.norm) == ("graphgpo", 0.9, "mean")
    assert (cfg.graphgpo.omega, cfg.graphgpo.progress, cfg.graphgpo.success_reward) == (0.2, True, 10.0)
    assert (cfg.hgpo.history_length, cfg.hgpo.alpha) == (4, 2.0)  # null -> env.history_length
    assert cfg.g2po.invalid_penalty == 0.3  # null -> env.invalid_action_penalty
    # without env the papers' values; grpo runs get a (checked) gigpo config
    plain = GiGPOConfig.from_algorithm({"adv_estimator": "grpo", "hgpo": {"history_length": None}})
    assert (plain.method, plain.hgpo.history_length, plain.g2po.invalid_penalty) == ("gigpo", 2, 0.1)
    assert GiGPOConfig.from_algorithm({"adv_estimator": "grpo"}, method="g2po").method == "g2po"


@pytest.mark.parametrize(
    ("algorithm", "env", "match"),
    [
        ({"hgpo": {"alpha": -1}}, None, r"algorithm\.hgpo\.alpha=-1 .*>= 0"),
        ({"hgpo": {"weight_base": "L"}}, None, r"algorithm\.hgpo\.weight_base='L' is not valid"),
        ({"graphgpo": {"omega": 0}}, None, r"algorithm\.graphgpo\.omega=0 .*\(0, 1\]"),
        ({"g2po": {"success_reward": "10"}}, None, r"algorithm\.g2po\.success_reward='10' .*number"),
        (
            {"graphgpo": {"gamma": 0.1}},
            None,
            r"unknown algorithm\.graphgpo key\(s\) \['gamma'\]; known keys: \['omega'",
        ),
        # an inherited env value is named as the env key, by the rule both engines check (verl_gigpo.config.rules)
        ({"hgpo": {}}, {"history_length": -2}, r"^env\.history_length=-2 .*>= 0"),
        ({}, {"invalid_action_penalty": -0.5}, r"^env\.invalid_action_penalty=-0\.5 .*>= 0"),
        ({"hgpo": [1]}, None, r"algorithm\.hgpo .*dict or DictConfig.*list"),
    ],
)
def test_successor_sections_are_checked_naming_the_key(algorithm, env, match):
    with pytest.raises(ValueError, match=match):
        GiGPOConfig.from_algorithm(algorithm, env=env)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match=r"method='ppo'.*\['gigpo', 'hgpo'"):
        GiGPOConfig(method="ppo")


@pytest.mark.parametrize("method", ["gigpo", "hgpo", "graphgpo", "g2po"])
def test_advantage_terms_dispatch_to_the_method(method):
    from verl_gigpo.advantage import ESTIMATOR_TERMS

    # one group, two trajectories over states a, b; t0 wins
    args = (
        torch.tensor([0.0, 1.0, 0.0, 0.0]),
        torch.ones(4, 2),
        np.zeros(4, dtype=int),
        np.array([0, 0, 1, 1]),
        np.array([0, 1, 0, 1]),
        np.array(["a", "b", "a", "b"], dtype=object),
    )
    outcome = {"won": np.array([True, True, False, False]), "action_valid": np.array([True, False, True, True])}
    root = OmegaConf.create(
        {"env": {"history_length": 1, "invalid_action_penalty": 0.2}, "algorithm": {"adv_estimator": method}}
    )
    cfg = GiGPOConfig.from_algorithm(root.algorithm, env=root.env)
    terms = cfg.advantage_terms(*args, **outcome)
    own = {"gigpo": {"step_advantage_w": 1.0}, "hgpo": {"history_length": 1}, "g2po": {"invalid_penalty": 0.2}}
    extra = outcome if method in ("graphgpo", "g2po") else {}
    want = ESTIMATOR_TERMS[method](*args, **extra, **own.get(method, {}))
    assert terms.method == method
    np.testing.assert_array_equal(terms.advantage, want.advantage)
