"""The gridnav demo environment (CPU-only): contract checker over variants, golden observations, oracle
playthroughs, the episode-group property and argument validation."""

from __future__ import annotations

import pytest

from environments import make_env
from environments.base import UNMATCHED_ACTION_TEXT
from environments.checker import check_env
from environments.gridnav import GridTask, shortest_path

VARIANTS = [
    {},
    {"key_mode": "observation"},
    {"key_mode": "history:2", "max_steps": 6},
    {"size": 7, "walls": 8, "min_path": 6, "max_steps": 24},
    {"key": True, "size": 6, "min_path": 6, "max_steps": 20},
    {"key": True, "observe": "target", "show_blocked": False},
]


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_gridnav_passes_the_contract_checker(kwargs):
    counts = check_env(make_env("gridnav", **kwargs), seeds=(0, 1, 2, 3))
    assert counts["transitions"] > 0 and counts["path_pairs"] >= 4


def test_golden_observations_on_a_hand_built_layout():
    env = make_env("gridnav")
    env.reset(seed=0)
    # replace the drawn layout by a known one: agent at (0, 0), a wall at (0, 2), the goal at (2, 2)
    env.task = GridTask(size=5, walls=frozenset({(0, 2)}), start=(0, 0), goal=(2, 2))
    env.agent = (0, 0)
    assert env.anchor_key("observation") == "walls: north, west. goal: down 2, right 2."
    obs, reward, terminated, _, info = env.step("right")
    assert obs == "walls: north, east. goal: down 2, right 1." and reward == 0.0 and not terminated
    obs, *_ = env.step("right")  # a wall: valid no-op
    assert obs == "walls: north, east. goal: down 2, right 1." and env.agent == (0, 1)
    env.step("down")
    obs, reward, terminated, _, info = env.step("down")
    assert env.agent == (2, 1) and obs == "walls: none. goal: right 1."
    obs, reward, terminated, _, info = env.step("right")
    assert reward == 1.0 and terminated and info["won"]

    key_env = make_env("gridnav", key=True)
    key_env.reset(seed=0)
    key_env.task = GridTask(size=3, walls=frozenset(), start=(1, 1), goal=(0, 1), key=(2, 2))
    key_env.agent = (1, 1)
    # the goal is a locked door: "up" is blocked until the key is held
    assert key_env.anchor_key("observation") == "walls: north. key: down 1, right 1. goal: up 1."
    obs, reward, terminated, *_ = key_env.step("up")
    assert key_env.agent == (1, 1) and not terminated and reward == 0.0
    key_env.step("right")
    obs, _, _, _, info = key_env.step("down")
    assert info["picked_key"] and obs == "walls: south, east. key: held. goal: up 2, left 1."
    assert key_env.anchor_key().endswith("|agent=2,2|key=held")
    key_env.observe = "target"
    assert key_env.anchor_key("observation") == "walls: south, east. goal: up 2, left 1."


def test_prompt_is_history_and_observation_only():
    env = make_env("gridnav", show_blocked=False)
    obs, info = env.reset(seed=0)
    assert env.render_prompt(obs, info) == obs == "goal: right 3."
    past = [("goal: right 4.", "right")]
    expected = "Recent history:\ngoal: right 4. -> right\ngoal: right 3."
    assert env.render_prompt(obs, {**info, "step": 1}, past) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"size": 7, "walls": (6, 10), "min_path": 7, "max_steps": 30},
        {"key": True, "size": 6, "min_path": 6, "max_steps": 20},
    ],
)
def test_oracle_playthrough_reaches_the_goal(kwargs):
    env = make_env("gridnav", **kwargs)
    lengths = []
    for seed in range(40):
        obs, info = env.reset(seed=seed, options={"split": "test" if seed % 2 else "train"})
        steps = 0
        while True:
            action, valid = env.parse_action(f"<think>go</think><action>{env.oracle_action()}</action>")
            assert valid
            obs, reward, terminated, truncated, info = env.step(action)
            steps += 1
            if terminated or truncated:
                break
        assert info["won"] and terminated and reward >= 1.0, (seed, env.render_grid())
        assert steps >= env.min_path
        lengths.append(steps)
    assert max(lengths) <= env.max_steps


def test_group_property_same_seed_same_task():
    a, b = make_env("gridnav", key=True), make_env("gridnav", key=True)
    obs_a, info_a = a.reset(seed=17, options={"split": "train"})
    b.reset(seed=3)
    obs_b, info_b = b.reset(seed=17, options={"split": "train"})
    assert (obs_a, info_a["anchor_key"], info_a["task_id"]) == (obs_b, info_b["anchor_key"], info_b["task_id"])
    assert a.render_grid() == b.render_grid()
    # the same state reached along different paths has the same anchor key; train and test splits differ
    _, test_info = b.reset(seed=17, options={"split": "test"})
    assert test_info["task_id"] != info_a["task_id"]
    layouts = {make_env("gridnav").reset(seed=s)[1]["task_id"] for s in range(50)}
    assert len(layouts) >= 45


def test_actions_parse_bare_and_tagged():
    env = make_env("gridnav")
    env.reset(seed=0)
    assert env.parse_action("up") == ("up", True)
    assert env.parse_action(" Left.\n") == ("left", True)
    assert env.parse_action("<think>hmm</think><action>DOWN</action>") == ("down", True)
    assert env.parse_action("go up") == (None, False)
    assert env.parse_action("<action>up</action><action>down</action>") == (None, False)


def test_format_rule_sends_unknown_words_which_change_nothing():
    """Under the format rule (the default one: an action block and think tags), a well-formed reply naming no move
    is valid, costs a step and changes nothing; a reply without the format is invalid."""
    env = make_env("gridnav", max_steps=5)
    obs0, info0 = env.reset(seed=0)
    assert env.parse_action("<think>hm</think><action>jump</action>", rule="format") == ("jump", True)
    assert env.parse_action("<think>hm</think><action>jump</action>") == (None, False)  # admissible rule
    assert env.parse_action("<think>hm</think><action> Up </action>", rule="format") == ("Up", True)
    assert env.parse_action("up", rule="format") == (None, False)  # no action block, no tail sent
    obs, reward, terminated, _, info = env.step("jump")
    assert obs.startswith(UNMATCHED_ACTION_TEXT) and obs.endswith(obs0) and reward == 0.0 and not terminated
    assert info["step"] == 1 and info["action_valid"] is False and info["anchor_key"] == info0["anchor_key"]
    assert env.anchor_key("observation") == obs0
    _, _, _, _, info = env.step("Up")
    assert info["action_valid"] is True


def test_shortest_path_and_bad_arguments():
    task = GridTask(size=3, walls=frozenset({(1, 0), (1, 1)}), start=(0, 0), goal=(2, 0))
    assert shortest_path(task, task.start, task.goal, has_key=False) == [
        "right",
        "right",
        "down",
        "down",
        "left",
        "left",
    ]
    assert (
        shortest_path(GridTask(3, frozenset({(1, 0), (1, 1), (1, 2)}), (0, 0), (2, 0)), (0, 0), (2, 0), False) is None
    )
    with pytest.raises(ValueError, match="size"):
        make_env("gridnav", size=2)
    with pytest.raises(ValueError, match="walls"):
        make_env("gridnav", walls=(5, 2))
    with pytest.raises(ValueError, match="observe"):
        make_env("gridnav", observe="grid")
    with pytest.raises(ValueError, match="min_path"):
        make_env("gridnav", size=3, walls=0, min_path=9).reset(seed=0)
    with pytest.raises(ValueError, match="reset options"):
        make_env("gridnav").reset(seed=0, options={"level": 3})
