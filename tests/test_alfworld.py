"""ALFWorld adapter and synthetic game generator, on the real alfworld/TextWorld engine (CPU only).

The games come from ``environments.alfworld.synth`` via the session fixture ``alfworld_data`` (conftest.py):
train = one game per task type, valid_seen = pick + clean, valid_unseen = look + heat. Sorted train list:
0 look, 1 pick, 2 clean, 3 cool, 4 heat, 5 pick2 (task folders sort by ALFRED task-type name).
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from environments import make_env
from environments.alfworld.data import TASK_KINDS, TASK_TYPES, list_games, training_order
from environments.alfworld.env import BOOKKEEPING_PREDICATES, AlfWorldEnv
from environments.alfworld.synth import generate, problem_to_pddl, sample_problem
from environments.alfworld.synth import main as synth_main
from environments.base import EnvError
from environments.checker import check_env


@pytest.fixture
def env(alfworld_data):
    e = AlfWorldEnv(data_path=alfworld_data, max_steps=10)
    yield e
    e.close()


# ---------------------------------------------------------------------------------------------- generator
def test_synth_layout_and_traj_data(alfworld_data):
    root = alfworld_data / "json_2.1.1"
    assert (alfworld_data / "logic" / "alfred.pddl").is_file() and (alfworld_data / "logic" / "alfred.twl2").is_file()
    counts = {
        split: sorted(g.kind for g in list_games(root, split)) for split in ("train", "valid_seen", "valid_unseen")
    }
    assert counts == {
        "train": sorted(TASK_KINDS),
        "valid_seen": ["clean", "pick"],
        "valid_unseen": ["heat", "look"],
    }
    for game in list_games(root, "train"):
        folder = (root / game.rel_path).parent
        traj = json.loads((folder / "traj_data.json").read_text())
        assert traj["task_type"] == TASK_TYPES[game.kind]
        assert set(traj["pddl_params"]) >= {"object_target", "parent_target", "toggle_target", "object_sliced"}
        assert traj["turk_annotations"]["anns"] and all(a["task_desc"] for a in traj["turk_annotations"]["anns"])
        data = json.loads((folder / "game.tw-pddl").read_text())
        assert data["solvable"] is True and data["walkthrough"]
        assert "(:goal" in (folder / "initial_state.pddl").read_text()
    manifest = json.loads((alfworld_data / "synth_manifest.json").read_text())
    assert manifest["seed"] == 0 and manifest["counts"]["valid_unseen"]["look"] == 1


def test_synth_is_deterministic_and_prefix_stable(alfworld_data, tmp_path):
    # game i of a (split, kind) does not depend on how many games are asked for: regenerate one and compare bytes
    summary = generate(tmp_path / "again", games_per_type={"valid_seen": {"clean": 1}}, seed=0)
    assert summary.n_games == 1 and summary.counts["valid_seen"]["clean"] == 1 and summary.seconds_per_game > 0
    (rel,) = summary.games
    for name in ("initial_state.pddl", "traj_data.json", "game.tw-pddl"):
        again = (tmp_path / "again" / rel).parent / name
        assert again.read_bytes() == ((alfworld_data / rel).parent / name).read_bytes(), name


def test_synth_seeds_and_unseen_scenes_differ():
    def pddl(seed, unseen=False):
        problem = sample_problem("heat", np.random.default_rng([seed, 0]), seed=seed, unseen=unseen)
        return problem, problem_to_pddl(problem, "t")

    (a, text_a), (_, text_b) = pddl(0), pddl(1)
    assert text_a == pddl(0)[1] and text_a != text_b
    assert a.pddl_params["object_target"] and a.pddl_params["parent_target"] not in ("", "Microwave")
    # sink basins are named as in ALFRED, which alfworld's demangler turns into "sinkbasin N"
    sinks = [rid for rid, cls in a.receptacles if cls == "SinkBasin"]
    assert sinks and all(re.fullmatch(r"Sink\|[-+.\d|]+\|SinkBasin", rid) for rid in sinks)
    seen = {
        sample_problem("pick", np.random.default_rng([0, i]), seed=0, unseen=False).scene_num % 100 for i in range(30)
    }
    unseen = {
        sample_problem("pick", np.random.default_rng([0, i]), seed=0, unseen=True).scene_num % 100 for i in range(30)
    }
    assert max(seen) <= 20 < min(unseen)


def test_synth_cli_prints_path_and_counts(tmp_path, capsys):
    out = tmp_path / "cli"
    assert (
        synth_main(["--out", str(out), "--games-per-type", "1", "--eval-games-per-type", "0", "--kinds", "pick"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(out)
    assert lines[1] == "train: 1 games (pick=1)" and lines[2] == "valid_seen: 0 games (pick=0)"
    assert re.fullmatch(r"1 games in [\d.]+ s \([\d.]+ s/game, 0 draws rejected by the expert\)", lines[4])
    assert [g.kind for g in list_games(out / "json_2.1.1", "train")] == ["pick"]
    with pytest.raises(SystemExit):
        synth_main(["--out", str(out)])  # already holds games: argparse error, exit status 2


def test_synth_rejects_bad_arguments(tmp_path, alfworld_data):
    with pytest.raises(ValueError, match="kinds"):
        generate(tmp_path / "a", kinds=["fly"])
    with pytest.raises(ValueError, match="non-negative"):
        generate(tmp_path / "b", games_per_type=-1)
    with pytest.raises(ValueError, match="unknown splits"):
        generate(tmp_path / "c", games_per_type={"test": 1})
    with pytest.raises(ValueError, match="movable"):
        generate(tmp_path / "movable_games")
    with pytest.raises(FileExistsError, match="already exists"):
        generate(alfworld_data)
    with pytest.raises(ValueError, match="unknown task kind"):
        sample_problem("fly", np.random.default_rng(0), seed=0, unseen=False)


# ---------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("key_mode", ["state", "observation"])
def test_check_env(alfworld_data, key_mode):
    env = AlfWorldEnv(data_path=alfworld_data, key_mode=key_mode, max_steps=6)
    try:
        counts = check_env(env, seeds=(1,), n_steps=5)
    finally:
        env.close()
    assert counts["transitions"] > 0 and counts["path_pairs"] == 5


def test_golden_observation(env):
    obs, info = env.reset(seed=0, options={"split": "train"})
    assert obs == (
        "-= Welcome to TextWorld, ALFRED! =-\n\n"
        "You are in the middle of a room. Looking quickly around you, you see a bed 1, a drawer 4, a drawer 3, "
        "a drawer 2, a drawer 1, a garbagecan 1, and a sidetable 1.\n\n"
        "Your task is to: examine the cellphone with the desklamp."
    )
    assert info["task"] == "examine the cellphone with the desklamp."
    assert info["task_type"] == "look"
    assert info["task_id"] == "train/look_at_obj_in_light-CellPhone-None-DeskLamp-306/trial_s0_look_00000/game.tw-pddl"
    assert info["admissible_actions"] == [
        "go to bed 1",
        "go to drawer 1",
        "go to drawer 2",
        "go to drawer 3",
        "go to drawer 4",
        "go to garbagecan 1",
        "go to sidetable 1",
        "inventory",
        "look",
    ]  # fmt: skip  (the engine's "help" is left out, as the reference's prompt leaves it out)
    assert env.step("go to drawer 4")[0] == "You arrive at drawer 4. The drawer 4 is closed."
    assert env.step("open drawer 4")[0] == "You open the drawer 4. The drawer 4 is open. In it, you see a cellphone 1."


def test_expert_plan_wins_every_task_type(alfworld_data):
    env = AlfWorldEnv(data_path=alfworld_data, expert_plan=True, max_steps=50)
    seen = set()
    try:
        for seed in range(len(TASK_KINDS)):
            obs, info = env.reset(seed=seed, options={"split": "train"})
            plan = env.expert_plan()
            assert plan and plan[0] in info["admissible_actions"]
            for i, action in enumerate(plan):
                assert env.parse_action(f"<think>plan</think><action>{action}</action>") == (action, True)
                obs, reward, terminated, truncated, info = env.step(action)
                last = i == len(plan) - 1
                assert terminated is last and info["won"] is last and not truncated
                assert reward == (10.0 if last else 0.0)
                assert isinstance(info["expert_plan"], list)
            seen.add(info["task_type"])
    finally:
        env.close()
    assert seen == set(TASK_KINDS)


def test_success_reward_is_configurable(alfworld_data):
    with pytest.raises(ValueError, match="success_reward"):
        AlfWorldEnv(data_path=alfworld_data, success_reward=float("nan"))
    env = AlfWorldEnv(data_path=alfworld_data, expert_plan=True, success_reward=2.5)
    try:
        env.reset(seed=1, options={"split": "train"})  # the pick game
        rewards = [env.step(a)[1] for a in env.expert_plan()]
    finally:
        env.close()
    assert rewards[-1] == 2.5 and sum(rewards) == 2.5


# ---------------------------------------------------------------------------------------------- anchor keys
def _digest_after(env, seed, path):
    env.reset(seed=seed, options={"split": "train"})
    for action in path:
        _, _, terminated, _, info = env.step(action)
        assert info["action_valid"] and not terminated
    return env.anchor_key("state"), env.anchor_key("observation")


def test_state_keys_same_state_by_different_paths(env):
    for seed in (0, 2):
        env.reset(seed=seed, options={"split": "train"})
        pairs = [(a, b) for a, b in env.checker_paths() if None not in a + b]
        assert len(pairs) == 4  # go-to detour, bookkeeping actions, open/close, take/put back
        for path_a, path_b in pairs:
            assert _digest_after(env, seed, path_a) == _digest_after(env, seed, path_b), (path_a, path_b)


def test_state_keys_differ_for_different_states(env):
    env.reset(seed=0, options={"split": "train"})
    start = env.anchor_key("state")
    a = _digest_after(env, 0, ["go to drawer 4"])
    b = _digest_after(env, 0, ["go to sidetable 1"])
    opened = _digest_after(env, 0, ["go to drawer 4", "open drawer 4"])
    holding = _digest_after(env, 0, ["go to drawer 4", "open drawer 4", "take cellphone 1 from drawer 4"])
    assert len({start, a[0], b[0], opened[0], holding[0]}) == 5
    # the observation key aliases states that differ in what the agent carries; the state key does not
    plain = _digest_after(env, 0, ["go to drawer 4", "open drawer 4", "go to sidetable 1"])
    carrying = _digest_after(
        env, 0, ["go to drawer 4", "open drawer 4", "take cellphone 1 from drawer 4", "go to sidetable 1"]
    )
    assert plain[1] == carrying[1] and plain[0] != carrying[0]
    assert "holds(agent1, cellphone 1)" in env.state_facts()


def test_bookkeeping_predicate_is_read_by_nothing(alfworld_data):
    import alfworld.gen.goal_library as goal_library

    # the state digest leaves out `checked`: check the claim on the domain and grammar the games were built with
    domain = (alfworld_data / "logic" / "alfred.pddl").read_text().lower()
    grammar = (alfworld_data / "logic" / "alfred.twl2").read_text().lower()
    domain = "\n".join(line.split(";")[0] for line in domain.splitlines())  # drop comments
    for pred in BOOKKEEPING_PREDICATES:
        for block in re.findall(r":precondition(.*?):effect", domain, flags=re.DOTALL):
            assert f"({pred} " not in block
        assert f"{pred}(" not in grammar
        assert all(f"({pred} " not in goal["pddl"].lower() for goal in goal_library.gdict.values())


# ---------------------------------------------------------------------------------------------- groups and tasks
def test_group_members_replay_identically(alfworld_data):
    # b shares the memoised PDDL translation of the game; a translates afresh, as alfworld itself does
    a = AlfWorldEnv(data_path=alfworld_data, engine_cache=False)
    b = AlfWorldEnv(data_path=alfworld_data)
    b.reset(seed=4, options={"split": "train"})  # makes sure b's next reset hits the translation cache
    rng = np.random.default_rng(7)
    try:
        transcripts = []
        for env in (a, b):
            obs, info = env.reset(seed=4, options={"split": "train"})
            transcripts.append([obs, json.dumps(info, sort_keys=True)])
        for _ in range(8):
            choices = a.example_actions()
            action = None if rng.random() < 0.2 else choices[int(rng.integers(len(choices)))]
            for env, transcript in zip((a, b), transcripts, strict=True):
                out = env.step(action)
                transcript.append(json.dumps(out[:4]) + json.dumps(out[4], sort_keys=True))
        assert transcripts[0] == transcripts[1]
    finally:
        a.close()
        b.close()


def test_splits_indexing_and_errors(env):
    _, info0 = env.reset(seed=0, options={"split": "train"})
    _, info6 = env.reset(seed=6, options={"split": "train"})  # train wraps around its 6 games
    assert info6["task_id"] == info0["task_id"]
    ids = [env.reset(seed=i, options={"split": "valid_seen"})[1]["task_id"] for i in range(2)]
    assert ids == [g.rel_path for g in env.games("valid_seen")] and ids == sorted(ids)
    assert [env.reset(seed=i, options={"split": "valid_unseen"})[1]["task_type"] for i in range(2)] == ["look", "heat"]
    assert (env.num_tasks("valid_seen"), env.num_tasks("valid_unseen"), env.num_tasks("train")) == (2, 2, None)
    with pytest.raises(ValueError, match=r"seed 2 .*'valid_seen'.* 2 games"):
        env.reset(seed=2, options={"split": "valid_seen"})
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(seed=0, options={"split": "train", "game": 3})
    _, info = env.reset(seed=None, options={"split": "valid_unseen"})  # no seed: drawn from the env's stream
    assert info["task_id"].startswith("valid_unseen/")


def test_missing_data_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    for kwargs in ({}, {"data_path": tmp_path / "nowhere"}, {"data_path": tmp_path}):
        with pytest.raises(FileNotFoundError) as err:
            make_env("alfworld", **kwargs)
        assert "alfworld-download" in str(err.value)
        assert "python -m environments.alfworld.synth --out DIR" in str(err.value)
    (tmp_path / "json_2.1.1" / "valid_seen").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    env = AlfWorldEnv()
    with pytest.raises(ValueError, match=r"no playable games .*'valid_seen'"):
        env.reset(seed=0, options={"split": "valid_seen"})
    env.close()


def test_parse_action_matches_admissible_commands_only(env):
    env.reset(seed=0, options={"split": "train"})
    assert env.parse_action("<think>a</think><action>  Go   TO drawer 4 </action>") == ("go to drawer 4", True)
    assert env.parse_action("go to drawer 4") == ("go to drawer 4", True)
    assert env.parse_action("<action>go to drawer 4.</action>") == (None, False)  # not admissible as written
    assert env.parse_action("<action>open drawer 4</action>") == (None, False)  # not admissible here
    assert env.parse_action("<action>go to drawer 9</action>") == (None, False)


def test_prompt_has_task_history_and_actions(env):
    obs, info = env.reset(seed=1, options={"split": "train"})
    obs2, _, _, _, info2 = env.step("go to armchair 1")
    prompt = env.render_prompt(obs2, info2, history=[(obs, "go to armchair 1")])
    assert prompt.count("Your task is to: put a book in coffeetable.") == 1  # the first observation holds it too
    assert "[Step 0] Observation: -= Welcome to TextWorld" in prompt and "Action: go to armchair 1" in prompt
    assert "You arrive at armchair 1." in prompt and "go to coffeetable 1, " in prompt
    assert "<think>" in prompt and "<action>" in prompt and "help" not in prompt
    assert env.render_prompt(obs, info).count("Your task is to:") == 1


# The first two prompts of an episode on game 0 of the generated training set (the look task), as the episode
# runner renders them: history_length 2, a reply that goes to drawer 4 at step 0. Shown in docs/environments.md.
GOLDEN_PROMPT_0 = """\
You are an expert agent acting in a household simulated by ALFWorld (the text version of ALFRED). \
Your task is to: examine the cellphone with the desklamp.
You have taken 0 of at most 50 steps so far.
Your current observation is:
-= Welcome to TextWorld, ALFRED! =-

You are in the middle of a room. Looking quickly around you, you see a bed 1, a drawer 4, a drawer 3, a drawer 2, \
a drawer 1, a garbagecan 1, and a sidetable 1.
The admissible actions now are: [go to bed 1, go to drawer 1, go to drawer 2, go to drawer 3, go to drawer 4, \
go to garbagecan 1, go to sidetable 1, inventory, look]
Think about the situation step by step first, inside <think> </think> tags. Then choose exactly one admissible \
action, written exactly as listed, and give it inside <action> </action> tags."""

GOLDEN_PROMPT_1 = """\
You are an expert agent acting in a household simulated by ALFWorld (the text version of ALFRED). \
Your task is to: examine the cellphone with the desklamp.
You have taken 1 of at most 50 steps so far.
Recent history:
[Step 0] Observation: -= Welcome to TextWorld, ALFRED! =-

You are in the middle of a room. Looking quickly around you, you see a bed 1, a drawer 4, a drawer 3, a drawer 2, \
a drawer 1, a garbagecan 1, and a sidetable 1.
Action: go to drawer 4
Your current observation is:
You arrive at drawer 4. The drawer 4 is closed.
The admissible actions now are: [examine drawer 4, go to bed 1, go to drawer 1, go to drawer 2, go to drawer 3, \
go to garbagecan 1, go to sidetable 1, inventory, look, open drawer 4]
Think about the situation step by step first, inside <think> </think> tags. Then choose exactly one admissible \
action, written exactly as listed, and give it inside <action> </action> tags."""


def test_golden_first_two_prompts_of_an_episode(alfworld_data, tiny_model_dir):
    import asyncio

    from transformers import AutoTokenizer

    from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, GenerationOutput, TaskSpec, run_episode

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    replies = ["<think>The cellphone may be in a drawer.</think><action>go to drawer 4</action>", "<action>look"]

    class Scripted:  # the two replies, then the second one again until the step limit
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            reply = replies.pop(0) if len(replies) > 1 else replies[0]
            return GenerationOutput(token_ids=tokenizer.encode(reply, add_special_tokens=False))

    episode = asyncio.run(
        run_episode(
            TaskSpec("alfworld", seed=0, env_kwargs={"data_path": str(alfworld_data)}),
            generator=Scripted(),
            encoder=ChatPromptEncoder(tokenizer),
            tokenizer=tokenizer,
            config=EpisodeConfig(max_steps=50, history_length=2, max_prompt_length=4096, invalid_action="format"),
            traj_id="golden",
            sampling_params={},
        )
    )
    assert episode.env_error is None and episode.length == 50
    assert [s.prompt_text for s in episode.steps[:2]] == [GOLDEN_PROMPT_0, GOLDEN_PROMPT_1]
    # the second reply has no action block: invalid under the format rule; its last 30 characters are sent, and
    # the game answers them as any command it does not know
    sent = [(s.action, s.action_valid) for s in episode.steps[:2]]
    assert sent == [("go to drawer 4", True), ("<action>look", False)]
    assert episode.steps[2].observation == "Nothing happens." and episode.steps[2].step_reward == -0.1


# ---------------------------------------------------------------------------------------------- invalid-action rules
def test_format_rule_sends_inadmissible_commands_to_the_engine(env):
    """The reference's alfworld_projection: only a broken format is invalid; a well-formed command that is not
    admissible goes to the game, which answers "Nothing happens." and keeps its state; that answer is the next
    observation and the observation key."""
    obs0, info0 = env.reset(seed=0, options={"split": "train"})
    reply = "<think>maybe</think><action>open drawer 9</action>"
    assert env.parse_action(reply) == (None, False)  # the admissible rule: not admissible here
    assert env.parse_action(reply, rule="format") == ("open drawer 9", True)
    obs, reward, terminated, _, info = env.step("open drawer 9")
    assert obs == "Nothing happens." and reward == 0.0 and not terminated and info["action_valid"] is False
    assert env.anchor_key("state") == info0["anchor_key"] and env.anchor_key("observation") == "Nothing happens."
    # "help" is hidden from the actions but still a command of the engine: it runs and changes no state
    assert env.parse_action("<think>x</think><action>help</action>") == (None, False)
    obs, *_ = env.step("help")
    assert obs.startswith("Available commands:") and env.anchor_key("state") == info0["anchor_key"]
    # the format checks: think tags (exact case), no Chinese characters; the command is sent either way
    cases = {
        "<think>x</think><ACTION> go to drawer 4 </ACTION>": ("go to drawer 4", True),
        "<action>go to drawer 4</action>": ("go to drawer 4", False),
        "<THINK>x</THINK><action>go to drawer 4</action>": ("go to drawer 4", False),
        "<think>抽屉</think><action>go to drawer 4</action>": ("go to drawer 4", False),
        "<think>x</think><action></action>": ("", True),
        "<think>x</think> I will go to drawer 4": ("x</think> I will go to drawer 4"[-30:], False),
    }
    for text, expected in cases.items():
        assert env.parse_action(text, rule="format") == expected, text
    _, _, _, _, info = env.step("go to drawer 4")
    assert info["action_valid"] is True and env.anchor_key("state") != info0["anchor_key"]


def test_reply_parsing_options_on_the_engine(env):
    """env.parse: the reference lower-cases the reply (alfworld_projection) and its engine looks commands up as
    written; this project keeps the reply's case and matches after collapsing whitespace. Replies the two rules treat
    differently, played on the real engine."""
    from environments.base import ParseStyle

    ours, reference = ParseStyle(), ParseStyle(lowercase=True, collapse_whitespace=False)
    _, info0 = env.reset(seed=0, options={"split": "train"})
    state0 = info0["anchor_key"]
    # case: "Help" is no admissible action; sent as written the engine does not know it, lower-cased it runs help
    help_reply = "<think>x</think><action>Help</action>"
    assert env.parse_action(help_reply, rule="format") == ("Help", True)
    assert env.step("Help")[0] == "Nothing happens."
    env.parse_style = reference
    assert env.parse_action(help_reply, rule="format") == ("help", True)
    assert env.step("help")[0].startswith("Available commands:") and env.anchor_key("state") == state0
    # the 30-character tail of a reply without an action block is lower-cased; think tags are judged as written
    cases = {
        "<think>x</think> I will Go To Drawer 4": ("x</think> i will go to drawer 4"[-30:], False),
        "<THINK>x</THINK><action>Go To Drawer 4</action>": ("go to drawer 4", False),
        "<think>x</think><ACTION>Go To Drawer 4</ACTION>": ("go to drawer 4", True),
    }
    for text, expected in cases.items():
        assert env.parse_action(text, rule="format") == expected, text
    # whitespace: two spaces inside the command
    spaced = "<think>x</think><action>go to  drawer 4</action>"
    for style, moved in ((ours, True), (reference, False)):
        env.parse_style = style
        env.reset(seed=0, options={"split": "train"})
        command, valid = env.parse_action(spaced, rule="format")
        assert (command, valid) == ("go to  drawer 4", True)
        obs, _, _, _, info = env.step(command)
        assert info["action_valid"] is moved and (env.anchor_key("state") != state0) is moved, style
        assert obs.startswith("You arrive at drawer 4") if moved else obs == "Nothing happens."
        # the admissible rule: the matcher decides alike
        env.reset(seed=0, options={"split": "train"})
        assert env.parse_action("<action>Go To  Drawer 4</action>") == (
            ("go to drawer 4", True) if moved else (None, False)
        )


# ---------------------------------------------------------------------------------------------- training seeds
def _entries(counts: dict[str, int]) -> list:
    from environments.alfworld.data import GameEntry

    games = [
        GameEntry(f"train/{TASK_TYPES[kind]}-x-{i:04d}/trial_0/game.tw-pddl", TASK_TYPES[kind])
        for kind, n in counts.items()
        for i in range(n)
    ]
    return sorted(games, key=lambda g: g.rel_path)


def test_training_order_puts_every_task_type_in_every_prefix_in_proportion():
    # a list shaped like the real one: six types of very different sizes, in long sorted runs
    counts = {"look": 196, "pick": 790, "clean": 650, "cool": 533, "heat": 459, "pick2": 925}
    games = _entries(counts)
    order = training_order(games)
    assert sorted(order, key=lambda g: g.rel_path) == games  # a permutation
    assert order == training_order(games)  # deterministic
    total = len(games)
    assert {g.kind for g in games[: total // 2]} == {"look", "pick", "clean", "cool"}  # sorted: two types missing
    assert {g.kind for g in order[:6]} == set(counts)  # the first games are one of each type
    for kind in counts:  # each type keeps its sorted order
        assert [g for g in order if g.kind == kind] == [g for g in games if g.kind == kind]
    seen, worst = dict.fromkeys(counts, 0), 0.0
    for length, game in enumerate(order, start=1):
        seen[game.kind] += 1
        for kind, n in counts.items():  # the bound of training_order's docstring, for every prefix
            share = length * n / total
            assert share - len(counts) * n / total - 1e-9 <= seen[kind] <= share + 1 + 1e-9, (length, kind)
            worst = max(worst, abs(seen[kind] - share))
    assert worst < 1.6


@pytest.fixture(scope="module")
def uneven_alfworld_data(tmp_path_factory):
    """Six generated training games whose sorted list is 3 pick, 1 heat, 2 pick-two: its first half is all pick."""
    out = tmp_path_factory.mktemp("alfworld-uneven")
    generate(out, games_per_type={"train": {"pick": 3, "heat": 1, "pick2": 2}}, seed=0)
    return out


def test_first_half_of_the_training_seeds_reaches_every_task_type(uneven_alfworld_data):
    env = AlfWorldEnv(data_path=uneven_alfworld_data, max_steps=5)
    try:
        by_path = [g.kind for g in list_games(env.json_root, "train")]
        assert by_path == ["pick"] * 3 + ["heat"] + ["pick2"] * 2  # its first half holds one task type
        by_seed = [env.task_type_of(seed, "train") for seed in range(len(by_path))]
        assert set(by_seed[: len(by_path) // 2]) == {"pick", "heat", "pick2"}
        assert by_seed == ["pick", "heat", "pick2", "pick", "pick2", "pick"]
        assert env.task_type_of(6, "train") == env.task_type_of(0, "train")  # seeds wrap around
        for seed in (1, 2):  # what reset plays is what task_type_of says
            _, info = env.reset(seed=seed, options={"split": "train"})
            assert info["task_type"] == env.task_type_of(seed, "train")
            assert info["task_id"] == env.games("train")[seed].rel_path
        with pytest.raises(ValueError, match="unknown split"):
            env.task_type_of(0, "test")
    finally:
        env.close()


def test_engine_side_effects_are_contained_and_close_is_idempotent(alfworld_data):
    argv = list(sys.argv)
    env = AlfWorldEnv(data_path=alfworld_data)
    env.reset(seed=2, options={"split": "train"})
    assert sys.argv == argv  # fast-downward's translator overwrites sys.argv on every reset
    env.close()
    env.close()
    with pytest.raises(EnvError, match="closed"):
        env.reset(seed=0)


def test_environments_in_threads_match_sequential_play(alfworld_data):
    # the engine has process-global state; the adapter's lock must make threaded play equal to sequential play
    from concurrent.futures import ThreadPoolExecutor

    def play(seed):
        env = AlfWorldEnv(data_path=alfworld_data, engine_cache=seed % 2 == 0)
        try:
            obs, info = env.reset(seed=seed, options={"split": "train"})
            out = [obs, info["anchor_key"]]
            for k in range(4):
                actions = info["admissible_actions"]
                obs, _, _, _, info = env.step(actions[(seed + k) % len(actions)])
                out += [obs, info["anchor_key"]]
            return out
        finally:
            env.close()

    sequential = [play(seed) for seed in (1, 2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        threaded = list(pool.map(play, (1, 2)))
    assert threaded == sequential


def test_alfworld_is_imported_lazily_and_leaves_the_data_variable_alone(alfworld_data):
    # a fresh interpreter: importing the adapter loads no engine; building one does, without setting $ALFWORLD_DATA
    import os
    import subprocess

    code = (
        "import os, sys\n"
        "import environments, environments.alfworld, environments.alfworld.synth\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('alfworld', 'textworld', 'fast_downward')]\n"
        "assert not heavy, heavy\n"
        "env = environments.make_env('alfworld', data_path=sys.argv[1])\n"
        "assert 'textworld' in sys.modules and 'ALFWORLD_DATA' not in os.environ\n"
        "print(env.reset(seed=0)[1]['task_type'])\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(alfworld_data)], capture_output=True, text=True, env=environ, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "look"
