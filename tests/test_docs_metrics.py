"""CPU tests of the metrics table in docs/metrics.md: every metric the trainer mode and the local engine log is
documented, and each row says what it is counted over (per trajectory, per step row, ...) — verl's own rollout
metrics are per step row, which in this package means long episodes weigh more."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
import torch

from verl_gigpo.config import GiGPOConfig
from verl_gigpo.rollout.metrics import TrajectorySummary, type_metrics
from verl_gigpo.rollout.metrics import episode_metrics as episode_metrics_of
from verl_gigpo.verl_glue.trainer import StepBatch, episode_metrics

METRICS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
UNITS = {"trajectory", "step row", "token", "anchor group", "episode group", "batch"}


def metrics_table() -> dict[str, tuple[str, str]]:
    """{metric name pattern: (counted over, meaning)} from the table under "## What each metric counts over"."""
    section = METRICS_PAGE.read_text().split("\n## What each metric counts over\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 3, f"metrics table row needs name | counted over | meaning: {row}"
        for name in re.findall(r"`([^`]+)`", cells[0]):
            table[name] = (cells[1], cells[2])
    return table


def documented(name: str, table: dict[str, tuple[str, str]]) -> str:
    """The `counted over` of the table row whose pattern (``*`` or ``<placeholder>`` wildcards) matches ``name``."""
    matches = [unit for pattern, (unit, _) in table.items() if fnmatch.fnmatch(name, re.sub(r"<[^>]+>", "*", pattern))]
    assert matches, f"{name} is not documented in the metrics table of docs/metrics.md"
    assert len(set(matches)) == 1, f"{name} matches rows of docs/metrics.md that disagree: {matches}"
    return matches[0]


def test_every_row_says_what_it_counts_over():
    table = metrics_table()
    assert len(table) >= 30
    assert {unit for unit, _ in table.values()} <= UNITS


def test_every_metric_the_trainer_mode_logs_is_documented():
    # two trajectories of one task (ALFWorld-style task type), 3 and 1 steps, plus one verl padding row
    uids = ["u0", "u0", "u0", "u0", "pad1"]
    rows = [
        {"traj_id": "t0", "step_id": 0, "anchor_key": "a", "step_reward": 0.0, "action_valid": True, "won": True},
        {"traj_id": "t0", "step_id": 1, "anchor_key": "b", "step_reward": 0.0, "action_valid": False, "won": True},
        {"traj_id": "t0", "step_id": 2, "anchor_key": "c", "step_reward": 1.0, "action_valid": True, "won": True},
        {"traj_id": "t1", "step_id": 0, "anchor_key": "a", "step_reward": 0.0, "action_valid": True, "won": False},
    ]
    rows = [{**r, "env_error": False, "task_type": "pick_and_place", "history_dropped": 0} for r in rows]
    steps = StepBatch.from_rows(uids, [*rows, dict(rows[0])], [False, False, False, False, True])
    env = episode_metrics(steps)
    assert env["env/success_rate"] == 0.5 and env["episode/num_trajectories"] == 2.0  # really counted per trajectory
    stats = steps.advantage_terms(GiGPOConfig(), torch.ones(5, 3)).stats
    table = metrics_table()
    for name in [*env, *stats]:
        documented(name, table)


def test_every_episode_metric_the_local_engine_logs_is_documented():
    # the shared definitions under both namespaces the local engine uses: training (env/, episode/) and validation
    summaries = [
        TrajectorySummary(won=True, length=2, episode_return=1.0, task_type="pick_and_place", batch_rows=2),
        TrajectorySummary(won=False, length=0, episode_return=0.0, env_error=True),
    ]
    table = metrics_table()
    by_type = type_metrics("alfworld", summaries)
    assert set(by_type) == {
        f"val-core/alfworld/pick_and_place/{k}" for k in ("success", "length", "invalid_per_step", "count")
    }
    for metrics in (
        episode_metrics_of(summaries),
        episode_metrics_of(summaries, prefix="val", episode_prefix="val"),
        by_type,
    ):
        for name in metrics:
            documented(name, table)
    assert documented("val/invalid_action_rate", table) == "step row"
    assert documented("val/success_rate", table) == documented("val/return_mean", table) == "trajectory"


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("env/success_rate", "trajectory"),
        ("env/episode_length", "trajectory"),
        ("episode/return_mean", "trajectory"),
        ("val-core/alfworld/acc/mean@1", "trajectory"),
        ("env/invalid_action_rate", "step row"),
        ("env/observation_truncated_rate", "step row"),
        # verl's rollout metrics: one value per training row = per environment step
        ("critic/score/mean", "step row"),
        ("critic/rewards/mean", "step row"),
        ("response_length/mean", "step row"),
        ("num_turns/mean", "step row"),
        ("training/num_turns/mean", "step row"),
    ],
)
def test_per_trajectory_and_per_row_metrics_are_labelled(name, unit):
    assert documented(name, metrics_table()) == unit


def test_num_turns_points_to_the_episode_length():
    """verl's num_turns is 2 on every row of this agent loop; docs/metrics.md says so and names the metric to read."""
    _, meaning = metrics_table()["num_turns/*"]
    assert "always 2" in meaning and "`env/episode_length`" in meaning


def test_every_dynamic_sampling_metric_is_documented():
    """The dynamic/* metrics (one definition for both engines) and the local engine's episode counts."""
    from verl_gigpo.rollout.dynamic import GroupRecord, dynamic_metrics

    records = [GroupRecord("a", 1, True, True, True, 2, 2, 1), GroupRecord("b", 2, False, False, True, 2, 1, 0)]
    metrics = dynamic_metrics(records, {"a", "b"}, target=2)
    assert metrics["dynamic/kept_fraction_round_2"] == 0.0 and metrics["dynamic/short_groups"] == 1
    table = metrics_table()
    for name in [*metrics, "rollout/episodes_played", "rollout/episodes_played_total"]:
        documented(name, table)
    assert documented("dynamic/kept_fraction_round_7", table) == "episode group"
