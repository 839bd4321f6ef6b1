"""Configuration in one place (CPU only, no model): each yaml default equals its settings class's default, checks
declared with the fields name their key, a typo'd key on the command line ends in one line, and deprecated spellings
still work with one warning line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.keys import DEPRECATED_KEYS, GIGPO_YAML, LOCAL_YAML, check_argv, rename_deprecated_tree
from verl_gigpo.config.rules import DEFAULT_GAMMA, KeyValueError
from verl_gigpo.config.sections import LOCAL_DEFAULTS, SECTIONS, section_defaults
from verl_gigpo.config.trainer import HEALTH_SIGNALS, HealthOptions, LocalSettings, UpdateSettings
from verl_gigpo.rollout import health

ROOT = Path(__file__).resolve().parents[1]


def _node(tree: dict, section: str):
    for part in section.split("."):
        tree = (tree or {}).get(part)
    return tree


@pytest.mark.parametrize("path", [GIGPO_YAML, LOCAL_YAML], ids=["gigpo_trainer", "local_trainer"])
def test_yaml_defaults_equal_the_settings_classes_defaults(path):
    tree = yaml.safe_load(path.read_text())
    compared = 0
    for section in SECTIONS:
        node = _node(tree, section)
        if node is None:
            continue
        defaults = section_defaults(section)
        if path == LOCAL_YAML:  # the demo's own defaults, declared with their reason
            defaults.update(
                {k.rsplit(".", 1)[1]: v for k, v in LOCAL_DEFAULTS.items() if k.rsplit(".", 1)[0] == section}
            )
        for key, value in node.items():
            if key not in defaults or value is None or isinstance(value, dict):  # null: taken from another key
                continue
            value = tuple(value) if isinstance(value, list) else value
            assert value == defaults[key], f"{path.name}: {section}.{key}={value!r}, its class says {defaults[key]!r}"
            compared += 1
    assert compared >= 40, f"only {compared} yaml defaults compared: a section lost its class"


def test_gamma_is_defined_once():
    tree = yaml.safe_load(GIGPO_YAML.read_text())
    assert GiGPOConfig().gamma == DEFAULT_GAMMA == tree["algorithm"]["gamma"]
    sources = [p for p in (ROOT / "verl_gigpo").rglob("*.py") if "gamma: float = 0.95" in p.read_text()]
    assert sources == []


def test_health_signals_of_the_settings_are_the_monitors_alarms():
    assert tuple(health._SIGNALS) == HEALTH_SIGNALS


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: GiGPOConfig.from_algorithm({"gigpo": {"step_advantage_w": -1}}),
            "algorithm.gigpo.step_advantage_w=-1",
        ),
        (lambda: GiGPOConfig.from_algorithm({"gamma": 2}), "algorithm.gamma=2 must be a number in [0, 1]"),
        (lambda: GiGPOConfig.from_algorithm({"gigpo": {"norm": "x"}}), "algorithm.gigpo.norm='x' is not a norm"),
        (lambda: GiGPOConfig.from_algorithm({"hgpo": {"std": "x"}}), "algorithm.hgpo.std='x' is not valid"),
        (lambda: HealthOptions(window=0), "trainer.health.window=0 must be a whole number >= 1"),
        (lambda: HealthOptions(action="panic"), "trainer.health.action='panic' must be one of ['warn', 'stop']"),
        (lambda: UpdateSettings(mini_batch_rows=0), "trainer.v1.gigpo_sync.mini_batch_rows=0 must be a whole number"),
    ],
)
def test_a_bad_value_is_one_line_naming_key_value_and_range(build, message):
    with pytest.raises(KeyValueError) as error:
        build()
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)
    assert error.value.key == message.split("=")[0]


def test_the_step_weight_error_names_the_allowed_range():
    with pytest.raises(ValueError, match=r"^algorithm\.gigpo\.step_advantage_w=-1 must be a finite number >= 0"):
        GiGPOConfig.from_algorithm({"gigpo": {"step_advantage_w": -1}})


@pytest.mark.parametrize("plus", ["", "+"])
def test_a_typo_key_to_main_is_one_line_and_exit_2(plus):
    proc = subprocess.run(
        [sys.executable, "-m", "verl_gigpo.main", f"{plus}algorithm.gigpo.step_advantge_w=0.5"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "algorithm.gigpo.step_advantge_w" in lines[0] and "algorithm.gigpo.step_advantage_w" in lines[0]


def test_a_typo_key_to_the_local_engine_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "verl_gigpo.local.train", "trainer.healt.window=3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown config key trainer.healt.window; did you mean trainer.health.window, trainer.health.ignore, "
        "trainer.health.cooldown?"
    ]


def test_verl_keys_and_free_form_keys_pass_the_argv_check():
    argv = ["trainer.total_epochs=3", "data.anything=1", "+env.kwargs.size=7", "platform=cpu", "--cfg", "job"]
    assert check_argv(argv) == argv
    assert check_argv(["env.kwargs.size=7", "trainer.seed=1"], local=True) == ["env.kwargs.size=7", "trainer.seed=1"]
    with pytest.raises(SystemExit) as stop:
        check_argv(["data.train_batch_sise=2"], local=True)  # the local engine's yaml is all of its keys
    assert stop.value.code == 2
    with pytest.raises(SystemExit):  # trainer.* mixes verl's keys and ours: checked against both (verl's yaml found)
        check_argv(["trainer.total_epoch=3"])


def test_deprecated_key_is_renamed_with_one_warning(capsys):
    assert "trainer.health.length_limit_max" in DEPRECATED_KEYS
    assert check_argv(["+trainer.health.length_limit_max=0.3"]) == ["++trainer.health.length_limit_rise=0.3"]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "length_limit_max is deprecated" in warning[0] and "meaning changed" in warning[0]
    assert HealthOptions.from_trainer({"health": {"length_limit_max": 0.4}}).length_limit_rise == 0.4
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    saved = {"trainer": {"health": {"length_limit_max": 0.5}}, "env": {"max_steps": 3}}
    renamed = rename_deprecated_tree(saved)
    assert renamed == {"trainer": {"health": {"length_limit_rise": 0.5}}, "env": {"max_steps": 3}}
    assert saved["trainer"]["health"] == {"length_limit_max": 0.5}  # the caller's mapping is left alone


def test_the_local_engine_reads_a_saved_config_with_the_old_spelling(capsys):
    from verl_gigpo.local.config import load_config

    cfg = load_config(["trainer.health.length_limit_max=0.25"])
    assert cfg.trainer.health.length_limit_rise == 0.25
    cfg = load_config(layers=[{"trainer": {"health": {"length_limit_max": 0.35}}}])
    assert cfg.trainer.health.length_limit_rise == 0.35
    assert capsys.readouterr().err.count("deprecated") == 2


def test_declared_checks_cover_every_number_of_the_moved_settings():
    for cls in (HealthOptions, UpdateSettings, LocalSettings):
        unchecked = [f.name for f in dataclasses.fields(cls) if not f.metadata and f.name != "ignore"]
        assert unchecked == [], f"{cls.__name__}: fields without a declared check: {unchecked}"


def test_the_local_section_is_checked_by_its_declared_fields():
    from verl_gigpo.local.config import load_config

    with pytest.raises(KeyValueError, match=r"^local\.max_batch_size=0 must be a whole number >= 1"):
        load_config(["local.max_batch_size=0"])
    assert load_config(["local.num_threads=2"]).local.num_threads == 2


def test_the_agent_loop_parses_a_config_once_per_process():
    from hydra import compose, initialize_config_module

    from verl_gigpo.verl_glue.agent_loop import loop_settings

    with initialize_config_module("verl_gigpo.config", version_base=None):
        first = compose("gigpo_trainer", overrides=["env.max_steps=7", "trainer.log_episodes=2"])
        second = compose("gigpo_trainer", overrides=["env.max_steps=9"])
    settings = loop_settings(first)
    assert (settings.episode_config.max_steps, settings.episode_options.episodes) == (7, 2)
    assert loop_settings(first) is settings  # every trajectory of the worker: the same parsed settings
    assert loop_settings(second).episode_config.max_steps == 9  # another config object: parsed on its own
