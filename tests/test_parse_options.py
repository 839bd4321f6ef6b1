"""CPU tests of the reply-parsing options (``env.parse.*``: :class:`environments.base.ParseStyle`): both engines read
and check them, the environment factory hands them to every environment, and the paper recipes set the reference's
rules per environment (held by tests/test_fidelity.py's rows "reply case" and "reply whitespace"). What each rule
does on the real engines is in tests/test_alfworld.py, test_webshop.py, test_sokoban.py and test_search.py."""

from __future__ import annotations

import pytest
import yaml
from recipe_config import compose_recipe

from environments.base import ParseStyle
from verl_gigpo.local.config import load_config
from verl_gigpo.rollout import EpisodeConfig, TaskSpec, make_task_env
from verl_gigpo.rollout.types import PARSE_KEYS, parse_style_from_config
from verl_gigpo.verl_glue.preflight import config_problems

REFERENCE = ParseStyle(lowercase=True, collapse_whitespace=False)
ENV = {"max_steps": 5, "history_length": 2, "invalid_action_penalty": 0.1}


def _from_env(parse):
    return EpisodeConfig.from_env(
        {**ENV, "parse": parse}, max_prompt_length=512, max_response_length=8, key_mode="state"
    )


def test_both_yamls_declare_the_defaults():
    for name in ("gigpo_trainer.yaml", "local_trainer.yaml"):
        with open(f"verl_gigpo/config/{name}", encoding="utf-8") as f:
            section = yaml.safe_load(f)["env"]["parse"]
        assert (
            tuple(section) == PARSE_KEYS and parse_style_from_config(section) == ParseStyle() == _from_env(None).parse
        )


@pytest.mark.parametrize(
    ("parse", "match"),
    [
        ({"lowercase": "yes"}, r"env.parse.lowercase='yes' must be true or false"),
        ({"collapse_whitespace": 0}, r"env.parse.collapse_whitespace=0 must be true or false"),
        ({"case": True}, r"unknown env.parse key\(s\) \['case'\]"),
        ("lowercase", "env.parse must be a mapping"),
    ],
)
def test_bad_parse_options_name_the_key(parse, match):
    with pytest.raises(ValueError, match=match):
        parse_style_from_config(parse)
    with pytest.raises(ValueError, match=match):  # the constructor both engines use
        _from_env(parse)


def test_both_engines_check_the_parse_options_before_starting():
    cfg, _ = compose_recipe("sokoban", "env.parse.lowercase=maybe")
    assert [p for p in config_problems(cfg) if "env.parse" in p][0].startswith("env.parse.lowercase='maybe'")
    with pytest.raises(ValueError, match="env.parse.collapse_whitespace='no'"):
        load_config(["env.parse.collapse_whitespace='no'"])
    assert load_config(["env.parse.lowercase=true"]).env.parse.lowercase is True


def test_the_factory_gives_every_environment_the_episode_rules():
    config = _from_env({"lowercase": True, "collapse_whitespace": False})
    assert config.parse == REFERENCE
    env = make_task_env(TaskSpec("webshop", seed=0, split="test"), config)
    env.reset(seed=0, options={"split": "test"})
    assert env.parse_style == REFERENCE
    assert env.parse_action("<think>x</think><action>Search[Blue Shoes]</action>", rule="format")[0] == (
        "search[blue shoes]"
    )
    assert make_task_env(TaskSpec("webshop", seed=0), _from_env(None)).parse_style == ParseStyle()


@pytest.mark.parametrize("workers", [0, 1])
def test_an_alfworld_episode_sends_and_shows_what_the_rules_say(alfworld_data, tiny_model_dir, workers, monkeypatch):
    """Through the episode runner (in this process, and hosted in a worker process with a local view that parses): the
    same replies played under this project's rules and the reference's, on the real engine."""
    import asyncio
    import dataclasses

    from transformers import AutoTokenizer

    from verl_gigpo.rollout import ChatPromptEncoder, GenerationOutput, run_episode
    from verl_gigpo.rollout.execution.pool import EnvPool

    monkeypatch.setenv("ALFWORLD_DATA", str(alfworld_data))  # inherited by the worker process
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    replies = ["<think>x</think><action>Go To  Drawer 4</action>", "<think>x</think><action>Help</action>"]

    class Scripted:
        def __init__(self):
            self.left = list(replies)

        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return GenerationOutput(token_ids=tokenizer.encode(self.left.pop(0), add_special_tokens=False))

    async def play(parse):
        config = EpisodeConfig(max_steps=2, history_length=2, max_prompt_length=4096, invalid_action="format")
        config = dataclasses.replace(config, parse=parse)
        pool = EnvPool(num_workers=workers)
        try:
            return await run_episode(
                TaskSpec("alfworld", seed=0),
                generator=Scripted(),
                encoder=ChatPromptEncoder(tokenizer),
                tokenizer=tokenizer,
                config=config,
                traj_id="t",
                sampling_params={},
                env_pool=pool,
            )
        finally:
            pool.close()

    ours, reference = asyncio.run(play(ParseStyle())), asyncio.run(play(REFERENCE))
    assert [(s.action, s.action_valid) for s in ours.steps] == [("Go To  Drawer 4", True), ("Help", True)]
    assert [(s.action, s.action_valid) for s in reference.steps] == [("go to  drawer 4", True), ("help", True)]
    # ours went to drawer 4 (matched), the reference's engine did not know the oddly spaced command
    assert ours.steps[1].observation.startswith("You arrive at drawer 4")
    assert reference.steps[1].observation == "Nothing happens."
    assert "go to  drawer 4" in reference.steps[1].prompt_text  # the history shows the lower-cased command
