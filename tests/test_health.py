"""CPU tests of the training-health alarms (verl_gigpo.rollout.health) on hand-built metric series: the noise rules
(binomial standard errors, warm-up and persistence, early values), de-duplication and cool-down, ignore, missing
values, health.jsonl and the option checks; then the kept benchmark runs (benchmarks/data/collapse*) replayed through
the monitor, on which the defaults were calibrated. The alarms on live local-engine runs are in
tests/test_local_train.py."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_gigpo.rollout.health import SIGNALS, HealthMonitor, HealthOptions, replay, validation_fall


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
    # window 0.02, 0.05, 0.2 -> 0.09 > max(lowest 0.02 + 0.015 + 2 SE (480 steps: 0.018), 2 x 0.02) = 0.053;
    # the window before, 0.03, is not
    assert _raised(monitor) == [("invalid_rise", 7)]
    steady = HealthMonitor(HealthOptions(window=3))  # a steady 5 % with noise: within 2 x its lowest window, none
    _feed(steady, [{**_success(0.2), "env/invalid_action_rate": r} for r in [0.05, 0.04, 0.06, 0.05, 0.07, 0.06] * 3])
    assert steady.alarms == []


def test_entropy_collapse_against_the_early_value_and_missing_iterations():
    # entropy logged every 10th iteration only (verl's bypass mode): windows count logged values, and iterations
    # without the metric leave the signal as it was
    monitor = HealthMonitor(HealthOptions(baseline=2))
    values = [4.0, 4.0, 3.0, 0.2]  # logged at iterations 1, 11, 21, 31: early value 4.0, smoothed 1.6 (not < 1.2)
    lines = []
    for value in values + [0.1, 0.1]:
        lines += [{"actor/entropy": value}] + [{"actor/pg_loss": 0.0}] * 9
    out = _feed(monitor, lines)
    assert _raised(monitor) == [("entropy_collapse", 41)]  # 5th logged value: mean(0.2, 0.1) = 0.15 < 0.3 x 4
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
    root = Path(__file__).resolve().parents[1] / "verl_gigpo" / "config"
    for name in ("gigpo_trainer.yaml", "local_trainer.yaml"):
        trainer = OmegaConf.load(root / name).trainer
        assert HealthOptions.from_trainer(trainer) == HealthOptions(), name  # the yaml says the defaults
    assert HealthOptions.from_trainer({"health": {"ignore": "flat_groups"}}).ignore == ("flat_groups",)


def test_grad_norm_spike_against_the_early_median_with_a_floor_and_non_finite_at_once():
    opts = HealthOptions(window=4, baseline=2)  # early: median of the first 4 nonzero norms; now: mean of the last 2
    tiny = HealthMonitor(opts)  # tiny early norms (0: no signal that iteration): the floor 0.1 makes the bound 1.0
    _feed(tiny, [{"actor/grad_norm": g} for g in [0.0, 0.02, 0.0, 0.05, 0.03, 0.04, 0.4, 0.6, 0.5]])
    assert tiny.alarms == []
    spike = HealthMonitor(opts)  # early median 0.3: bound 3.0; mean(0.4, 12.0) = 6.2 at iteration 8
    out = _feed(spike, [{"actor/grad_norm": g} for g in [0.3, 0.2, 0.4, 0.3, 0.35, 0.3, 0.4, 12.0, float("nan")]])
    assert _raised(spike) == [("grad_norm_spike", 8), ("grad_norm_nonfinite", 9)]
    assert spike.alarms[0].threshold == pytest.approx(3.0) and out[-1]["health/grad_norm_spike"] == 1.0  # nan skipped


def test_length_limit_fires_on_a_rise_above_the_runs_own_early_share_not_on_a_high_share_by_design():
    opts = HealthOptions(window=4)
    by_design = HealthMonitor(opts)  # every reply at the limit from the start, or half of the iterations: no alarm
    _feed(by_design, [{"response_length/clip_ratio": c} for c in [1.0] * 10 + [1.0, 0.0] * 6])
    assert by_design.alarms == []
    rising = HealthMonitor(opts)  # 0.02 early, then 0.3: 0.3 > 0.02 + 0.2 + 2 SE (0.0) from the 8th value
    _feed(rising, [{"response_length/clip_ratio": c} for c in [0.02] * 4 + [0.3] * 6])
    assert _raised(rising) == [("length_limit", 8)]


# ---------------------------------------------------------------- kept runs (benchmarks/data/collapse*, CPU)
KEPT = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
COLLAPSE_ALARMS = ("success_drop", "invalid_rise", "entropy_collapse")
EARLY_WARNINGS = ("invalid_rise", "entropy_collapse")


def _kept(name: str) -> list[dict]:
    """The rows of a kept run (benchmarks/kept_data.py: a header line, then one metrics line per iteration)."""
    with gzip.open(KEPT / name, "rt") as fh:
        return [json.loads(x) for x in fh if x.strip()][1:]


def _first(monitor: HealthMonitor, signals: tuple[str, ...]) -> int | None:
    return min((a.iteration for a in monitor.alarms if a.signal in signals), default=None)


def test_validation_fall_pools_two_validations_against_their_best():
    lines = [{"step": 15 * i, "val/success_rate": v} for i, v in enumerate([0.0, 0.2, 0.25, 0.05, 0.15, 0.05, 0.0])]
    # pooled over 2 validations: 0.1 (step 15), 0.225, 0.15, then 0.1 < 0.225 / 2 at step 60; one low validation
    # (0.05 at step 45) is not a fall
    assert validation_fall(lines) == 60
    assert validation_fall(lines[:4]) is None and validation_fall([{"step": 0, "val/success_rate": 0.3}]) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slow_collapse_kept_runs_warn_before_validation_success_has_fallen_by_half(seed):
    """The local engine at lr 1e-3 on the benchmark's settings (benchmarks/collapse.py, change `none`): each seed
    rises, then validation success falls by half (:func:`validation_fall`: the mean of the last 2 validations, 128
    episodes, below half of its best). An alarm fires before that on every seed; on seeds 0 and 1 it is
    ``invalid_rise``. Seed 2 falls in 10 iterations with no earlier invalid or entropy signal: training success
    (``success_drop``) warns first, and ``entropy_collapse`` follows the fall."""
    rows = _kept(f"collapse/none-seed{seed}.jsonl.gz")
    fall = validation_fall(rows)
    monitor = replay(rows)
    assert fall is not None and _first(monitor, COLLAPSE_ALARMS) < fall
    if seed < 2:
        assert _first(monitor, EARLY_WARNINGS) < fall
    else:
        assert _first(monitor, ("success_drop",)) < fall < _first(monitor, ("entropy_collapse",))


@pytest.mark.parametrize(
    "name", [f"collapse/lr3e-4-seed{s}.jsonl.gz" for s in range(3)] + ["collapse-verl/verl/gigpo-seed0.jsonl.gz"]
)
def test_healthy_kept_runs_raise_no_collapse_alarm(name):
    """lr 3e-4 (each seed at its best at the end) and the verl pipeline's healthy run (replies at the 3-token limit by
    design, tiny early grad norms): no collapse alarm, no length or anchor alarm; only lr3e-4 seed 1's real grad-norm
    spike (6.0 against an early median of 0.23) is reported."""
    rows = _kept(name)
    assert validation_fall(rows) is None
    raised = {a.signal for a in replay(rows).alarms}
    assert raised <= ({"grad_norm_spike"} if "lr3e-4-seed1" in name else set()), raised


def test_the_replay_script_prints_each_kept_runs_fall_and_first_alarms(monkeypatch):
    monkeypatch.syspath_prepend(str(KEPT.parent))
    import health_replay  # benchmarks/health_replay.py

    rows = _kept("collapse/none-seed2.jsonl.gz")
    first = _first(replay(rows), ("success_drop",))
    header, _, line = health_replay.table([KEPT / "collapse/none-seed2.jsonl.gz"], HealthOptions())
    assert header.startswith("| run | validation fell by half |")
    assert line.startswith(f"| collapse/none-seed2 | {validation_fall(rows)} | `success_drop` {first}, ")
