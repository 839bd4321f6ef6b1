"""The registry and the contract checker over EVERY registered environment (a new environment is checked as soon
as it is registered), plus the checker's command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

import environments
from environments import list_envs, make_env
from environments.checker import EnvCheckError, check_env


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


def test_registry_lists_the_five_environments_and_rejects_unknown_names():
    assert {"alfworld", "gridnav", "search", "sokoban", "webshop"} <= set(list_envs())
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
    assert any("parse_action raised" in f for f in info.value.failures)


def test_checker_cli_exits_zero():
    proc = subprocess.run(
        [sys.executable, "-m", "environments.checker", "sokoban", "--seeds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK sokoban")
