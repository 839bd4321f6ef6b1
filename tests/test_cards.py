"""The card games (CPU only, seconds): their rules on hand-dealt states, deterministic drawing, pixel keys grouping
as state keys on played episodes, and the contract checker in every observation mode."""

from __future__ import annotations

import numpy as np
import pytest

from environments import make_env
from environments.cards import evaluate_formula, hand_total
from environments.checker import check_env
from environments.images import IMAGE_INFO_KEY, anchor_groups

GAMES = ("ezpoints", "numberline", "blackjack")


@pytest.mark.parametrize("name", GAMES)
@pytest.mark.parametrize("mode", ["text", "image", "both"])
def test_every_card_game_passes_the_checker(name, mode):
    env = make_env(name, observation=mode, image_size=128)
    counts = check_env(env, seeds=(0, 1, 2), n_steps=6)
    assert counts["transitions"] > 0
    _, info = env.reset(seed=0)
    assert (IMAGE_INFO_KEY in info) == (mode != "text")


def test_formula_values_follow_python_arithmetic():
    assert evaluate_formula("3*4") == 12 and evaluate_formula("10+2") == 12 and evaluate_formula("2+2*5") == 12
    assert evaluate_formula("34") == 34 and evaluate_formula("+3*4") == 12 and evaluate_formula("2**3") == 8
    for bad in ("", "3*", "*3", "3+*4", "3***4", "3-4"):
        assert evaluate_formula(bad) is None, bad


def _ezpoints_with(cards):
    env = make_env("ezpoints")
    env.reset(seed=0)
    env.cards = cards  # a hand-dealt state: (rank, suit)
    return env


def test_ezpoints_won_lost_and_no_op_moves():
    env = _ezpoints_with([(3, "H"), (4, "S")])
    for symbol in ("3", "*"):
        assert env.step(symbol)[1:3] == (0.0, False)
    before = env.anchor_key()
    _, reward, terminated, _, info = env.step("3")  # the 3 is used: nothing changes, a valid no-op
    assert (reward, terminated, info["action_valid"], env.anchor_key()) == (0.0, False, True, before)
    env.step("4")
    _, reward, terminated, _, info = env.step("=")
    assert (reward, terminated, info["won"]) == (10.0, True, True)

    env = _ezpoints_with([(3, "H"), (13, "S")])  # K counts 10: 3 + 10 = 13 is not 12
    for symbol in ("3", "+", "10", "="):
        _, reward, terminated, _, info = env.step(symbol)
    assert (reward, terminated, info["won"]) == (0.0, True, False)

    env = _ezpoints_with([(6, "D"), (6, "C")])
    for symbol in ("6", "="):
        _, reward, terminated, _, info = env.step(symbol)
    assert (reward, info["won"]) == (0.0, False)  # a formula that leaves a card unused scores 0


def test_ezpoints_formula_stops_growing_at_six_symbols_and_bad_replies_are_invalid():
    env = _ezpoints_with([(2, "H"), (10, "S")])
    for symbol in ("+", "+", "+", "+", "+", "+"):
        env.step(symbol)
    full = env.anchor_key()
    _, reward, terminated, truncated, _ = env.step("=")  # the formula is full: even '=' changes nothing
    assert (reward, terminated, truncated, env.anchor_key()) == (0.0, False, False, full)
    assert env.step("3")[2:4] == (False, True)  # the 8th move: the step limit (the reference's recipe)
    assert env.parse_action("<think>x</think><action>11</action>") == (None, False)
    assert env.parse_action("<think>x</think><action>*</action>") == ("*", True)


def test_ezpoints_deal_always_has_a_formula_of_twelve():
    env = make_env("ezpoints")
    for seed in range(200):
        env.reset(seed=seed)
        a, b = env.values
        assert a + b == 12 or a * b == 12, (seed, env.cards)


def test_numberline_rewards_and_end():
    env = make_env("numberline")
    env.reset(seed=0)
    env.position, env.target = 2, 4
    assert env.step("+")[1:3] == (0.0, False)
    assert env.step("-")[1:3] == (-1.0, False)  # farther away
    env.position = 3
    _, reward, terminated, _, info = env.step("+")
    assert (reward, terminated, info["won"]) == (1.0, True, True)
    env.reset(seed=1)
    env.position, env.target = 0, 3
    assert env.step("-")[1] == -1.0 and env.position == 0  # the line ends at 0
    assert env.parse_action("<action>left</action>") == (None, False)
    assert make_env("numberline").max_steps == 10  # 2 * max_position, the reference's limit


def test_blackjack_win_loss_and_bust():
    assert hand_total([(1, "H"), (13, "S")]) == 21 and hand_total([(1, "H"), (1, "S"), (9, "C")]) == 21
    assert hand_total([(1, "H"), (9, "S"), (5, "C")]) == 15
    env = make_env("blackjack")
    env.reset(seed=0)
    env.player, env.dealer = [(10, "H"), (13, "S")], [(10, "C"), (7, "D")]  # 20 against 17: the dealer stands
    _, reward, terminated, _, info = env.step("stand")
    assert (reward, terminated, info["won"]) == (1.0, True, True)
    env.reset(seed=0)
    env.player, env.dealer = [(10, "H"), (6, "S")], [(10, "C"), (9, "D")]  # 16 against 19
    assert env.step("stand")[1:3] == (0.0, True)  # a loss scores 0, as in the reference
    env.reset(seed=0)
    env.player = [(10, "H"), (13, "S"), (1, "C")]  # 21 with the ace as 1: any card busts
    _, reward, terminated, _, info = env.step("hit")
    assert (reward, info["won"]) == (0.0, False) and hand_total(env.player) > 21
    assert env.parse_action("<action>double</action>") == (None, False)


@pytest.mark.parametrize("name", GAMES)
def test_drawing_is_a_pure_function_of_the_state(name):
    one, two = make_env(name, observation="image"), make_env(name, observation="image")
    rng = np.random.default_rng(0)
    for seed in (3, 4):
        _, info_1 = one.reset(seed=seed)
        _, info_2 = two.reset(seed=seed)
        while True:
            image_1, image_2 = info_1[IMAGE_INFO_KEY][0], info_2[IMAGE_INFO_KEY][0]
            assert image_1.size == (300, 300) and image_1.tobytes() == image_2.tobytes()
            action = str(rng.choice(one.example_actions()))
            _, _, terminated, truncated, info_1 = one.step(action)
            _, _, _, _, info_2 = two.step(action)
            if terminated or truncated:
                break


@pytest.mark.parametrize("name", GAMES)
def test_pixel_keys_give_the_same_groups_as_state_keys(name):
    """Played episodes of one task per group: grouping steps by the pixels' hash equals grouping by the state."""
    env = make_env(name, observation="image", image_size=128)
    by_state, by_pixels = anchor_groups(env, range(6), 6, env.example_actions(), np.random.default_rng(1))
    assert by_state == by_pixels
    assert any(len(g) > 1 for g in by_state) and len(by_state) > 6  # real grouping, neither all-one nor singletons


def test_bad_settings_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match=r"ezpoints: observation must be one of"):
        make_env("ezpoints", observation="pixels")
    with pytest.raises(ValueError, match=r"blackjack: image_size must be an int in \[96, 512\].*1000"):
        make_env("blackjack", image_size=1000)
    with pytest.raises(ValueError, match=r"numberline: key_mode='observation'.*use key_mode='state'"):
        make_env("numberline", observation="image", key_mode="observation")
    with pytest.raises(ValueError, match=r"numberline: max_position"):
        make_env("numberline", max_position=1)


@pytest.fixture(scope="module")
def vl_server(tiny_vl_model_dir):
    """The ``hf`` rollout backend's server on the tiny vision model, and its processor."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.tokenizer import hf_processor

    from verl_gigpo.verl_glue.cpu.hf_rollout import HFGenerationServer

    rollout = omega_conf_to_dataclass(
        OmegaConf.create({"_target_": "verl.workers.config.RolloutConfig", "name": "hf", "response_length": 4})
    )
    server = HFGenerationServer(rollout, str(tiny_vl_model_dir), 0, trust_remote_code=True)
    return server, hf_processor(str(tiny_vl_model_dir), trust_remote_code=True)


@pytest.mark.parametrize("name", GAMES)
def test_a_card_game_plays_from_images_through_the_episode_runner(name, vl_server):
    """The tiny vision model plays each game from its drawing (DEVICE=cpu's 112-pixel tables): every step's prompt
    holds its image's tokens, as the verl agent loop builds it."""
    import asyncio

    from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, TaskSpec, run_episode
    from verl_gigpo.rollout.execution.threads import EnvThreadPool

    server, processor = vl_server
    config = EpisodeConfig(max_steps=3, history_length=0, max_prompt_length=1024, max_response_length=4)
    task = TaskSpec(name, seed=1, env_kwargs={"observation": "image", "image_size": 112})
    episode = asyncio.run(
        run_episode(
            task,
            generator=server,
            encoder=ChatPromptEncoder(processor.tokenizer, processor=processor),
            tokenizer=processor.tokenizer,
            config=config,
            traj_id="t",
            sampling_params={"temperature": 1.0, "top_k": -1, "seed": 1},
            executor=EnvThreadPool(0),
        )
    )
    assert episode.env_error is None and episode.length >= 1
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for step in episode.steps:
        assert len(step.images) == 1 and step.prompt_ids.count(pad) == 16  # 112x112: 4x4 merged patches
