"""Dynamic sampling (CPU): the one keep test on hand-made groups (:func:`verl_gigpo.rollout.dynamic.group_signal`),
the options (``algorithm.filter_groups``), the rounds' bookkeeping, and the local engine playing rounds of fresh
tasks on a tiny real model and the real gridnav environment. The same decisions from verl's rows and the local
engine's are checked in tests/test_cross_engine.py."""

from __future__ import annotations

import numpy as np
import pytest

from verl_gigpo.config import GiGPOConfig
from verl_gigpo.local.train import LocalTrainer, load_config
from verl_gigpo.probe.play import play_random
from verl_gigpo.rollout.dynamic import DynamicRounds, DynamicSampling, group_signal
from verl_gigpo.rollout.rows import episode_rows
from verl_gigpo.rollout.step_rows import StepBatch


def _traj(group, traj, rewards, keys, *, valid=None, won=False, env_error=False, env_rewards=None):
    """The extra_fields of one trajectory's rows (verl's agent-loop fields), with its group id per row."""
    valid = [True] * len(rewards) if valid is None else valid
    env_rewards = rewards if env_rewards is None else env_rewards
    return [
        (
            group,
            {
                "traj_id": traj,
                "step_id": t,
                "anchor_key": key,
                "step_reward": float(r),
                "env_reward": float(e),
                "action_valid": ok,
                "won": won,
                "env_error": env_error,
            },
        )
        for t, (r, e, key, ok) in enumerate(zip(rewards, env_rewards, keys, valid, strict=True))
    ]


def _batch(*trajectories, padding=0):
    """A StepBatch from verl-style rows of the given trajectories, plus ``padding`` verl padding rows."""
    rows = [row for traj in trajectories for row in traj]
    uids = [g for g, _ in rows] + [f"pad{i}" for i in range(padding)]
    fields = [f for _, f in rows] + [dict(rows[0][1]) for _ in range(padding)]
    return StepBatch.from_rows(uids, fields, [False] * len(rows) + [True] * padding)


def _decisions(signal):
    """{group id: (episode, step, keep)} of a GroupSignal."""
    return {
        str(g): (bool(e), bool(s), bool(k))
        for g, e, s, k in zip(signal.group_ids, signal.episode, signal.step, signal.keep, strict=True)
    }


GIGPO = GiGPOConfig(gamma=0.95)
#: an all-fail group: equal returns (-0.1 each: one invalid reply), both start in s0, but the penalty comes at
#: different steps, so R_0 differs in the anchor group of s0 (-0.095 vs -0.1): GiGPO's step term is nonzero
ALL_FAIL_SHARED = (
    _traj("fail", "f0", [0.0, -0.1], ["s0", "s1"], valid=[True, False]),
    _traj("fail", "f1", [-0.1, 0.0], ["s0", "s2"], valid=[False, True]),
)
#: the same rewards with no state in common: every anchor group is a singleton, the step term is 0
ALL_FAIL_DISJOINT = (
    _traj("apart", "a0", [0.0, -0.1], ["a0", "a1"], valid=[True, False]),
    _traj("apart", "a1", [-0.1, 0.0], ["b0", "b1"], valid=[False, True]),
)
#: an all-success group: both win (return 1), in 2 and 3 steps from s0: R_0 = 0.95 vs 0.9025
ALL_WIN = (
    _traj("win", "w0", [0.0, 1.0], ["s0", "s1"], won=True),
    _traj("win", "w1", [0.0, 0.0, 1.0], ["s0", "s2", "s1"], won=True),
)
#: mixed outcomes: the episode term alone keeps it
MIXED = (
    _traj("mixed", "m0", [0.0, 1.0], ["s0", "s1"], won=True),
    _traj("mixed", "m1", [0.0, 0.0], ["s0", "s3"]),
)


def test_an_all_fail_group_with_differing_step_returns_is_kept_by_signal_only():
    steps = _batch(*ALL_FAIL_SHARED, *ALL_FAIL_DISJOINT, *ALL_WIN, *MIXED)
    by_episode = group_signal(steps, "episode", GIGPO)
    by_signal = group_signal(steps, "signal", GIGPO)
    assert _decisions(by_episode) == {
        "fail": (False, True, False),
        "apart": (False, False, False),
        "win": (False, True, False),
        "mixed": (True, True, True),
    }
    assert _decisions(by_signal) == {
        "fail": (False, True, True),
        "apart": (False, False, False),
        "win": (False, True, True),
        "mixed": (True, True, True),
    }
    assert by_signal.kept() == ["fail", "win", "mixed"] and by_episode.kept() == ["mixed"]
    assert by_signal.step_only.tolist() == [True, False, True, False]
    assert by_episode.dropped_with_step_signal.tolist() == [True, False, True, False]
    # the step test is the estimator's own step term: GiGPO's A_S is nonzero exactly on the rows of s0's anchor groups
    terms = steps.advantage_terms(GIGPO)
    moving = sorted({str(k) for k in steps.anchor_keys[np.abs(terms.step_adv) > 0]})
    assert moving == ["s0"]


def test_each_successor_is_judged_by_its_own_step_term():
    """GraphGPO's step term is 0 in a group without a win (A_G needs a path to SUCCESS): the all-fail group that
    GiGPO's anchor groups keep is dropped under graphgpo; the all-success group is kept by both."""
    steps = _batch(*ALL_FAIL_SHARED, *ALL_WIN)
    graph = GiGPOConfig(method="graphgpo")
    assert _decisions(group_signal(steps, "signal", graph)) == {
        "fail": (False, False, False),
        "win": (False, True, True),
    }
    hgpo = GiGPOConfig(method="hgpo")
    assert _decisions(group_signal(steps, "signal", hgpo))["fail"] == (False, True, True)


def test_the_episode_score_follows_the_penalty_mode():
    """One invalid reply: with penalty_mode=reward the returns differ (-0.1 vs 0), so the episode filter keeps the
    group; with reference the environment's returns are compared (0 and 0, the reference's episode_rewards), so it
    drops it, while the step term (R_t minus the row's own penalty) still has signal."""
    group = (
        _traj("g", "p0", [0.0, -0.1], ["s0", "s1"], valid=[True, False], env_rewards=[0.0, 0.0]),
        _traj("g", "p1", [0.0, 0.0], ["s0", "s1"]),
    )
    steps = _batch(*group)
    reward = GiGPOConfig(episode_stats="step")
    reference = GiGPOConfig(episode_stats="step", penalty_mode="reference", invalid_action_penalty=0.1)
    assert _decisions(group_signal(steps, "episode", reward)) == {"g": (True, True, True)}
    assert _decisions(group_signal(steps, "episode", reference)) == {"g": (False, True, False)}
    assert _decisions(group_signal(steps, "signal", reference)) == {"g": (False, True, True)}
    # an outcome estimator (grpo, rloo): no step term; the mode comes from env.invalid_action_penalty_mode
    assert _decisions(group_signal(steps, "episode", penalty_mode="reward")) == {"g": (True, False, True)}
    assert _decisions(group_signal(steps, "episode", penalty_mode="reference")) == {"g": (False, False, False)}
    with pytest.raises(ValueError, match="filter=signal needs"):
        group_signal(steps, "signal")
    with pytest.raises(ValueError, match="filter='both'"):
        group_signal(steps, "both", GIGPO)


def test_returns_equal_up_to_rounding_count_as_equal():
    """0.1 + 0.2 + 0.3 and 0.3 + 0.2 + 0.1 differ by one ulp in float64: not a signal; 1e-6 apart is one."""
    steps = _batch(
        _traj("round", "r0", [0.1, 0.2, 0.3], ["x0", "x1", "x2"]),
        _traj("round", "r1", [0.3, 0.2, 0.1], ["y0", "y1", "y2"]),
        _traj("tiny", "t0", [1.0], ["z0"]),
        _traj("tiny", "t1", [1.0 + 1e-6], ["z1"]),
    )
    _, returns, _ = steps.trajectory_scores()
    assert returns[0] != returns[1]  # the rounding is really there
    assert _decisions(group_signal(steps, "signal", GIGPO)) == {
        "round": (False, False, False),
        "tiny": (True, False, True),
    }


def test_an_all_fail_group_whose_episode_term_holds_only_penalties_is_kept_by_signal():
    """penalty_mode=reference: every episode fails (environment reward 0), one of six replies is invalid. The
    episode filter compares the environment's returns (0 and 0) and drops the group; the estimator's episode term
    normalises each row's R(tau) - p_t over the group's rows: -2.04 on the invalid row, +0.41 on the five others, so
    ``signal`` keeps it. No state recurs: the step term is 0 and the episode term alone decides."""
    group = (
        _traj("pen", "q0", [0.0, 0.0, -0.1], ["a0", "a1", "a2"], valid=[True, True, False], env_rewards=[0.0] * 3),
        _traj("pen", "q1", [0.0, 0.0, 0.0], ["b0", "b1", "b2"]),
    )
    steps = _batch(*group)
    reference = GiGPOConfig(episode_stats="step", penalty_mode="reference", invalid_action_penalty=0.1)
    terms = steps.advantage_terms(reference)
    np.testing.assert_allclose(terms.episode_adv, [0.4082, 0.4082, -2.0412, 0.4082, 0.4082, 0.4082], atol=1e-4)
    assert not terms.step_adv.any()
    by_episode = group_signal(steps, "episode", reference)
    by_signal = group_signal(steps, "signal", reference)
    assert _decisions(by_episode) == {"pen": (False, False, False)}
    assert _decisions(by_signal) == {"pen": (False, False, True)}
    assert by_signal.episode_term.tolist() == [True] and by_episode.dropped_with_step_signal.tolist() == [True]
    # penalty_mode=reward: the penalty is in r_t, the returns differ (-0.1 vs 0), the episode filter keeps it too
    reward = GiGPOConfig(episode_stats="step")
    assert _decisions(group_signal(steps, "episode", reward)) == {"pen": (True, False, True)}


def _straddling_float32_rounding() -> tuple[float, float]:
    """Two float64 rewards two ulps apart that a float32 cast puts one float32 ulp (7.5e-9) apart."""
    lo = float(np.float32(0.1))
    mid = (lo + float(np.nextafter(np.float32(0.1), np.float32(1)))) / 2  # a float32 rounding boundary, exact in f64
    return float(np.nextafter(mid, 0.0)), float(np.nextafter(mid, 1.0))


def test_a_group_that_differs_only_by_rounding_is_dropped_and_a_real_difference_kept():
    """The step test reads the spread of R_t in each anchor group before normalising, scaled to the data, not the
    normalised term: after mean_std a difference of 1e-9 divided by (std + 1e-6) is ~1e-3 (gamma 1, mean_std)."""
    below, above = _straddling_float32_rounding()
    assert np.float32(below) != np.float32(above)  # a float32 round trip would turn 3e-17 into 7.5e-9
    steps = _batch(
        # R_0 = 0.1 + 0.2 (0.30000000000000004) against 0.3; episode returns the same two numbers
        _traj("sum", "s0", [0.1, 0.2], ["s0", "x1"]),
        _traj("sum", "s1", [0.3, 0.0], ["s0", "y1"]),
        # rewards on either side of a float32 rounding boundary
        _traj("f32", "t0", [below], ["s0"]),
        _traj("f32", "t1", [above], ["s0"]),
        # an environment that computed one reward in float32: 0.1 against float32(0.1) = 0.10000000149
        _traj("res", "u0", [0.1], ["s0"]),
        _traj("res", "u1", [float(np.float32(0.1))], ["s0"]),
        # a real difference of 0.01 in R_1 at the shared state s1; episode returns equal up to rounding
        _traj("real", "v0", [0.2, 0.1], ["x0", "s1"]),
        _traj("real", "v1", [0.19, 0.11], ["y0", "s1"]),
    )
    gigpo = GiGPOConfig(gamma=1.0, norm="mean_std")
    assert _decisions(group_signal(steps, "signal", gigpo)) == {
        "sum": (False, False, False),
        "f32": (False, False, False),
        "res": (False, False, False),
        "real": (False, True, True),
    }
    terms = steps.advantage_terms(gigpo)
    assert terms.step_return[0] != terms.step_return[2]  # the rounding reaches R_t, the test sees past it
    assert terms.step_return[4] != terms.step_return[5] and terms.step_return[6] != terms.step_return[7]
    np.testing.assert_allclose(terms.step_adv[[9, 11]], [-0.7071, 0.7071], atol=1e-4)  # the real one: O(1)


class _SeenRewards(GiGPOConfig):
    """GiGPOConfig that records the reward arrays it is called with, then runs the estimator unchanged."""

    seen: list = []

    def estimate(self, rows, *, env_rewards=None):
        self.seen.append((rows.step_rewards, env_rewards))
        return super().estimate(rows, env_rewards=env_rewards)


@pytest.mark.parametrize("mode", ["reward", "reference"])
def test_rewards_reach_the_estimator_in_float64(mode):
    """Real Sokoban episodes (random valid moves; -0.1 a move, which float32 cannot hold): the step rows of both
    engines carry float64 rewards into the estimator, and R_t is the float64 discounted sum of the played rewards."""
    played = play_random("sokoban", groups=2, n=3, modes=["state"], seed=1, env_kwargs={"max_steps": 6})
    local = played.steps  # the local engine's StepBatch.from_episodes
    rows = [r.fields for ep in played.episodes for r in episode_rows(ep)]
    verl = StepBatch.from_rows([str(g) for g in local.group_ids], rows, [False] * len(rows))  # verl's trainer mode
    config = _SeenRewards(gamma=0.9, episode_stats="step", penalty_mode=mode, invalid_action_penalty=0.1)
    for steps in (local, verl):
        config.seen.clear()
        terms = steps.advantage_terms(config)
        ((step_rewards, env_rewards),) = config.seen
        assert step_rewards.dtype == np.float64 and env_rewards.dtype == np.float64
        np.testing.assert_array_equal(step_rewards, [s.step_reward for ep in played.episodes for s in ep.steps])
        for ep in played.episodes:  # a plain loop in float64
            rewards = [s.env_reward if mode == "reference" else s.step_reward for s in ep.steps]
            mine = np.flatnonzero(steps.traj_ids == ep.traj_id)
            for t, i in enumerate(mine):
                expected = sum(0.9**k * r for k, r in enumerate(rewards[t:]))
                expected -= 0.1 * (mode == "reference" and not ep.steps[t].action_valid)
                assert terms.step_return[i] == pytest.approx(expected, rel=1e-14, abs=1e-15)
    assert float(np.float32(-0.1)) != -0.1 and -0.1 in config.seen[0][0]  # the cost as played, not float32's


def test_a_zero_step_weight_gives_no_step_signal():
    """w = 0: A_S is computed but never reaches the advantage, so it keeps no group."""
    steps = _batch(*ALL_FAIL_SHARED)
    assert _decisions(group_signal(steps, "signal", GiGPOConfig(step_advantage_w=0.0))) == {
        "fail": (False, False, False)
    }
    assert _decisions(group_signal(steps, "signal", GIGPO)) == {"fail": (False, True, True)}


def test_failed_episodes_and_padding_count_in_neither_test():
    steps = _batch(
        # the only differing return (and the only differing R_t at s0) is a failed episode's
        _traj("g", "a", [0.0, 1.0], ["s0", "s1"], won=True),
        _traj("g", "b", [0.0, 1.0], ["s0", "s1"], won=True),
        _traj("g", "c", [0.0, 0.0], ["s0", "s2"], env_error=True),
        # one trajectory left unmasked: nothing to compare it with
        _traj("one", "d", [1.0], ["s0"], won=True),
        _traj("one", "e", [0.0], ["s0"], env_error=True),
        # every episode failed
        _traj("dead", "f", [0.0, -0.1], ["s0", "s1"], env_error=True),
        _traj("dead", "h", [1.0], ["s0"], env_error=True),
        padding=2,
    )
    for name in ("episode", "signal"):
        assert _decisions(group_signal(steps, name, GIGPO)) == {
            "g": (False, False, False),
            "one": (False, False, False),
            "dead": (False, False, False),
        }
    # with the failed episode unmasked the same rows do carry a signal: the masking is what drops them
    unmasked = _batch(
        _traj("g", "a", [0.0, 1.0], ["s0", "s1"], won=True),
        _traj("g", "b", [0.0, 1.0], ["s0", "s1"], won=True),
        _traj("g", "c", [0.0, 0.0], ["s0", "s2"]),
    )
    assert _decisions(group_signal(unmasked, "episode", GIGPO)) == {"g": (True, True, True)}


@pytest.mark.parametrize(
    ("section", "estimator", "match"),
    [
        ({"enable": True, "max_num_gen_batches": 0}, "gigpo", r"max_num_gen_batches=0 must be"),
        ({"enable": True, "max_num_gen_batches": True}, "gigpo", r"max_num_gen_batches=True must be"),
        ({"enable": True, "filter": "steps"}, "gigpo", r"filter='steps' must be"),
        ({"enable": "yes"}, "gigpo", r"enable='yes' must be"),
        ({"enable": True, "filter": "signal"}, "grpo", r"filter=signal needs a step-credit.*adv_estimator='grpo'"),
        ({"enable": True, "metric": "acc"}, "gigpo", r"metric='acc'"),
        ({"enable": True, "rounds": 3}, "gigpo", r"unknown algorithm.filter_groups key\(s\) \['rounds'\]"),
    ],
)
def test_bad_options_are_refused_naming_the_key(section, estimator, match):
    with pytest.raises(ValueError, match=match):
        DynamicSampling.from_algorithm({"adv_estimator": estimator, "filter_groups": section})


def test_options_read_verls_section():
    verl_defaults = {"_target_": "x", "enable": False, "metric": "reward", "max_num_gen_batches": 0}
    assert DynamicSampling.from_algorithm({"filter_groups": verl_defaults}) == DynamicSampling(max_rounds=0)
    section = {**verl_defaults, "enable": True, "max_num_gen_batches": 10, "filter": "signal"}
    got = DynamicSampling.from_algorithm({"adv_estimator": "hgpo", "filter_groups": section})
    assert got == DynamicSampling(enable=True, filter="signal", max_rounds=10)
    assert DynamicSampling.from_algorithm({}) == DynamicSampling()
    assert DynamicSampling.from_algorithm({"adv_estimator": "grpo", "filter_groups": {"enable": True}}).enable
    with pytest.raises(ValueError, match="max_num_gen_batches"):
        load_config(["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=0"])
    with pytest.raises(ValueError, match="filter=signal needs"):
        load_config(
            [
                "algorithm.filter_groups.enable=true",
                "algorithm.filter_groups.filter=signal",
                "algorithm.adv_estimator=rloo",
            ]
        )


def _round(prefix, outcomes):
    """A round of groups ``<prefix><i>``: 'mixed' groups (kept by both filters), 'win' groups (kept by signal
    only), 'flat' groups (dropped by both); two episodes each."""
    made = {"mixed": MIXED, "win": ALL_WIN, "flat": ALL_FAIL_DISJOINT}
    trajectories = []
    for i, kind in enumerate(outcomes):
        for traj in made[kind]:
            trajectories.append([(f"{prefix}{i}", {**f, "traj_id": f"{prefix}{i}-{f['traj_id']}"}) for _, f in traj])
    return _batch(*trajectories)


def test_rounds_trim_a_surplus_and_fill_a_shortfall_from_the_last_round():
    options = DynamicSampling(enable=True, filter="signal", max_rounds=3)
    rounds = DynamicRounds(options, target=3)
    first = _round("a", ["flat", "mixed", "flat"])
    rounds.add(first, group_signal(first, "signal", GIGPO))
    assert not rounds.done and rounds.kept_count == 1
    second = _round("b", ["win", "flat", "flat"])
    rounds.add(second, group_signal(second, "signal", GIGPO))
    assert not rounds.done and rounds.kept_count == 2
    third = _round("c", ["mixed", "win", "mixed"])
    rounds.add(third, group_signal(third, "signal", GIGPO))
    assert rounds.done and rounds.kept_count == 5
    assert rounds.selected() == ["a1", "b0", "c0"]  # the first three kept, in play order: c1 and c2 trimmed
    m = rounds.metrics()
    assert m["dynamic/rounds"] == 3
    assert m["dynamic/kept_fraction_round_1"] == m["dynamic/kept_fraction_round_2"] == pytest.approx(1 / 3)
    assert m["dynamic/kept_fraction_round_3"] == 1.0 and m["dynamic/kept_fraction"] == pytest.approx(5 / 9)
    assert m["dynamic/kept_groups"] == 3 and m["dynamic/kept_by_step_signal_only"] == 1  # b0
    assert m["dynamic/surplus_groups"] == 2 and m["dynamic/short_groups"] == 0
    assert m["dynamic/episodes_played"] == 18 and m["dynamic/episodes_per_kept_group"] == 6
    assert m["dynamic/played_success_rate"] == pytest.approx(7 / 18)  # mixed: 1 of 2 won (x3), win: 2 of 2 (x2)
    with pytest.raises(RuntimeError, match="no round after the last"):
        rounds.add(third, group_signal(third, "signal", GIGPO))

    # the episode filter keeps fewer; after max_rounds the last round's dropped groups fill the batch, in play order
    short = DynamicRounds(DynamicSampling(enable=True, filter="episode", max_rounds=2), target=3)
    short.add(first, group_signal(first, "episode", GIGPO))
    with pytest.raises(ValueError, match="earlier round"):
        short.add(first, group_signal(first, "episode", GIGPO))
    short.add(second, group_signal(second, "episode", GIGPO))
    assert short.done and short.selected() == ["a1", "b0", "b1"]
    m = short.metrics()
    assert m["dynamic/short_groups"] == 2 and m["dynamic/kept_groups"] == 1
    assert m["dynamic/dropped_with_step_signal"] == 1  # b0, the all-success group
    assert m["dynamic/episodes_per_kept_group"] == 12  # 12 episodes for 1 kept group


# --------------------------------------------------------------------------------------------- the local engine
# An easy gridnav (3x3, no walls, goal 1-2 steps away, 4 steps): a random policy wins about half the episodes, so
# some groups have mixed outcomes and some do not (trainer.seed=0: round 1 keeps 2 of its 3 groups).
EASY = ["env.kwargs.size=3", "env.kwargs.walls=0", "env.kwargs.min_path=1", "env.max_steps=4"]


def _trainer(model_dir, out_dir, *extra):
    return LocalTrainer(
        load_config(
            [
                f"actor_rollout_ref.model.path={model_dir}",
                f"trainer.default_local_dir={out_dir}",
                "actor_rollout_ref.rollout.n=4",
                "data.train_batch_size=3",
                "data.val_size=2",
                "local.progress=false",
                "local.plot=false",
                *EASY,
                *extra,
            ]
        )
    )


def _played(episodes):
    """What identifies an episode's play: its group, task seed and actions."""
    return [(ep.group_id, ep.task.seed, [s.action for s in ep.steps]) for ep in episodes]


DYNAMIC = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=4"]


def test_local_engine_plays_rounds_of_fresh_tasks_and_fills_the_batch(tiny_model_dir, tmp_path):
    runs = [_trainer(tiny_model_dir, tmp_path / name, *DYNAMIC) for name in ("a", "b")]
    plain = _trainer(tiny_model_dir, tmp_path / "plain")
    try:
        plays = []
        for trainer in runs:
            trainer.iteration = 1  # play_iteration plays the current iteration's rounds
            plays.append(trainer.play_iteration())
        plain.iteration = 1
        first = plain.play_iteration()[1]
        plain.iteration = 2
        second = plain.play_iteration()[1]
        lines = [[trainer.train_step() for _ in range(2)] for trainer in runs]  # iterations 2 and 3
    finally:
        for trainer in (*runs, plain):
            trainer.close()

    (chosen, played, metrics), again = plays
    assert _played(again[1]) == _played(played) and again[2] == metrics  # same seed, same rounds
    rounds = int(metrics["dynamic/rounds"])
    assert rounds >= 2 and metrics["dynamic/kept_fraction_round_1"] < 1 and metrics["dynamic/short_groups"] == 0
    assert len(played) == rounds * 12 and metrics["dynamic/episodes_played"] == len(played)
    # round 1 is what the run without dynamic sampling plays; round 2 the next tasks of the same stream, new groups
    assert _played(played[:12]) == _played(first)
    assert [ep.task.seed for ep in played[12:24]] == [ep.task.seed for ep in second]
    assert [ep.group_id for ep in played[12:24:4]] == ["task3", "task4", "task5"]
    # the batch: exactly data.train_batch_size groups, each kept by the filter, in play order
    groups = list(dict.fromkeys(ep.group_id for ep in chosen))
    assert len(groups) == 3 == metrics["dynamic/kept_groups"] and len(chosen) == 12
    assert groups == sorted(groups, key=lambda g: int(g[4:]))

    for line_a, line_b in zip(*lines, strict=True):
        comparable = [  # wall-clock timings aside, the runs are the same
            {k: v for k, v in m.items() if not (k.startswith("timing_s/") or k.endswith("_seconds_mean"))}
            for m in (line_a, line_b)
        ]
        assert comparable[0] == comparable[1]
        assert line_a["gigpo/num_episode_groups"] == 3 and line_a["episode/num_trajectories"] == 12
        assert line_a["rollout/episodes_played"] == line_a["dynamic/rounds"] * 12
        assert np.isfinite(line_a["actor/pg_loss"]) and "dynamic/kept_fraction_round_1" in line_a
    totals = [m["rollout/episodes_played_total"] for m in lines[0]]
    assert totals[1] - totals[0] == lines[0][1]["rollout/episodes_played"]


def test_the_signal_filter_keeps_groups_the_episode_filter_drops(tiny_model_dir, tmp_path):
    """Unconstrained decoding: the tiny model's replies are mostly invalid, every episode fails, and with the
    reference's penalty placement the environment's returns are all 0. The episode filter drops every group; the
    signal filter keeps those whose penalties came at different steps from a shared state (step term nonzero). Both
    runs play the same rounds (same seed, before any update) until the signal filter's batch is full."""
    shared = [
        *DYNAMIC,
        "local.constrain_to_actions=false",
        "env.invalid_action_penalty_mode=reference",
        "algorithm.gigpo.episode_stats=step",
        "algorithm.filter_groups.max_num_gen_batches=3",
    ]
    results = {}
    for name in ("episode", "signal"):
        trainer = _trainer(tiny_model_dir, tmp_path / name, *shared, f"algorithm.filter_groups.filter={name}")
        try:
            trainer.iteration = 1
            results[name] = trainer.play_iteration()
        finally:
            trainer.close()
    _, by_episode, m_episode = results["episode"]
    chosen, by_signal, m_signal = results["signal"]
    assert _played(by_signal) == _played(by_episode)[: len(by_signal)]
    assert m_episode["dynamic/kept_groups"] == 0 and m_episode["dynamic/dropped_with_step_signal"] >= 1
    assert m_signal["dynamic/kept_by_step_signal_only"] == m_signal["dynamic/kept_groups"] >= 1
    # the groups the signal filter kept are in its batch, and are exactly those the episode filter dropped with a
    # nonzero step term on the same rows
    cfg = GiGPOConfig(episode_stats="step", penalty_mode="reference")
    rows = StepBatch.from_episodes(by_signal)
    kept, dropped = group_signal(rows, "signal", cfg), group_signal(rows, "episode", cfg)
    assert set(kept.kept()) <= {ep.group_id for ep in chosen} and len(kept.kept()) >= 1
    assert kept.kept() == [str(g) for g in dropped.group_ids[dropped.dropped_with_step_signal]]


def test_a_resumed_dynamic_run_plays_what_an_uninterrupted_one_does(tiny_model_dir, tmp_path):
    """The task RNG and the count of episodes played are in the checkpoint: 2 iterations straight and 1 + 1 resumed
    give the same metrics lines (rounds, kept fractions, episodes played, losses)."""
    common = [*DYNAMIC, "trainer.save_freq=1", "trainer.test_freq=1"]  # each run validates every iteration
    straight = _trainer(tiny_model_dir, tmp_path / "a", *common, "trainer.total_training_steps=2")
    try:
        history_a = straight.fit()
    finally:
        straight.close()
    first = _trainer(tiny_model_dir, tmp_path / "b", *common, "trainer.total_training_steps=1")
    try:
        first.fit()
    finally:
        first.close()
    resumed = _trainer(tiny_model_dir, tmp_path / "b", *common, "trainer.total_training_steps=2", "trainer.resume=true")
    try:
        history_b = resumed.fit()
    finally:
        resumed.close()

    def comparable(history):
        return [
            {k: v for k, v in m.items() if not (k.startswith("timing_s/") or k.endswith("_seconds_mean"))}
            for m in history
        ]

    assert comparable(history_a) == comparable(history_b)
    train = [m for m in history_b if "dynamic/rounds" in m]
    assert len(train) == 2 and train[1]["rollout/episodes_played_total"] == sum(
        m["rollout/episodes_played"] for m in train
    )


def test_an_episode_budget_stops_a_dynamic_run_with_a_final_validation_and_checkpoint(tiny_model_dir, tmp_path):
    """trainer.total_training_episodes: the run stops after the iteration that reaches the budget (dynamic sampling
    plays more than one round's 12 episodes an iteration, so before total_training_steps), validates and saves."""
    trainer = _trainer(
        tiny_model_dir,
        tmp_path / "run",
        *DYNAMIC,
        "trainer.total_training_steps=50",
        "trainer.total_training_episodes=30",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
    )
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    training = [m for m in history if "rollout/episodes_played_total" in m]
    totals = [m["rollout/episodes_played_total"] for m in training]
    assert totals[-1] >= 30 and all(t < 30 for t in totals[:-1])
    assert len(training) < 50 and "val/success_rate" in history[-1]
    assert (tmp_path / "run" / "checkpoints" / f"iter_{len(training)}" / "state.pt").is_file()
    with pytest.raises(ValueError, match="trainer.total_training_episodes"):
        load_config(["trainer.total_training_episodes=0"])
