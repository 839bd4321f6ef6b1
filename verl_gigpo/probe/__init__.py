"""Will step credit help here? Play episode groups of an environment and measure, for each anchor-key mode, how much
of the batch GiGPO's step term would reach, before training.

    python -m verl_gigpo.probe --env gridnav --groups 16 -n 8                      # random valid actions
    python -m verl_gigpo.probe --env gridnav --model artifacts/tiny-model         # a model, on the local engine

Modules: :mod:`.play` (episodes, keys), :mod:`.keys` (the modes), :mod:`.stats` (numbers, recommendation),
:mod:`.report` (table, ``summary.json``, chart, page), :mod:`.run` (end to end). docs/probe.md has the options,
the rules and what the numbers mean.
"""

from verl_gigpo.probe.keys import DEFAULT_KEYS, KeySpec, parse_keys
from verl_gigpo.probe.play import PROBE_STREAM, PlayedEpisodes, ProbeError, play_model, play_random, replay_keys
from verl_gigpo.probe.report import ProbeReport, headline, markdown_table, plot_probe, write_report
from verl_gigpo.probe.run import ProbeOptions, ProbeResult, run_probe
from verl_gigpo.probe.stats import (
    CLOSE,
    FRAGMENTED,
    MERGED_MAX,
    KeyModeStats,
    Recommendation,
    key_mode_stats,
    recommend,
)

__all__ = [
    "CLOSE",
    "DEFAULT_KEYS",
    "FRAGMENTED",
    "MERGED_MAX",
    "PROBE_STREAM",
    "KeyModeStats",
    "KeySpec",
    "PlayedEpisodes",
    "ProbeError",
    "ProbeOptions",
    "ProbeReport",
    "ProbeResult",
    "Recommendation",
    "headline",
    "key_mode_stats",
    "markdown_table",
    "parse_keys",
    "play_model",
    "play_random",
    "plot_probe",
    "recommend",
    "replay_keys",
    "run_probe",
    "write_report",
]
