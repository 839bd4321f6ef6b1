"""Sokoban environment, generator and solver (CPU only, a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from environments import make_env
from environments.base import INVALID_ACTION_TEXT
from environments.checker import check_env
from environments.sokoban import (
    ACTIONS,
    SokobanEnv,
    SolverLimitError,
    apply_move,
    check_room_config,
    generate_room,
    parse_room,
    render_room,
    solve,
)

# Rendered start rooms of the default env (6x6, one box), train split. A change in the generator or the rendering
# shows up here; update deliberately.
GOLDEN = {
    0: "# # # # # #\n# # # # # #\n# _ # # # #\n# P _ _ _ #\n# _ X _ O #\n# # # # # #",
    1: "# # # # # #\n# _ _ _ _ #\n# P O X _ #\n# _ # # _ #\n# # # # # #\n# # # # # #",
    2: "# # # # # #\n# # # # # #\n# # # # # #\n# _ _ _ _ #\n# S _ X _ #\n# # # # # #",
}

CORRIDOR = """
# # # # # # #
# P _ X _ O #
# # # # # # #
"""


def play(env: SokobanEnv, seed: int, actions: list[str | None], split: str = "train") -> list:
    """Reset with ``seed`` and play ``actions``; the full transcript (observations, rewards, flags, infos)."""
    obs, info = env.reset(seed=seed, options={"split": split})
    transcript = [obs, info]
    for action in actions:
        out = env.step(action)
        transcript.append(out)
        if out[2] or out[3]:
            break
    return transcript


# ---------------------------------------------------------------- contract


@pytest.mark.parametrize("key_mode", ["state", "observation", "history:2"])
def test_check_env_cpu_key_modes(key_mode):
    counts = check_env(SokobanEnv(key_mode=key_mode), seeds=(0, 1, 2, 3))
    # beyond the default pair, each seed contributes real pairs of different paths
    assert counts["path_pairs"] >= 4 * 4
    assert counts["transitions"] > 0


def test_check_env_cpu_7x7_two_boxes():
    env = make_env("sokoban", dim_room=[7, 7], num_boxes=2, max_steps=30)
    assert env.task_type == "sokoban-7x7-2box"
    counts = check_env(env, seeds=(0, 1, 2))
    assert counts["path_pairs"] >= 3 * 4
    obs, _ = env.reset(seed=5)
    assert obs.count("X") + obs.count("*") == 2 and obs.count("O") + obs.count("*") + obs.count("S") == 2


def test_checker_paths_are_different_and_reach_the_same_state():
    env = SokobanEnv()
    for seed in range(10):
        env.reset(seed=seed)
        pairs = env.checker_paths()
        real = [(a, b) for a, b in pairs if None not in a + b]
        assert len(real) >= 3, pairs
        for a, b in real:
            assert a != b
            ends = []
            for path in (a, b):
                env.reset(seed=seed)
                for action in path:
                    env.step(action)
                ends.append(env.anchor_key("state"))
            assert ends[0] == ends[1], (seed, a, b)
        # at least one pair moves the player (or a box) away from the start state
        env.reset(seed=seed)
        start = env.room
        moved = False
        for a, _ in real:
            room = start
            for action in a:
                room = apply_move(room, action)[0]
            moved |= room != start
        assert moved


# ---------------------------------------------------------------- golden rendering


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_golden_observation(seed):
    env = SokobanEnv()
    obs, info = env.reset(seed=seed)
    assert obs == GOLDEN[seed]
    assert info["anchor_key"] == GOLDEN[seed]  # state key = the grid
    assert info["task_id"] == f"train/seed-{seed}" and info["task_type"] == "sokoban-6x6-1box"
    assert info["admissible_actions"] == ["up", "down", "left", "right"]
    assert "Push every box onto a target" in info["task"] and "* box on a target" in info["task"]
    assert parse_room(obs) == env.room and render_room(parse_room(obs)) == obs


# ---------------------------------------------------------------- oracle playthrough


def test_oracle_plan_wins_for_many_seeds_with_documented_reward():
    env = SokobanEnv()
    lengths = []
    for split in ("train", "test"):
        for seed in range(25):
            env.reset(seed=seed, options={"split": split})
            start = env.room
            assert not (start.boxes & start.targets), "a box starts on a target"
            plan = solve(start)
            assert plan, f"{split} seed {seed}: unsolvable room\n{render_room(start)}"
            assert len(plan) <= env.num_gen_steps <= env.max_steps
            lengths.append(len(plan))
            total = 0.0
            for i, action in enumerate(plan):
                obs, reward, terminated, truncated, info = env.step(action)
                total += reward
                assert terminated == (i == len(plan) - 1) and not truncated
            assert info["won"] and terminated and "puzzle solved" in obs
            # -0.1 per move, the single box ends on its target (+1 net), +10 for solving
            assert total == pytest.approx(-0.1 * len(plan) + 1.0 + 10.0)
    # the generator does not only make one-push rooms
    assert np.median(lengths) >= 4 and max(lengths) >= 8


def test_reward_per_step_matches_scheme_with_custom_values():
    env = SokobanEnv(
        dim_room=(7, 7),
        num_boxes=2,
        max_steps=40,
        reward_step=-0.5,
        reward_box_on_target=2.0,
        reward_box_off_target=-3.0,
        reward_solved=7.0,
    )

    def expected(before, action):
        after, _ = apply_move(before, action)
        delta = after.boxes_on_targets - before.boxes_on_targets  # a push moves one box: delta in {-1, 0, 1}
        return -0.5 + (2.0 if delta > 0 else -3.0 if delta < 0 else 0.0) + (7.0 if after.solved else 0.0)

    seen = {"on": 0, "off": 0, "won": 0}
    for seed in range(12):
        env.reset(seed=seed)
        # a random detour (blocked moves, stray pushes), then the solver's plan from wherever that leads
        detour = [ACTIONS[i] for i in np.random.default_rng(seed).integers(0, 4, size=8)]
        terminated = False
        for action in detour:
            before = env.room
            _, reward, terminated, _, _ = env.step(action)
            assert reward == pytest.approx(expected(before, action))
            seen["on"] += env.room.boxes_on_targets > before.boxes_on_targets
            seen["off"] += env.room.boxes_on_targets < before.boxes_on_targets
            if terminated:
                break
        plan = [] if terminated else solve(env.room)
        for action in plan or []:  # None: the detour made the room unsolvable (a box in a dead corner)
            before = env.room
            _, reward, terminated, _, info = env.step(action)
            assert reward == pytest.approx(expected(before, action))
            seen["on"] += env.room.boxes_on_targets > before.boxes_on_targets
        seen["won"] += terminated
    assert seen["on"] > 0 and seen["won"] >= 6


def test_generator_plan_is_shortest_and_agrees_with_the_forward_solver():
    for dim, boxes, depth in [((6, 6), 1, 10), ((7, 7), 2, 12), ((5, 7), 1, 8)]:
        for seed in range(15):
            gen = generate_room(np.random.default_rng(seed), dim, boxes, num_gen_steps=depth)
            room = gen.room
            assert (room.height, room.width) == dim and len(room.boxes) == len(room.targets) == boxes
            assert not (room.boxes & room.targets) and room.player not in room.boxes
            # two independent algorithms (backward BFS in the generator, forward BFS in the solver) agree
            plan = solve(room)
            assert plan is not None and len(plan) == len(gen.plan) <= depth
            for action in gen.plan:
                room = apply_move(room, action)[0]
            assert room.solved
            border = {
                (r, c) for r in range(dim[0]) for c in range(dim[1]) if r in (0, dim[0] - 1) or c in (0, dim[1] - 1)
            }
            assert not (gen.room.floor & border)


def test_generator_is_deterministic_and_uses_only_the_given_rng():
    a = generate_room(np.random.default_rng(42))
    np.random.seed(0)  # the legacy global state must not matter
    b = generate_room(np.random.default_rng(42))
    np.random.seed(1)
    c = generate_room(np.random.default_rng(42))
    assert a == b == c
    assert generate_room(np.random.default_rng(43)).room != a.room


# ---------------------------------------------------------------- solver


def test_solver_on_hand_built_rooms():
    corridor = parse_room(CORRIDOR)
    assert solve(corridor) == ["right", "right", "right"]
    around = parse_room(
        """
        # # # # # #
        # _ _ _ _ #
        # P O X _ #
        # # # # # #
        """
    )
    assert solve(around) == ["up", "right", "right", "right", "down", "left"]
    solved = parse_room("# # # # #\n# P * _ #\n# # # # #")
    assert solved.solved and solve(solved) == []
    # box in a non-target corner: provably unsolvable
    stuck = parse_room("# # # # # #\n# X _ _ O #\n# _ P _ _ #\n# # # # # #")
    assert solve(stuck) is None
    # two boxes in a row cannot be pushed as one
    blocked = parse_room("# # # # # # #\n# P X X O O #\n# # # # # # #")
    assert solve(blocked) is None
    with pytest.raises(SolverLimitError, match="max_states"):
        solve(around, max_states=3)


def test_move_rule_and_feedback_on_a_given_layout():
    env = SokobanEnv()
    obs, info = env.reset(options={"room": CORRIDOR})
    assert obs == render_room(parse_room(CORRIDOR)) and info["task_id"].startswith("train/room-")
    obs, reward, terminated, truncated, info = env.step("up")  # into the wall: valid, nothing changes
    assert obs.startswith("You cannot move up: a wall is in the way.") and reward == pytest.approx(-0.1)
    assert info["action_valid"] and info["anchor_key"] == render_room(parse_room(CORRIDOR))
    obs, reward, *_ = env.step("right")
    assert obs.splitlines()[0] == "You moved right." and reward == pytest.approx(-0.1)
    obs, reward, terminated, *_ = env.step("right")
    assert obs.splitlines()[0] == "You pushed a box right." and not terminated
    obs, reward, terminated, truncated, info = env.step("right")
    assert obs.splitlines()[0] == "You pushed a box right onto a target. Every box is on a target: puzzle solved!"
    assert obs.splitlines()[2] == "# _ _ _ P * #"
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0) and terminated and info["won"] and not truncated
    # pushing a box off a target, and into another box
    env.reset(options={"room": "# # # # # # #\n# P * _ X O #\n# # # # # # #"})
    obs, reward, *_ = env.step("right")
    assert obs.splitlines()[0] == "You pushed a box right off its target." and reward == pytest.approx(-1.1)
    obs, reward, *_ = env.step("right")
    assert obs.splitlines()[0].startswith("You cannot push the box right") and reward == pytest.approx(-0.1)


# ---------------------------------------------------------------- anchor keys


def test_anchor_keys_equal_for_equal_states_and_differ_otherwise():
    # a square of floor: up,left and left,up reach the same cell
    layout = "# # # # # # #\n# _ _ _ _ O #\n# _ _ P X _ #\n# # # # # # #"
    keys = {}
    for mode in ("state", "observation", "history:2"):
        env = SokobanEnv(key_mode=mode)
        per_path = []
        for path in (["up", "left"], ["left", "up"], ["up", "down", "up", "left"], ["left"]):
            env.reset(options={"room": layout})
            for action in path:
                _, _, _, _, info = env.step(action)
            per_path.append(info["anchor_key"])
        keys[mode] = per_path
    for mode in ("state", "observation"):
        a, b, c, d = keys[mode]
        assert a == b == c and a != d
    a, b, c, d = keys["history:2"]
    assert a != b and b != d  # same grid, different last two actions
    assert a == c  # same grid and same last two actions ("up", "left")
    assert a.startswith(keys["state"][0])
    # the feedback line is not part of the observation key
    env = SokobanEnv(key_mode="observation")
    env.reset(options={"room": layout})
    obs, *_, info = env.step("down")  # blocked: feedback, state unchanged
    assert obs != info["anchor_key"] and info["anchor_key"] == render_room(parse_room(layout))


# ---------------------------------------------------------------- groups and splits


def test_same_seed_same_actions_give_identical_transcripts():
    actions = ["up", "left", None, "down", "right", "right", "up", "left", "down", "down"]
    one, two = SokobanEnv(), SokobanEnv()
    two.reset(seed=99)  # another episode first must not matter
    for seed in range(5):
        assert play(one, seed, actions) == play(two, seed, actions)


def test_seeds_and_splits_give_different_rooms():
    env = SokobanEnv()
    train = [env.reset(seed=s)[0] for s in range(30)]
    test = [env.reset(seed=s, options={"split": "test"})[0] for s in range(30)]
    assert len(set(train)) >= 27 and len(set(test)) >= 27
    assert sum(a != b for a, b in zip(train, test, strict=True)) >= 28
    assert env.reset(seed=3, options={"split": "test"})[1]["task_id"] == "test/seed-3"
    # seed=None continues the stream: a new room each time, marked as not reproducible by id
    env.reset(seed=3)
    obs_a, info_a = env.reset()
    obs_b, info_b = env.reset()
    assert info_a["task_id"].startswith("train/unseeded-") and info_a["task_id"] != info_b["task_id"]


# ---------------------------------------------------------------- actions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>box is left</think><action>left</action>", "left"),
        ("<action> Up </action>", "up"),
        ("<ACTION>DOWN</ACTION>", "down"),
        ("<action>move right</action>", "right"),
        ("<action>Go  up.</action>", "up"),
        ("<action>push left</action>", "left"),
        ('<action>"down"</action>', "down"),
        ("<action>'up.'</action>", "up"),
        ("right", "right"),
        ("  Left.  ", "left"),
        ("<think>I should go up</think>\nup", "up"),
        ("<action>up</action><action>down</action>", None),  # several tags: ambiguous
        ("<action>up", None),  # unclosed tag
        ("<action>up down</action>", None),
        ("<action>north</action>", None),
        ("<action>upward</action>", None),
        ("<action>move</action>", None),
        ("I will move up", None),
        ("<think>up</think>", None),
        ("", None),
        ("💥" * 50, None),
    ],
)
def test_parse_action(text, expected):
    env = SokobanEnv()
    env.reset(seed=0)
    assert env.parse_action(text) == ((expected, True) if expected else (None, False))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think><action>Up</action>", ("up", True)),
        ("<think>x</think><ACTION>push the box left</ACTION>", ("left", True)),  # a word found anywhere in the block
        ("<think>x</think><action>upward</action>", ("up", True)),
        ("<think>x</think><action>still</action>", ("still", True)),  # the reference's no-op
        ("<think>x</think><action>north</action>", ("still", False)),  # no move named: invalid, a no-op is sent
        ("<action>down</action>", ("down", False)),  # no think tags: invalid, the move is still sent
        ("<Think>x</Think><action>down</action>", ("down", False)),  # the think tags are matched exactly
        ("up", ("still", False)),  # no action block
        ("<think>x</think></action>up<action>", ("still", False)),  # closing tag first: empty block
    ],
)
def test_format_rule_is_the_reference_sokoban_projection(text, expected):
    env = SokobanEnv()
    env.reset(seed=0)
    assert env.parse_action(text, rule="format") == expected


def test_reply_parsing_options_change_nothing_in_sokoban():
    """env.parse: the reference lower-cases the reply (sokoban_projection); this rule reads the lower-cased action
    block already, and judges the think tags on the reply as written in both."""
    from environments.base import ParseStyle

    replies = ["<think>x</think><action>Push The Box UP</action>", "<THINK>x</THINK><action>Left</action>", "DOWN"]
    ours, reference = SokobanEnv(), SokobanEnv()
    reference.parse_style = ParseStyle(lowercase=True, collapse_whitespace=False)
    for env in (ours, reference):
        env.reset(seed=0)
    for reply in replies:
        for rule in ("format", "admissible"):
            assert reference.parse_action(reply, rule=rule) == ours.parse_action(reply, rule=rule), (reply, rule)
    assert reference.parse_action(replies[1], rule="format") == ("left", False)


def test_a_command_that_is_no_move_costs_a_step_and_changes_nothing():
    env = SokobanEnv(max_steps=2)
    obs0, info0 = env.reset(seed=1)
    room = env.room
    obs, reward, terminated, truncated, info = env.step("still")
    assert obs == f"You stay where you are. Nothing changed.\n{obs0}"
    assert reward == env.reward_step == -0.1 and not terminated and not truncated  # charged like a blocked move
    assert env.room == room and info["anchor_key"] == info0["anchor_key"] and info["action_valid"] is False
    *_, truncated, info = env.step("jump")
    assert truncated and info["step"] == 2


def test_invalid_action_step():
    env = SokobanEnv(max_steps=3)
    obs0, info0 = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(None)
    assert obs == f"{INVALID_ACTION_TEXT}\n{obs0}"
    assert reward == 0.0 and not terminated and not truncated
    assert info["action_valid"] is False and info["step"] == 1 and info["anchor_key"] == info0["anchor_key"]
    env.step("up")
    *_, truncated, info = env.step(None)
    assert truncated and info["step"] == 3
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.step("up")


def test_prompt_has_every_part():
    env = SokobanEnv()
    obs0, info0 = env.reset(seed=0)
    obs1, _, _, _, info1 = env.step("right")
    prompt = env.render_prompt(obs1, info1, history=[(obs0, "right")])
    assert info1["task"] in prompt and obs1 in prompt and obs0 in prompt
    assert "Admissible actions: up, down, left, right" in prompt
    assert "(1 of 20 moves used)" in prompt and "Your action: right" in prompt
    assert "<think>" in prompt and "<action>" in prompt
    assert "Recent history" not in env.render_prompt(obs0, info0)


# ---------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim_room": (2, 6)}, "too small"),
        ({"dim_room": (4, 4)}, "too small"),
        ({"dim_room": "6x6"}, "two ints"),
        ({"dim_room": (6,)}, "two ints"),
        ({"dim_room": (6.0, 6)}, "two ints"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"num_boxes": True}, "num_boxes"),
        ({"num_boxes": 15}, "too few for num_boxes=15"),
        ({"num_boxes": 7}, "could not generate"),  # fits statically, but no layout lets 7 boxes leave the targets
        ({"num_gen_steps": 0}, "num_gen_steps"),
        ({"reward_step": float("nan")}, "reward_step"),
        ({"reward_solved": "10"}, "reward_solved"),
        ({"key_mode": "grid"}, "key_mode"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_gen_states": 0}, "max_gen_states"),
    ],
)
def test_bad_config_raises_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SokobanEnv(**kwargs)


def test_bad_reset_options_and_layouts():
    env = SokobanEnv()
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(seed=0, options={"level": 3})
    with pytest.raises(ValueError, match="unknown split"):
        env.reset(seed=0, options={"split": "valid"})
    with pytest.raises(ValueError, match="exactly one player"):
        env.reset(options={"room": "# # # # #\n# _ X O #\n# # # # #"})
    with pytest.raises(ValueError, match="as many boxes as targets"):
        env.reset(options={"room": "# # # # #\n# P X _ #\n# # # # #"})
    with pytest.raises(ValueError, match="border"):
        env.reset(options={"room": "# # # # #\nP _ X O #\n# # # # #"})
    with pytest.raises(ValueError, match="already solved"):
        env.reset(options={"room": "# # # # #\n# P * _ #\n# # # # #"})
    with pytest.raises(ValueError, match="unknown symbol"):
        parse_room("# # # #\n# P ? #\n# # # #")
    with pytest.raises(RuntimeError, match="reset"):
        SokobanEnv().step("up")
    assert check_room_config([7, 9], 2) == (7, 9)
