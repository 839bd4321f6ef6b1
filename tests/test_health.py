"""CPU tests of the training-health alarms (verl_gigpo.rollout.health) on hand-built metric series: the noise rules
(binomial standard errors, warm-up and persistence, early values), de-duplication and cool-down, ignore, missing
values, health.jsonl and the option checks. The alarms on real local-engine runs are in tests/test_local_train.py."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from verl_gigpo.rollout.health import SIGNALS, HealthMonitor, HealthOptions


def _feed(monitor: HealthMonitor, lines: list[dict[str, float]]) -> list[dict[str, float]]:
    return [monitor.observe(i, line) for i, line in enumerate(lines, start=1)]


def _raised(monitor: HealthMonitor) -> list[tuple[str, int]]:
    return [(a.signal, a.iteration) for a in monitor.alarms]


def _success(p: float, n: int = 32) -> dict[str, float]:
    return {"env/success_rate": p, "episode/num_trajectories": float(n), "env/episode_length": 5.0}


def test_success_drop_needs_half_the_best_lost_beyond_two_standard_errors():
    opts = HealthOptions(window=4)  # success_drop 0.5: alarm below half the best window, minus 2 SE
    # 4 x 32 episodes at 0.5, then 0.4 -> none
    noisy = HealthMonitor(opts)
    _feed(noisy, [_success(0.5)] * 4 + [_success(0.4)] * 8)
    assert noisy.alarms == []
    # a fall to 0.1: the window (0.5, 0.1, 0.1, 0.1) = 0.2 is above 0.25 - 2 SE = 0.137; (0.1 x 4) is below 0.147
    falling = HealthMonitor(opts)
    _feed(falling, [_success(0.5)] * 4 + [_success(0.1)] * 8)
    (alarm,) = falling.alarms
    assert alarm.signal == "success_drop" and alarm.iteration == alarm.since == 8
    best, now, n = 0.5, 0.1, 128  # the best window (4 x 0.5) and the current one, 128 episodes each
    assert alarm.value == pytest.approx(now)
    assert alarm.threshold == pytest.approx(best / 2 - 2 * math.sqrt((best * (1 - best) + now * (1 - now)) / n))
    assert "since iteration 8" in alarm.message and "binomial" in alarm.message


def test_invalid_replies_climbing_against_their_lowest_window():
    monitor = HealthMonitor(HealthOptions(window=3))
    lines = [{**_success(0.2), "env/invalid_action_rate": r} for r in [0.02] * 5 + [0.05, 0.2, 0.3, 0.3]]
    _feed(monitor, lines)
    # window 0.02, 0.05, 0.2 -> 0.09 > max(lowest 0.02 + 0.005 + 2 SE (480 steps: 0.018), 2 x 0.02) = 0.043;
    # the window before, 0.03, is not
    assert _raised(monitor) == [("invalid_rise", 7)]
    steady = HealthMonitor(HealthOptions(window=3))  # a steady 5 % with noise: within 2 x its lowest window, none
    _feed(steady, [{**_success(0.2), "env/invalid_action_rate": r} for r in [0.05, 0.04, 0.06, 0.05, 0.07, 0.06] * 3])
    assert steady.alarms == []


def test_entropy_collapse_against_the_early_value_and_missing_iterations():
    # entropy logged every 10th iteration only (verl's bypass mode): windows count logged values, and iterations
    # without the metric leave the signal as it was
    monitor = HealthMonitor(HealthOptions(baseline=2))
    values = [4.0, 4.0, 3.0, 0.2]  # logged at iterations 1, 11, 21, 31: early value 4.0, smoothed 1.6 (not < 0.4)
    lines = []
    for value in values + [0.1, 0.1]:
        lines += [{"actor/entropy": value}] + [{"actor/pg_loss": 0.0}] * 9
    out = _feed(monitor, lines)
    assert _raised(monitor) == [("entropy_collapse", 41)]  # 5th logged value: mean(0.2, 0.1) = 0.15 < 0.4
    assert [o["health/entropy_collapse"] for o in out[29:32]] == [0.0, 0.0, 0.0]
    assert [o["health/entropy_collapse"] for o in out[39:42]] == [0.0, 1.0, 1.0]
    assert out[45]["health/entropy_collapse"] == 1.0  # no entropy at iteration 46: still active


def test_anchor_signals_wait_for_the_warm_up_and_persist():
    opts = HealthOptions(window=5, warmup=8)
    flat = HealthMonitor(opts)
    out = _feed(flat, [{"gigpo/frac_zero_std_episode_groups": 1.0}] * 12)
    assert _raised(flat) == [("flat_groups", 9)]  # not before iteration warmup + 1
    assert [o["health/flat_groups"] for o in out[7:10]] == [0.0, 1.0, 1.0]
    broken = HealthMonitor(opts)  # one group with signal inside the window: no alarm
    _feed(broken, [{"gigpo/frac_zero_std_episode_groups": 1.0}] * 10 + [{"gigpo/frac_zero_std_episode_groups": 0.5}])
    assert broken.alarms[-1].iteration == 9 and broken.observe(12, {"gigpo/frac_zero_std_episode_groups": 1.0}) == {
        **{f"health/{s}": 0.0 for s in SIGNALS},
        "health/alarms": 0.0,
        "health/alarms_total": 1.0,
    }
    probe = HealthMonitor(HealthOptions(window=3, warmup=0))
    _feed(probe, [{"gigpo/frac_singleton_step_groups": 0.99, "gigpo/frac_rows_nonzero_step_adv": 0.0}] * 3)
    assert sorted(_raised(probe)) == [("no_step_signal", 3), ("singleton_anchors", 3)]
    assert "python -m verl_gigpo.probe" in probe.alarms[0].message


def test_alarms_deduplicate_cool_down_and_can_be_ignored(tmp_path):
    line = {"actor/grad_norm": float("nan"), "actor/ppo_kl": 3.0}
    monitor = HealthMonitor(HealthOptions(cooldown=5, ignore=("kl_spike",)), run_dir=tmp_path)
    out = _feed(monitor, [line] * 7)
    # raised at 1, silent while active within the cool-down, raised again at 6; kl_spike never (ignored)
    assert _raised(monitor) == [("grad_norm_nonfinite", 1), ("grad_norm_nonfinite", 6)]
    assert [o["health/alarms"] for o in out] == [1.0, 0, 0, 0, 0, 1.0, 0]
    assert "health/kl_spike" not in out[0] and out[-1]["health/alarms_total"] == 2.0
    records = [json.loads(x) for x in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert [(r["signal"], r["iteration"], r["since"], r["action"]) for r in records] == [
        ("grad_norm_nonfinite", 1, 1, "warn"),
        ("grad_norm_nonfinite", 6, 1, "warn"),
    ]
    assert (
        monitor.summary() == "health: 2 alarm(s): grad_norm_nonfinite (iteration 1), grad_norm_nonfinite (iteration 6)"
    )
    assert not monitor.stop_requested


def test_kl_is_the_kl_loss_when_configured_and_stop_is_requested():
    monitor = HealthMonitor(HealthOptions(action="stop"), kl_key="actor/kl_loss")
    monitor.observe(1, {"actor/ppo_kl": 5.0, "actor/kl_loss": 0.4})
    assert monitor.alarms == [] and not monitor.stop_requested
    monitor.observe(2, {"actor/ppo_kl": 0.0, "actor/kl_loss": 2.3})  # mean of 0.4, 2.3 > 1
    assert _raised(monitor) == [("kl_spike", 2)] and monitor.stop_requested
    replayed = HealthMonitor(HealthOptions(action="stop"), kl_key="actor/kl_loss")
    for i, line in enumerate([{"actor/kl_loss": 0.4}, {"actor/kl_loss": 2.3}], start=1):
        replayed.observe(i, line, replay=True)  # a resumed run re-reading its history: state, no stop, no file
    assert _raised(replayed) == [("kl_spike", 2)] and not replayed.stop_requested
    assert HealthMonitor(HealthOptions(enable=False)).observe(1, {"actor/grad_norm": float("inf")}) == {}


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"action": "halt"}, r"trainer.health.action='halt'"),
        ({"ignore": ["entropy"]}, r"trainer.health.ignore=\['entropy'\].*entropy_collapse"),
        ({"window": 0}, r"trainer.health.window=0"),
        ({"flat_max": 1.5}, r"trainer.health.flat_max=1.5"),
        ({"kl_max": 0}, r"trainer.health.kl_max=0"),
        ({"windows": 3}, r"unknown key.*windows"),
    ],
)
def test_options_name_the_bad_key(section, match):
    with pytest.raises(ValueError, match=match):
        HealthOptions.from_trainer(OmegaConf.create({"health": section}))


def test_options_read_from_both_yaml_configs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "verl_gigpo" / "config"
    for name in ("gigpo_trainer.yaml", "local_trainer.yaml"):
        trainer = OmegaConf.load(root / name).trainer
        assert HealthOptions.from_trainer(trainer) == HealthOptions(), name  # the yaml says the defaults
    assert HealthOptions.from_trainer({"health": {"ignore": "flat_groups"}}).ignore == ("flat_groups",)
