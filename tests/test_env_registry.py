"""The registry and the contract checker over EVERY registered environment (a new environment is checked as soon
as it is registered), plus the checker's command line."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import environments
from environments import list_envs, make_env
from environments.base import extract_tag, strip_tag
from environments.checker import FUZZ_INPUTS, EnvCheckError, check_env


def _kwargs(name: str, request) -> dict:
    if name == "alfworld":
        return {"data_path": str(request.getfixturevalue("alfworld_data"))}
    return {}


@pytest.mark.parametrize("name", list_envs())
def test_every_registered_environment_passes_the_checker(name, request):
    try:
        env = make_env(name, **_kwargs(name, request))
    except ImportError as exc:
        # only an optional backend may be missing, and its error must say how to install it
        assert name == "webshop_real" and "WebShop" in str(exc)
        pytest.skip(f"{name}: optional dependency not installed")
    try:
        counts = check_env(env, seeds=(0, 1), n_steps=6)
    finally:
        env.close()
    assert counts["transitions"] > 0 and counts["fuzz_inputs"] > 100 and counts["path_pairs"] >= 2


def test_registry_lists_the_six_built_in_environments_and_rejects_unknown_names():
    assert {"alfworld", "gridnav", "search", "sokoban", "webshop", "webshop_real"} <= set(list_envs())
    assert list_envs() == sorted(list_envs())
    with pytest.raises(ValueError, match="known environments: alfworld"):
        make_env("alfword")


def test_registering_a_name_twice_to_another_target_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        environments.register_env("sokoban", "environments.gridnav.env:GridNavEnv")
    with pytest.raises(ValueError, match="module:ClassName"):
        environments.register_env("x", "no_colon_here")


def test_checker_reports_every_failure():
    """A deliberately broken environment: the checker must name what is wrong, not pass."""
    from environments.sokoban.env import SokobanEnv

    class Leaky(SokobanEnv):
        def parse_action(self, llm_text):
            return llm_text.strip().lower(), True  # not total (raises on bytes/None), and "valid" for junk

    with pytest.raises(EnvCheckError) as info:
        check_env(Leaky(), seeds=(0,), n_steps=3)
    assert any("parse_action(rule='admissible') raised" in f for f in info.value.failures)


def test_checker_refuses_an_environment_that_accepts_unknown_reset_options():
    from environments.gridnav.env import GridNavEnv

    class Lax(GridNavEnv):
        reset_options = ("no_such_option",)  # what the checker tries as an unknown option

    with pytest.raises(EnvCheckError) as info:
        check_env(Lax(), seeds=(0,), n_steps=3)
    assert info.value.failures == [
        "reset(options={'split': 'train', 'no_such_option': 1}) was accepted; unknown options must be refused"
    ]


def test_checker_leaves_the_key_mode_as_it_was():
    env = make_env("gridnav", key_mode="history:2")
    check_env(env, seeds=(0,), n_steps=3)
    assert (env.key_mode, env.key_kind, env.key_history) == ("history:2", "history", 2)


def test_checker_cli_exits_zero():
    proc = subprocess.run(
        [sys.executable, "-m", "environments.checker", "sokoban", "--seeds", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK sokoban")


def test_checker_cli_rejects_no_seeds_and_negative_steps(capsys):
    from environments.checker import main

    for args, match in ((["--seeds", "0"], "--seeds: expected an integer >= 1, got 0"), (["--steps", "-5"], "got -5")):
        with pytest.raises(SystemExit) as exit_info:
            main(["gridnav", *args])
        assert exit_info.value.code == 2
        assert match in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"one seed.*seeds="):
        check_env(make_env("gridnav"), seeds=())
    with pytest.raises(ValueError, match=r"n_steps .*>= 1"):
        check_env(make_env("gridnav"), n_steps=-5)


@pytest.mark.parametrize("name", list_envs())
@pytest.mark.parametrize("options", [["x"], "train", 5])
def test_reset_options_that_are_not_a_dict_are_a_clear_error(name, options, request):
    try:
        env = make_env(name, **_kwargs(name, request))
    except ImportError:
        pytest.skip(f"{name}: optional dependency not installed")
    with pytest.raises(ValueError, match=rf"{name}: reset options .*dict or None.*\b{type(options).__name__}\b"):
        env.reset(seed=0, options=options)
    env.close()


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("gridnav", {"size": 100_000}, r"gridnav: size .*\[3, 64\].*100000"),
        ("gridnav", {"size": 5, "min_path": 10**9}, r"min_path .*\[1, 24\]"),
        ("gridnav", {"max_steps": 10**9}, r"max_steps .*\[1, 10000\]"),
        ("sokoban", {"dim_room": (1000, 1000)}, r"dim_room=\(1000, 1000\) .*<= 32"),
        ("sokoban", {"num_gen_steps": 10**6}, r"num_gen_steps .*\[1, 1000\]"),
        ("sokoban", {"max_gen_states": 10**9}, r"max_gen_states .*\[1, 2000000\]"),
        ("webshop", {"num_products": 10**7}, r"num_products .*\[50, 50000\]"),
        ("webshop", {"num_train_goals": 10**8}, r"num_train_goals .*\[1, 200000\]"),
        ("search", {"top_k": 10**6}, r"top_k .*\[1, 100\]"),
        ("search", {"corpus_config": {"n_people": 10**7}}, r"CorpusConfig\.n_people .*\[0, 10000\]"),
    ],
)
def test_unbounded_constructor_arguments_are_rejected(name, kwargs, match):
    # Each of these used to be accepted and then exhausted memory or time (gridnav size=100000 at the first reset).
    with pytest.raises(ValueError, match=match):
        make_env(name, **kwargs)


def _regex_blocks(text: str, tag: str) -> list[str]:
    """The definition the linear scan must reproduce: the lazy regex (quadratic on unclosed tags)."""
    return re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.IGNORECASE | re.DOTALL)


def test_tag_scanning_matches_the_regex_definition():
    rng = np.random.default_rng(0)
    pieces = ["<action>", "</action>", "<ACTION>", "</Action>", "<think>", "</think>", "<action", "x", " ", "\n", "é"]
    for _ in range(3000):
        text = "".join(pieces[int(i)] for i in rng.integers(len(pieces), size=int(rng.integers(0, 16))))
        for tag in ("action", "think"):
            assert extract_tag(text, tag) == _regex_blocks(text, tag), (text, tag)
            expected = re.sub(rf"<{tag}>.*?</{tag}>", "", text, flags=re.IGNORECASE | re.DOTALL)
            assert strip_tag(text, tag) == expected, (text, tag)


@pytest.mark.parametrize("text", ["<action>" * 8192, "<think>" * 9362, "<ACTION>" * 8191 + "</action>"])
def test_repeated_unclosed_tags_parse_as_invalid(text):
    # These made parse_action quadratic (2.6 s at the 64 KB cap, see benchmarks/RESULTS.md); the checker fuzzes
    # them in every environment. The result is the same as before: no single well-formed action.
    assert text in FUZZ_INPUTS
    assert make_env("gridnav").parse_action(text) == (None, False)
    assert extract_tag(text, "action") == _regex_blocks(text, "action")


# ------------------------------------------------------------------------------ the contract's public pieces
def _classes() -> dict[str, type]:
    """Each registered environment's class (importing its module needs no optional dependency)."""
    from environments.alfworld.env import AlfWorldEnv
    from environments.gridnav.env import GridNavEnv
    from environments.search.env import SearchQAEnv
    from environments.sokoban.env import SokobanEnv
    from environments.webshop.env import WebShopEnv
    from environments.webshop.real import WebShopRealEnv

    return {
        "alfworld": AlfWorldEnv,
        "gridnav": GridNavEnv,
        "search": SearchQAEnv,
        "sokoban": SokobanEnv,
        "webshop": WebShopEnv,
        "webshop_real": WebShopRealEnv,
    }


def test_each_environment_accepts_the_reset_options_it_did():
    accepted = {name: cls.reset_options for name, cls in _classes().items()}
    assert accepted == {name: ("room",) if name == "sokoban" else () for name in accepted}


@pytest.mark.parametrize("name", list_envs())
def test_an_unknown_reset_option_is_refused_before_anything_changes(name, request):
    try:
        env = make_env(name, **_kwargs(name, request))
    except ImportError:
        pytest.skip(f"{name}: optional dependency not installed")
    env.reset(seed=0)
    env.step(env.example_actions()[0])
    before = (env.anchor_key("state"), env.task_id, env.seed, env.split)
    accepted = "accepted: 'split', 'room'" if name == "sokoban" else "only 'split' is accepted"
    with pytest.raises(ValueError, match=rf"^{name}: unknown reset options \['level'\]; {accepted}$"):
        env.reset(seed=1, options={"split": env.splits[-1], "level": 3})
    assert (env.anchor_key("state"), env.task_id, env.seed, env.split) == before
    env.step(None)  # the episode goes on
    env.close()


def test_reset_hands_only_the_accepted_options_to_the_subclass():
    from environments.gridnav.env import GridNavEnv

    class WithLevel(GridNavEnv):
        reset_options = ("level",)

        def _reset(self, split, options):
            self.seen = dict(options)
            return super()._reset(split, {})

    env = WithLevel()
    env.reset(seed=0, options={"split": "test", "level": 3})
    assert env.seen == {"level": 3} and env.split == "test"
    with pytest.raises(ValueError, match=r"reset options \['x'\].*'split', 'level'"):
        env.reset(options={"x": 1})


@pytest.mark.parametrize("name", ["gridnav", "sokoban", "webshop", "search"])
def test_anchor_key_by_mode_is_the_key_an_env_built_with_that_mode_reports(name):
    modes = ("state", "observation", "history:2")
    envs = {mode: make_env(name, key_mode=mode) for mode in modes}
    rng = np.random.default_rng(0)
    infos = {mode: env.reset(seed=3)[1] for mode, env in envs.items()}
    for _ in range(6):
        for mode in modes:  # asking for every mode, on every env, leaves each env's own key as it was
            assert [envs[m].anchor_key(mode) for m in modes] == [infos[mode]["anchor_key"]] * len(modes)
            assert envs[mode].anchor_key() == infos[mode]["anchor_key"] and envs[mode].key_mode == mode
        choices = envs["state"].example_actions()
        action = choices[int(rng.integers(len(choices)))] if rng.random() < 0.8 else None
        outs = {mode: env.step(action) for mode, env in envs.items()}
        infos = {mode: out[4] for mode, out in outs.items()}
        if outs["state"][2] or outs["state"][3]:
            break
    with pytest.raises(ValueError, match="unknown key_mode 'states'"):
        envs["state"].anchor_key("states")


def test_num_tasks_is_none_for_procedural_tasks_and_checks_the_split():
    env = make_env("gridnav")
    assert [env.num_tasks(split) for split in env.splits] == [None, None]
    with pytest.raises(ValueError, match=r"gridnav: .*split 'valid'.*\['train', 'test'\]"):
        env.num_tasks("valid")
