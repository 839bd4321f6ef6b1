"""CPU tests of the reply-parsing options (``env.parse.*``: :class:`environments.base.ParseStyle`): both engines read
and check them, the environment factory hands them to every environment, and the paper recipes set the reference's
rules per environment. What each rule does on the real engines is in tests/test_alfworld.py, test_webshop.py,
test_sokoban.py and test_search.py."""

from __future__ import annotations

import pytest
import yaml
from recipe_config import compose_recipe

from environments.base import ParseStyle
from verl_gigpo.local.config import load_config
from verl_gigpo.rollout import EpisodeConfig, TaskSpec, make_task_env
from verl_gigpo.rollout.types import PARSE_KEYS, parse_style_from_config
from verl_gigpo.verl_glue.agent_loop import episode_config_from
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


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [("alfworld", REFERENCE), ("webshop", REFERENCE), ("sokoban", REFERENCE), ("search", ParseStyle())],
)
def test_recipes_compose_the_reference_parsing(recipe, expected, tmp_path):
    cfg, _ = compose_recipe(recipe, ALFWORLD_DATA=str(tmp_path))
    assert episode_config_from(cfg).parse == expected
