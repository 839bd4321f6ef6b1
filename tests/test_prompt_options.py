"""CPU tests of the prompt options (``env.prompt.*``: :class:`verl_gigpo.rollout.types.PromptOptions`,
:class:`environments.base.PromptStyle`, WebShop's ``strategy_hints``) on real environments and a real tokenizer:
the structure each option gives, the over-long rules, the checks that name the key, and the paper recipes' prompts.
"""

from __future__ import annotations

import asyncio

import pytest
from recipe_config import compose_recipe
from transformers import AutoTokenizer

from environments import make_env
from environments.base import PromptStyle
from environments.gridnav.env import GridNavEnv
from environments.webshop.prompt import WEBSHOP_STRATEGY
from verl_gigpo.local.config import load_config
from verl_gigpo.rollout import (
    ChatPromptEncoder,
    EpisodeConfig,
    GenerationOutput,
    PromptOptions,
    PromptTooLongError,
    TaskSpec,
    build_prompt,
    run_episode,
)
from verl_gigpo.rollout.metrics import episode_metrics, summaries_from_episodes
from verl_gigpo.verl_glue.agent_loop import episode_config_from
from verl_gigpo.verl_glue.preflight import config_problems

#: a step limit that appears nowhere else in the prompts below
LIMIT = 1987

#: the reference's structure: no step limit, history numbered from 1, one quoted action per line
REFERENCE_STYLE = PromptStyle(show_step_limit=False, first_step_number=1, admissible_actions="lines")

#: how each environment labels history item ``{}`` (its ``history_item_template``)
HISTORY_LABEL = {
    "alfworld": "[Step {}]",
    "webshop": "Step {}: page:",
    "sokoban": "Observation {}:",
    "search": "[turn {}]",
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _env(name, alfworld_data):
    kwargs = {"data_path": str(alfworld_data)} if name == "alfworld" else {}
    return make_env(name, max_steps=LIMIT, **kwargs)


def _two_steps(env):
    """Reset ``env`` and take two steps of its example actions (WebShop: a search, then a product):
    ``(obs, info, history)`` after them."""
    obs, info = env.reset(seed=1)
    history = []
    for _ in range(2):
        action = env.example_actions()[2 if env.name == "webshop" else 0]
        history.append((obs, action))
        obs, _, terminated, truncated, info = env.step(action)
        assert not (terminated or truncated)
    return obs, info, history


@pytest.mark.parametrize("name", ["alfworld", "webshop", "sokoban", "search"])
def test_reference_structure_on_a_real_environment(name, alfworld_data):
    """The same state and history rendered in this project's style and in the reference's: the step limit goes, the
    history is numbered from 1, and the admissible actions stand one per line, quoted."""
    env = _env(name, alfworld_data)
    obs, info, history = _two_steps(env)
    ours = env.render_prompt(obs, info, history)
    theirs = env.render_prompt(obs, info, history, REFERENCE_STYLE)
    assert str(LIMIT) in ours and str(LIMIT) not in theirs
    label = HISTORY_LABEL[name]
    assert label.format(0) in ours and label.format(1) in ours and label.format(2) not in ours
    assert label.format(0) not in theirs and label.format(1) in theirs and label.format(2) in theirs
    actions = info["admissible_actions"]
    if actions is None:  # search lists no actions: its prompt names its two
        assert name == "search"
        return
    assert len(actions) >= 2 and ", ".join(actions) in ours and ", ".join(actions) not in theirs
    assert all(f"\n'{action}'" in theirs for action in actions)
    env.close()


def test_webshop_strategy_sentences_are_an_environment_argument():
    plain = make_env("webshop", strategy_hints=False)
    advised = make_env("webshop")
    obs, info = plain.reset(seed=3)
    assert advised.reset(seed=3) == (obs, info)
    assert WEBSHOP_STRATEGY in advised.render_prompt(obs, info)
    assert WEBSHOP_STRATEGY not in plain.render_prompt(obs, info) and "scored" not in plain.render_prompt(obs, info)
    assert plain.render_prompt(obs, info) == advised.render_prompt(obs, info).replace(WEBSHOP_STRATEGY, "")
    with pytest.raises(ValueError, match="strategy_hints='no'"):
        make_env("webshop", strategy_hints="no")


class _LimitInTemplate(GridNavEnv):
    """A real gridnav environment whose template writes the step limit outside ``step_limit_phrases``."""

    prompt_template = "{observation} (move {step} of {max_steps})"


def test_a_template_that_states_the_limit_cannot_hide_it():
    env = _LimitInTemplate(max_steps=12)
    obs, info = env.reset(seed=0)
    assert env.render_prompt(obs, info).endswith("(move 0 of 12)")
    with pytest.raises(ValueError, match="step_limit_phrases"):
        env.render_prompt(obs, info, style=PromptStyle(show_step_limit=False))


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("show_step_limit", "no", "env.prompt.show_step_limit='no'"),
        ("first_step_number", 2, "env.prompt.first_step_number=2"),
        ("first_step_number", True, "env.prompt.first_step_number=True"),
        ("admissible_actions", "json", "env.prompt.admissible_actions='json'"),
        ("invalid_reply_tail", -1, "env.prompt.invalid_reply_tail=-1"),
        ("overlong", "error", "env.prompt.overlong='error'"),
        ("history_free_above_chars", 0, "env.prompt.history_free_above_chars=0"),
        ("colour", "red", r"unknown env.prompt key\(s\) \['colour'\]"),
    ],
)
def test_bad_prompt_options_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        PromptOptions.from_config({key: value})
    env = {"max_steps": 5, "history_length": 2, "invalid_action_penalty": 0.1, "prompt": {key: value}}
    with pytest.raises(ValueError, match=match):  # the constructor both engines use
        EpisodeConfig.from_env(env, max_prompt_length=512, max_response_length=8, key_mode="state")


def test_both_engines_check_the_prompt_options_before_starting():
    cfg, _ = compose_recipe("sokoban", "env.prompt.first_step_number=2")
    (problem,) = [p for p in config_problems(cfg) if "env.prompt" in p]
    assert problem.startswith("env.prompt.first_step_number=2 must be 0 or 1")
    with pytest.raises(ValueError, match="env.prompt.overlong='error'"):
        load_config(["env.prompt.overlong=error"])
    assert load_config(["env.prompt.overlong=cut_left"]).env.prompt.overlong == "cut_left"


# ------------------------------------------------------------------------------------ the history of a bad reply
class _Scripted:
    """A generator that always answers ``reply`` (token ids of the tiny model's tokenizer)."""

    def __init__(self, tokenizer, reply):
        self.ids = tokenizer.encode(reply, add_special_tokens=False)

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        return GenerationOutput(token_ids=list(self.ids))


def _play(tokenizer, task, config, reply):
    return asyncio.run(
        run_episode(
            task,
            generator=_Scripted(tokenizer, reply),
            encoder=ChatPromptEncoder(tokenizer),
            tokenizer=tokenizer,
            config=config,
            traj_id="t",
            sampling_params={},
        )
    )


@pytest.mark.parametrize(("tail", "shown"), [(None, "(invalid output)"), (0, ""), (5, "TAIL"), (10_000, "ALL")])
def test_a_reply_that_sends_nothing_shows_its_tail_or_the_placeholder(tokenizer, tail, shown):
    """Search under the format rule sends nothing for a reply with no search or answer block; the history shows the
    placeholder, nothing (0, the reference's empty action) or the reply's last N characters."""
    config = EpisodeConfig(
        max_steps=3,
        history_length=2,
        max_prompt_length=4096,
        max_response_length=64,
        invalid_action="format",
        prompt=PromptOptions(invalid_reply_tail=tail),
    )
    episode = _play(tokenizer, TaskSpec("search", seed=0), config, "I think it is Marrowick.")
    assert episode.env_error is None and episode.length == 3
    assert all(s.action is None and not s.action_valid for s in episode.steps)
    reply = episode.steps[0].response_text
    text = {"TAIL": reply[-5:], "ALL": reply}.get(shown, shown)
    assert episode.steps[2].prompt_text.count(f"Your action: {text}\n") == 2


# ------------------------------------------------------------------------------------------- over-long prompts
@pytest.fixture(scope="module")
def webshop_state():
    """A WebShop state after two real steps (long pages: the history holds two of them)."""
    env = make_env("webshop", max_steps=15)
    obs, info, history = _two_steps(env)
    return env, obs, info, history


def test_overlong_rules_on_a_real_tokenizer(tokenizer, webshop_state):
    env, obs, info, history = webshop_state
    encoder = ChatPromptEncoder(tokenizer)
    full_text = env.render_prompt(obs, info, history)
    full = encoder(full_text)
    budget = len(full) - 7

    def build(**options):
        config = EpisodeConfig(history_length=2, max_prompt_length=budget, prompt=PromptOptions(**options))
        return build_prompt(env, obs, info, history, encoder, config)

    text, ids, used, cut = build(overlong="cut_left")  # history kept, the ids cut from the left
    assert (text, ids, used, cut) == (full_text, full[7:], 2, True)
    text, ids, used, cut = build(overlong="drop_history")  # the default: the oldest item goes
    assert used == 1 and not cut and len(ids) <= budget and text == env.render_prompt(obs, info, history[1:])
    with pytest.raises(PromptTooLongError, match=rf"{len(full)} tokens .* data.max_prompt_length={budget}"):
        build(overlong="fail_episode")
    # the reference's WebShop rule: a prompt longer than N characters with history is shown without it
    free = env.render_prompt(obs, info, [])
    text, ids, used, cut = build(history_free_above_chars=len(full_text) - 1, overlong="fail_episode")
    assert (text, ids, used, cut) == (free, encoder(free), 0, False)
    config = EpisodeConfig(
        history_length=2, max_prompt_length=len(full), prompt=PromptOptions(history_free_above_chars=len(full_text))
    )
    assert build_prompt(env, obs, info, history, encoder, config)[:3] == (full_text, full, 2)


def test_fail_episode_ends_the_episode_as_an_environment_failure(tokenizer):
    """Under fail_episode a prompt over budget ends its episode: recorded in env_error, counted in env_error_rate."""
    env = make_env("sokoban", max_steps=4)
    first = ChatPromptEncoder(tokenizer)(env.render_prompt(*env.reset(seed=0)))
    options = PromptOptions(overlong="fail_episode")
    config = EpisodeConfig(max_steps=4, max_prompt_length=len(first) - 1, max_response_length=16, prompt=options)
    episode = _play(tokenizer, TaskSpec("sokoban", seed=0), config, "<think>x</think><action>up</action>")
    assert episode.steps == [] and episode.env_error.startswith("PromptTooLongError")
    assert "data.max_prompt_length" in episode.env_error
    summary = summaries_from_episodes([episode])
    assert episode_metrics(summary)["env/env_error_rate"] == 1.0


# ---------------------------------------------------------------------------------------------- the paper recipes
#: The third prompt of an ALFWorld episode as the paper recipe renders it (game 0 of the generated training set, the
#: look task): replies "go to drawer 4", then one with no action block (its last 30 characters are sent and shown).
GOLDEN_RECIPE_PROMPT_2 = """\
You are an expert agent acting in a household simulated by ALFWorld (the text version of ALFRED). \
Your task is to: examine the cellphone with the desklamp.
You have taken 2 steps so far.
Recent history:
[Step 1] Observation: -= Welcome to TextWorld, ALFRED! =-

You are in the middle of a room. Looking quickly around you, you see a bed 1, a drawer 4, a drawer 3, a drawer 2, \
a drawer 1, a garbagecan 1, and a sidetable 1.
Action: go to drawer 4
[Step 2] Observation: You arrive at drawer 4. The drawer 4 is closed.
Action: <action>look
Your current observation is:
Nothing happens.
The admissible actions now are: [
'examine drawer 4'
'go to bed 1'
'go to drawer 1'
'go to drawer 2'
'go to drawer 3'
'go to garbagecan 1'
'go to sidetable 1'
'inventory'
'look'
'open drawer 4']
Think about the situation step by step first, inside <think> </think> tags. Then choose exactly one admissible \
action, written exactly as listed, and give it inside <action> </action> tags."""


def test_alfworld_recipe_renders_the_reference_structure(alfworld_data, tokenizer):
    cfg, _ = compose_recipe("alfworld", MAX_STEPS="3")
    config = episode_config_from(cfg)
    assert config.prompt == PromptOptions(style=REFERENCE_STYLE, overlong="fail_episode")
    replies = ["<think>The cellphone may be in a drawer.</think><action>go to drawer 4</action>", "<action>look"]

    class Scripted:  # the two replies, then the second one again until the step limit
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            reply = replies.pop(0) if len(replies) > 1 else replies[0]
            return GenerationOutput(token_ids=tokenizer.encode(reply, add_special_tokens=False))

    task = TaskSpec("alfworld", seed=0, env_kwargs={"data_path": str(alfworld_data)})
    episode = asyncio.run(
        run_episode(
            task,
            generator=Scripted(),
            encoder=ChatPromptEncoder(tokenizer),
            tokenizer=tokenizer,
            config=config,
            traj_id="golden",
            sampling_params={},
        )
    )
    assert episode.env_error is None and episode.length == 3
    assert episode.steps[2].prompt_text == GOLDEN_RECIPE_PROMPT_2


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        ("webshop", PromptOptions(REFERENCE_STYLE, overlong="fail_episode", history_free_above_chars=13000)),
        ("sokoban", PromptOptions(PromptStyle(False, 1, "comma"), overlong="fail_episode")),
        ("search", PromptOptions(PromptStyle(False, 1, "comma"), invalid_reply_tail=0, overlong="cut_left")),
    ],
)
def test_recipes_compose_the_reference_prompt_options(recipe, expected):
    cfg, _ = compose_recipe(recipe)
    assert episode_config_from(cfg).prompt == expected
    if recipe == "webshop":
        assert cfg.env.kwargs.strategy_hints is False


@pytest.mark.parametrize("recipe", ["alfworld", "webshop", "sokoban"])
def test_cpu_recipes_shorten_overlong_prompts(recipe):
    """DEVICE=cpu runs a tiny model whose tokenizer makes Sokoban's prompt with history longer than its budget: the
    smoke run drops history instead of failing its episodes (PROMPT_OVERLONG overrides either)."""
    assert compose_recipe(recipe, DEVICE="cpu")[0].env.prompt.overlong == "drop_history"
    assert compose_recipe(recipe, DEVICE="cpu", PROMPT_OVERLONG="cut_left")[0].env.prompt.overlong == "cut_left"
