"""The step-credit probe (``python -m verl_gigpo.probe``) on real environments, the real estimator and a real tiny
model: anchor groups form on gridnav's state key; a key holding the step index leaves almost every row alone and the
probe says so; its numbers agree with a plain-loop oracle; bad input gets one line naming the option. CPU only."""

from __future__ import annotations

import base64
import json
from collections import defaultdict

import numpy as np
import pytest

from environments import make_env, resolve_env
from environments.gridnav.env import GridNavEnv
from verl_gigpo.probe import (
    CLOSE,
    FRAGMENTED,
    MERGED_MAX,
    KeyModeStats,
    ProbeError,
    ProbeOptions,
    key_mode_stats,
    parse_keys,
    play_model,
    play_random,
    recommend,
    replay_keys,
    run_probe,
    write_report,
)
from verl_gigpo.probe.__main__ import main
from verl_gigpo.rollout.types import EpisodeConfig

GAMMA = 0.95


class StepIndexGridNav(GridNavEnv):
    """gridnav whose state key (so also every ``history:K`` key) holds the step index: the anchor-key extension point
    of :class:`environments.base.TextEnv` (``_state_digest``) used the wrong way, as an observation with a turn
    counter would be."""

    name = "gridnav_stepindex"

    def _state_digest(self) -> str:
        return f"{super()._state_digest()}|step={self._step_count}"


STEP_INDEX_ENV = f"{__name__}:StepIndexGridNav"

#: a big open grid and long episodes: random walkers rarely meet on the same cell at the same step there, so the
#: step-index key repeats across episodes only early on (on the 5x5 demo grid they meet often: about a third of the
#: rows are then alone, against 2% under the state key)
OPEN_GRID = {"size": 16, "walls": 0, "max_steps": 100}


def _oracle(played, mode: str) -> tuple[float, float]:
    """Plain loops over the played episodes: the fraction of rows alone in their (group, key) anchor group, and the
    fraction whose discounted return R_t differs from its anchor group's mean (GiGPO's A_S != 0)."""
    rows = []  # (group, key, R_t)
    offset = 0
    for episode in played.episodes:
        rewards = [s.step_reward for s in episode.steps]
        for t in range(len(rewards)):
            r_t = sum(GAMMA**k * r for k, r in enumerate(rewards[t:]))
            rows.append((episode.group_id, played.keys[mode][offset + t], r_t))
        offset += len(rewards)
    members = defaultdict(list)
    for group, key, r_t in rows:
        members[(group, key)].append(r_t)
    alone = sum(len(members[(g, k)]) == 1 for g, k, _ in rows)
    signal = sum(abs(r - np.mean(members[(g, k)])) > 1e-9 for g, k, r in rows)
    return alone / len(rows), signal / len(rows)


def test_history0_on_gridnav_forms_anchor_groups_and_matches_the_oracle():
    options = ProbeOptions(env="gridnav", groups=6, n=8, keys="history:0,observation,similarity:0.9", seed=0)
    result = run_probe(options)
    by_key = {s.key: s for s in result.stats}
    history0 = by_key["history:0"]
    assert (history0.rows, history0.episode_groups) == (result.rows, 6)  # no failed episode: every row counts
    assert history0.singleton_rows < 0.2  # states repeat across the 8 walks of a task
    assert history0.signal_rows > 0.05
    assert history0.shared_groups_per_group >= 1.0
    played = play_random("gridnav", groups=6, n=8, modes=["history:0"], seed=0)  # the same episodes again
    alone, signal = _oracle(played, "history:0")
    assert history0.singleton_rows == pytest.approx(alone)
    assert history0.signal_rows == pytest.approx(signal)
    assert result.recommendation.verdict == "recommend"
    assert result.recommendation.line.startswith(f"recommended key mode: {result.recommendation.key}")


def test_a_key_with_the_step_index_leaves_almost_every_row_alone_and_the_probe_says_so(tmp_path, capsys):
    common = ["--groups", "6", "-n", "4", "--keys", "state", "--quiet", *(f"{k}={v}" for k, v in OPEN_GRID.items())]
    assert main(["--env", "gridnav", "--out", str(tmp_path / "state"), *common]) == 0
    assert main(["--env", STEP_INDEX_ENV, "--out", str(tmp_path / "step"), *common]) == 0
    printed = capsys.readouterr().out
    state = json.loads((tmp_path / "state" / "summary.json").read_text())
    step = json.loads((tmp_path / "step" / "summary.json").read_text())
    # the same walks (the random policy draws from the same actions with the same seeds), other keys
    assert step["rows"] == state["rows"] and step["success"] == state["success"]
    assert state["success"] > 0  # some walks reach the goal: the state key's groups carry a step signal
    assert state["stats"][0]["singleton_rows"] < 0.2 and state["stats"][0]["signal_rows"] > 0.1
    assert state["recommendation"]["verdict"] == "recommend"
    assert step["stats"][0]["singleton_rows"] >= FRAGMENTED
    assert step["stats"][0]["signal_rows"] < state["stats"][0]["signal_rows"] / 4
    assert step["recommendation"]["verdict"] == "fragmented"
    line = step["recommendation"]["line"]
    assert "state" in line and f"{100 * step['stats'][0]['singleton_rows']:.0f}% of rows are alone" in line
    assert line in printed


def test_flat_and_signal_only_groups_follow_a_plain_loop_and_dynamic_samplings_keep_test():
    """Sokoban charges every move, so groups that all fail still differ in their step returns: the episode filter
    drops them (flat) while the step term has signal there (signal-only). Counted by plain loops over the episodes,
    and the same groups ``algorithm.filter_groups.filter=signal`` keeps beyond ``filter=episode``."""
    options = ProbeOptions(env="sokoban", groups=6, n=4, keys="state", seed=3)
    stats = run_probe(options).stats[0]
    played = play_random("sokoban", groups=6, n=4, modes=["state"], seed=3)
    scores, members, rows = defaultdict(list), defaultdict(list), []
    offset = 0
    for episode in played.episodes:
        rewards = [s.step_reward for s in episode.steps]
        scores[episode.group_id].append(sum(rewards))
        for t in range(len(rewards)):
            r_t = sum(GAMMA**k * r for k, r in enumerate(rewards[t:]))
            key = (episode.group_id, played.keys["state"][offset + t])
            members[key].append(r_t)
            rows.append((key, r_t))
        offset += len(rewards)
    flat = {g for g, s in scores.items() if max(s) - min(s) <= 1e-9 * max(1.0, *map(abs, s))}
    signal = {key[0] for key, r_t in rows if abs(r_t - np.mean(members[key])) > 1e-9}
    assert flat and flat & signal  # the case the probe exists for: nothing for the episode filter, step signal left
    assert stats.flat_groups == pytest.approx(len(flat) / len(scores))
    assert stats.signal_only_groups == pytest.approx(len(flat & signal) / len(scores))


def test_signal_only_groups_without_the_per_step_reward_follow_a_plain_loop():
    """Taking Sokoban's -0.1 a move (the most common step reward) off every reward leaves the signal that comes from
    boxes pushed: fewer signal-only groups, counted by the same plain loops on rewards + 0.1."""
    options = ProbeOptions(env="sokoban", groups=16, n=8, keys="state", seed=0)  # the docs' episodes
    stats = run_probe(options).stats[0]
    played = play_random("sokoban", groups=16, n=8, modes=["state"], seed=0)
    assert stats.step_reward == pytest.approx(-0.1)
    scores, members, rows = defaultdict(list), defaultdict(list), []
    offset = 0
    for episode in played.episodes:
        rewards = [s.step_reward + 0.1 for s in episode.steps]
        scores[episode.group_id].append(sum(rewards))
        for t in range(len(rewards)):
            r_t = sum(GAMMA**k * r for k, r in enumerate(rewards[t:]))
            key = (episode.group_id, played.keys["state"][offset + t])
            members[key].append(r_t)
            rows.append((key, r_t))
        offset += len(rewards)
    flat = {g for g, s in scores.items() if max(s) - min(s) <= 1e-6 * max(1.0, *map(abs, s))}
    signal = {key[0] for key, r_t in rows if max(members[key]) - min(members[key]) > 1e-6}
    assert stats.signal_only_groups_no_step_reward == pytest.approx(len(flat & signal) / len(scores))
    assert 0 < stats.signal_only_groups_no_step_reward < stats.signal_only_groups


def test_merged_rows_count_rows_grouped_with_another_state():
    """Under the step-index environment the observation key (no step index) puts a cell's visits at different steps
    in one anchor group: rows grouped with another state, counted against a plain loop."""
    env = resolve_env(STEP_INDEX_ENV)
    result = run_probe(ProbeOptions(env=env, groups=3, n=4, keys="state,observation"))
    by_key = {s.key: s for s in result.stats}
    assert by_key["state"].merged_rows == 0.0
    played = play_random(env, groups=3, n=4, modes=["state", "observation"], seed=0)
    states = defaultdict(set)
    rows = []
    offset = 0
    for episode in played.episodes:
        for t in range(episode.length):
            key = (episode.group_id, played.keys["observation"][offset + t])
            states[key].add(played.keys["state"][offset + t])
            rows.append(key)
        offset += episode.length
    merged = sum(len(states[key]) > 1 for key in rows) / len(rows)
    assert merged > 0.1
    assert by_key["observation"].merged_rows == pytest.approx(merged)
    assert result.recommendation.key == "state"  # the observation key's extra groups are bought with wrong peers


def test_every_mode_is_read_from_one_play_and_similarity_reads_the_observation_keys():
    played = play_random("sokoban", groups=2, n=3, modes=["state", "observation", "history:1"], seed=4)
    env = make_env("sokoban", key_mode="state")
    first = played.episodes[0]
    env.reset(seed=first.task.seed, options={"split": first.task.split})
    for t, step in enumerate(first.steps):
        assert played.keys["state"][t] == env.anchor_key("state") == step.anchor_key
        assert played.keys["observation"][t] == env.anchor_key("observation")
        assert played.keys["history:1"][t] == env.anchor_key("history:1")
        env.step(step.action)
    specs = parse_keys("similarity:0.9,observation")
    assert [(s.env_mode, s.similarity_threshold) for s in specs] == [("observation", 0.9), ("observation", None)]
    config = specs[0].gigpo_config()
    assert (config.key_mode, config.similarity_threshold, config.env_key_mode) == ("similarity", 0.9, "observation")


def _plain_random_episode(env, task, rng, penalty):
    """The oracle: one episode of uniformly drawn example actions as a plain loop over the environment, with every
    mode's key read before each step: ``(steps as (action, valid, step reward, won, state key), keys)``."""
    env.reset(seed=task.seed, options={"split": task.split})
    steps, keys = [], []
    while True:
        choices = env.example_actions()
        action = choices[int(rng.integers(len(choices)))]
        keys.append((env.anchor_key("state"), env.anchor_key("observation")))
        _, reward, terminated, truncated, info = env.step(action)
        valid = bool(info["action_valid"])
        steps.append((action, valid, float(reward) - (0.0 if valid else penalty), bool(info["won"]), keys[-1][0]))
        if terminated or truncated:
            return steps, keys


@pytest.mark.parametrize(("env_name", "seed"), [("gridnav", 0), ("sokoban", 3), ("webshop", 1)])
def test_random_play_through_the_episode_runner_is_the_plain_loop(env_name, seed):
    """The random policy plays through the engines' episode runner (``run_episode``): the same episodes, step for
    step, and the same keys of every mode as a plain loop over the environment with the same draws."""
    played = play_random(env_name, groups=3, n=3, modes=["state", "observation"], seed=seed)
    env = make_env(env_name, key_mode="state")
    penalty = EpisodeConfig().invalid_action_penalty
    offset = 0
    for i, episode in enumerate(played.episodes):
        g, k = divmod(i, 3)
        steps, keys = _plain_random_episode(env, episode.task, np.random.default_rng([seed, g, k]), penalty)
        got = [(s.action, s.action_valid, s.step_reward, s.won, s.anchor_key) for s in episode.steps]
        assert got == steps, episode.traj_id
        rows = slice(offset, offset + len(steps))
        assert list(zip(played.keys["state"][rows], played.keys["observation"][rows], strict=True)) == keys
        assert episode.won == steps[-1][3] and episode.episode_return == pytest.approx(sum(s[2] for s in steps))
        assert episode.steps[0].prompt_text  # the runner rendered the prompt a model would have seen
        offset += len(steps)
    env.close()


def test_random_play_is_reproducible_per_seed():
    a = play_random("gridnav", groups=3, n=4, modes=["state"], seed=7)
    b = play_random("gridnav", groups=3, n=4, modes=["state"], seed=7)
    c = play_random("gridnav", groups=3, n=4, modes=["state"], seed=8)
    actions = [[[s.action for s in ep.steps] for ep in p.episodes] for p in (a, b, c)]
    assert actions[0] == actions[1] and actions[0] != actions[2]
    assert list(a.keys["state"]) == list(b.keys["state"])
    assert [ep.group_id for ep in a.episodes] == [f"task{g}" for g in range(3) for _ in range(4)]


def test_model_episodes_are_replayed_for_every_key_and_a_replay_that_differs_is_refused(tiny_model_dir):
    played = play_model(tiny_model_dir, "gridnav", groups=2, n=2, modes=["state", "history:1"], seed=0)
    assert played.policy.startswith(f"model {tiny_model_dir}") and len(played.episodes) == 4
    recorded = [s.anchor_key for ep in played.episodes for s in ep.steps]
    assert list(played.keys["state"]) == recorded  # the replay met every recorded key (the rollout's key mode)
    assert len(played.keys["history:1"]) == len(played.steps) == len(recorded)
    assert all(s.response_ids for ep in played.episodes for s in ep.steps)  # the model answered every step
    history = key_mode_stats(
        played.steps, played.keys["history:1"], parse_keys("history:1")[0], state_keys=played.keys["state"]
    )
    assert (history.rows, history.episode_groups, history.merged_rows) == (len(recorded), 2, 0.0)
    episode = played.episodes[0]
    episode.steps[0].env_reward += 1.0
    config = EpisodeConfig(max_steps=played.max_steps, key_mode="state")
    with pytest.raises(ProbeError, match=r"step 0: reward 0\.0 where the episode got 1\.0"):
        replay_keys([episode], ["state"], config)


def test_report_files_and_the_page_embeds_the_chart(tmp_path):
    result = run_probe(ProbeOptions(env="gridnav", groups=2, n=4, keys="state,history:2"))
    report = write_report(result, tmp_path / "out", command="python -m verl_gigpo.probe --groups 2 -n 4")
    summary = json.loads(report.summary.read_text())
    assert [s["key"] for s in summary["stats"]] == ["state", "history:2"]
    assert summary["stats"][0]["signal_rows"] == result.stats[0].signal_rows
    assert summary["recommendation"]["line"] == result.recommendation.line
    table = report.table.read_text()
    assert "| `history:2` |" in table and result.recommendation.line in table
    page = report.html.read_text()
    embedded = page.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(embedded) == report.plot.read_bytes()
    assert report.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"--out .*out: .*probe summary"):
        write_report(result, tmp_path / "out")


def _stats(key: str, signal: float, singleton: float = 0.1, merged: float = 0.0) -> KeyModeStats:
    return KeyModeStats(key, 100, 10, 5.0, 3.0, singleton, signal, merged, 0.5, 0.1)


def test_the_recommendation_rule():
    specs = parse_keys("similarity:0.8,observation,state,history:1")
    # within CLOSE of the most: the exact state key wins over similarity and observation
    close = [
        _stats("similarity:0.8", 0.40),
        _stats("observation", 0.40 - CLOSE / 2),
        _stats("state", 0.39),
        _stats("history:1", 0.2),
    ]
    verdict = recommend(close, specs)
    assert (verdict.key, verdict.verdict) == ("state", "recommend")
    assert "similarity:0.8: 40.0%" in verdict.line and "exact keys are preferred" in verdict.line
    # a clear winner beyond CLOSE is taken whatever its kind
    clear = [_stats("similarity:0.8", 0.40), _stats("observation", 0.30), _stats("state", 0.30), _stats("history:1", 0)]
    assert recommend(clear, specs).key == "similarity:0.8"
    # a mode that compares actions across different states is left out, and the line says why
    merging = [_stats("similarity:0.8", 0.60, merged=0.3), _stats("observation", 0.30, merged=MERGED_MAX)]
    merging += [_stats("state", 0.25), _stats("history:1", 0.1)]
    verdict = recommend(merging, specs)
    assert verdict.key == "observation"  # MERGED_MAX itself still counts as keeping states apart
    assert "similarity:0.8 reaches 60% but puts 30% of its rows in a group with another state" in verdict.line
    # no step signal anywhere
    flat = [_stats(s.name, 0.0) for s in specs]
    assert recommend(flat, specs).verdict == "no_signal"
    # almost every row alone even in the chosen mode
    alone = [_stats(s.name, 0.02, singleton=0.95) for s in specs]
    assert recommend(alone, specs).verdict == "fragmented"


@pytest.mark.parametrize(
    ("argv", "named", "value"),
    [
        (["--env", "nosuchenv"], "--env", "nosuchenv"),
        (["--keys", "state,bogus"], "--keys", "bogus"),
        (["--keys", "similarity:1.5"], "--keys", "1.5"),
        (["--groups", "0"], "--groups", "0"),
        (["-n", "0"], "-n", "0"),
        (["--method", "ppo"], "--method", "ppo"),
        (["key_mode=state"], "--keys", "key_mode"),
        (["--set", "trainer.seed=1"], "--set", "--model"),
        (["--split", "nosplit"], "--split", "nosplit"),
        (["size=2"], "size=2", "size must be an int in [3, 64]"),
        (["sizee=7"], "sizee=7", "unexpected keyword argument 'sizee'"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(argv, named, value, tmp_path, capsys):
    try:  # argparse and the option checks exit; what only the environment can check is returned
        status = main([*argv, "--out", str(tmp_path / "out"), "--quiet"])
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert named in err and value in err
    assert not (tmp_path / "out").exists()
