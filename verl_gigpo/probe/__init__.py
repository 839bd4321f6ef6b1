"""Will step credit help here? Play episode groups of an environment and measure, for each anchor-key mode, how much
of the batch GiGPO's step term would reach, before training.

    python -m verl_gigpo.probe --env gridnav --groups 16 -n 8                      # random valid actions
    python -m verl_gigpo.probe --env sokoban --keys state,observation,history:1 max_steps=30
    python -m verl_gigpo.probe --env alfworld data_path=DIR --groups 8 -n 8
    python -m verl_gigpo.probe --env gridnav --model artifacts/tiny-model \
        --set actor_rollout_ref.rollout.temperature=0.7                           # a model, on the local engine
    python -m verl_gigpo.probe --env my_envs.counter:CounterEnv                   # your own environment

It plays ``--groups`` tasks (seeds ``0 ..``) ``-n`` times each, once, with the environment's own random valid actions
or with ``--model`` on the local engine (:mod:`.play`); reads every key mode's anchor keys from the same states
(:mod:`.keys`: ``observation``, ``state``, ``history:K``, ``similarity:T``); computes the configured estimator's terms
under each mode (:mod:`.stats`); and reports per mode the anchor groups per episode group, the rows alone in their
anchor group, the rows with a nonzero step term, and the episode groups an episode filter would drop although the
step term has signal there; then recommends a mode in one line. It prints the table and writes ``summary.json``,
``table.md``, ``probe.png`` and ``probe.html`` into ``--out`` (default ``runs/probe/<env>``, numbered ``-2``, ``-3``
... when taken) (:mod:`.report`). docs/probe.md has the rules and what the numbers mean.
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
