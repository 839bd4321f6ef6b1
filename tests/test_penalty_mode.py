"""Where the invalid-action penalty enters the advantage: ``env.invalid_action_penalty_mode``.

``reward`` (default): the penalty is part of r_t, so it is discounted into earlier steps and summed into the episode
return. ``reference``: as the reference implementation's trainer places it (verl-agent's
``apply_invalid_action_penalty`` after ``compute_step_discounted_returns``, then ``episode_norm_reward`` /
``step_norm_reward`` over step rows): the environment's rewards are discounted alone, the invalid row's own step
return and own episode score lose the penalty, and the episode statistics run over step rows.

The oracle below is that computation written as plain loops, row by row, from the description of the reference's
pipeline; the estimator must equal it. The issue's table (three lost trajectories) is checked with its figures.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_gigpo.advantage import gigpo_advantage_terms, graphgpo_advantage_terms, hgpo_advantage_terms
from verl_gigpo.advantage.outcome import outcome_advantages
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.local.config import load_config
from verl_gigpo.rollout.step_rows import StepBatch

C = 0.1  # the penalty (env.invalid_action_penalty)
EPS = 1e-6


def reference_oracle(rows: list[dict], *, gamma: float, w: float = 1.0, norm: str = "mean_std") -> np.ndarray:
    """The reference's GiGPO advantage of each row, in plain loops.

    1. R_t: the trajectory's environment rewards discounted from its last step back (no penalty in them).
    2. Each row's episode score: its trajectory's summed environment reward; then the penalty of the row's own reply
       is subtracted from that score and from its R_t.
    3. Episode term: per episode group, mean and unbiased std over the group's ROWS (a group of one row: mean 0, std 1).
    4. Step term: the same over the rows of each (episode group, anchor key).
    """
    by_traj: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_traj.setdefault(row["traj"], []).append(i)
    step_return, score = [0.0] * len(rows), [0.0] * len(rows)
    for members in by_traj.values():
        members.sort(key=lambda i: rows[i]["step"])
        running = 0.0
        for i in reversed(members):
            running = rows[i]["env_reward"] + gamma * running
            step_return[i] = running
        total = sum(rows[i]["env_reward"] for i in members)
        for i in members:
            score[i] = total
    for i, row in enumerate(rows):
        if not row["valid"]:
            step_return[i] -= C
            score[i] -= C

    def normalise(values: list[float], keys: list) -> list[float]:
        out = []
        for i in range(len(values)):
            group = [values[j] for j in range(len(values)) if keys[j] == keys[i]]
            if len(group) == 1:
                mean, std = 0.0, 1.0
            else:
                mean = sum(group) / len(group)
                std = (sum((v - mean) ** 2 for v in group) / (len(group) - 1)) ** 0.5
            out.append((values[i] - mean) / (std + EPS) if norm == "mean_std" else values[i] - mean)
        return out

    episode = normalise(score, [row["group"] for row in rows])
    step = normalise(step_return, [(row["group"], row["key"]) for row in rows])
    return np.array([e + w * s for e, s in zip(episode, step, strict=True)])


def make_rows(trajectories: dict[str, list[tuple[str, float, bool]]], group: str = "u") -> list[dict]:
    """Rows from ``{traj: [(anchor key, environment reward, reply valid), ...]}``."""
    return [
        {"group": group, "traj": traj, "step": t, "key": key, "env_reward": r, "valid": valid}
        for traj, steps in trajectories.items()
        for t, (key, r, valid) in enumerate(steps)
    ]


def estimator_inputs(rows: list[dict]) -> tuple:
    n = len(rows)
    column = [np.array([row[k] for row in rows], dtype=object) for k in ("group", "traj", "key")]
    steps = np.array([row["step"] for row in rows])
    env_rewards = torch.tensor([row["env_reward"] for row in rows], dtype=torch.float64)
    valid = np.array([row["valid"] for row in rows])
    return n, column, steps, env_rewards, valid


def reference_terms(rows: list[dict], *, gamma: float, norm: str = "mean_std", method: str = "gigpo", **options):
    """The estimator in ``reference`` mode through the config entry both engines use."""
    n, (groups, trajs, keys), steps, env_rewards, valid = estimator_inputs(rows)
    cfg = GiGPOConfig(gamma=gamma, norm=norm, episode_stats="step", penalty_mode="reference", method=method)
    step_rewards = env_rewards - C * torch.as_tensor(~valid, dtype=torch.float64)
    return cfg.advantage_terms(
        step_rewards,
        torch.ones(n, 1),
        groups,
        trajs,
        steps,
        keys,
        env_rewards=env_rewards,
        action_valid=valid,
        won=np.array([row["traj"].startswith("W") for row in rows]),
        **options,
    )


# three lost trajectories of four steps; the second reply of L1 and the first two of L3 are invalid (the issue's
# table); every anchor key appears in at least two trajectories, so no group of one row (where the reference gives
# the raw value and this package 0: deviation 4) is involved
LOST = {
    "L1": [("A", 0.0, True), ("B", 0.0, False), ("C", 0.0, True), ("D", 0.0, True)],
    "L2": [("A", 0.0, True), ("B", 0.0, True), ("C", 0.0, True), ("D", 0.0, True)],
    "L3": [("A", 0.0, False), ("A", 0.0, False), ("C", 0.0, True), ("D", 0.0, True)],
}
WON = {
    "W1": [("A", 0.0, True), ("B", 0.0, True), ("E", 10.0, True)],
    "W2": [("A", 0.0, False), ("C", 0.0, True), ("E", 10.0, True)],
}


def test_three_lost_trajectories_give_the_issues_figures():
    """The table of the issue: per row +0.55/-1.66/+0.55/+0.55, +0.55 x4, -1.66/-1.66/+0.55/+0.55 in the
    reference's placement; 0, +1, -1 per trajectory with the penalty in the reward."""
    rows = make_rows(LOST)
    terms = reference_terms(rows, gamma=0.95)
    episode = np.round(terms.episode_adv, 2).tolist()
    assert episode == [0.55, -1.66, 0.55, 0.55] + [0.55] * 4 + [-1.66, -1.66, 0.55, 0.55]
    # the row's own episode score: the episode's environment reward (0) minus its own penalty
    assert terms.episode_return.tolist() == [0, -C, 0, 0] + [0] * 4 + [-C, -C, 0, 0]
    # the penalty in the reward, trajectory statistics (this package's default)
    n, (groups, trajs, keys), steps, env_rewards, valid = estimator_inputs(rows)
    step_rewards = env_rewards - C * torch.as_tensor(~valid, dtype=torch.float64)
    reward = gigpo_advantage_terms(step_rewards, torch.ones(n, 1), groups, trajs, steps, keys, gamma=0.95)
    assert np.round(reward.episode_adv, 4).tolist() == [0.0] * 4 + [1.0] * 4 + [-1.0] * 4
    np.testing.assert_allclose(terms.advantage, reference_oracle(rows, gamma=0.95), rtol=0, atol=1e-9)


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@pytest.mark.parametrize("gamma", [0.95, 1.0, 0.5])
def test_three_lost_and_two_won_trajectories_equal_the_reference_computation(norm, gamma):
    rows = make_rows({**LOST, **WON})
    terms = reference_terms(rows, gamma=gamma, norm=norm)
    expected = reference_oracle(rows, gamma=gamma, norm=norm)
    np.testing.assert_allclose(terms.advantage, expected, rtol=0, atol=1e-9)
    # what changes against the penalty in the reward: the first valid step of L1 does not carry the discounted
    # penalty of its second step in the reference placement, so its step return is 0 there, -0.095 here
    assert terms.step_return[0] == 0.0
    n, (groups, trajs, keys), steps, env_rewards, valid = estimator_inputs(rows)
    step_rewards = env_rewards - C * torch.as_tensor(~valid, dtype=torch.float64)
    reward = gigpo_advantage_terms(step_rewards, torch.ones(n, 1), groups, trajs, steps, keys, gamma=gamma, norm=norm)
    assert reward.step_return[0] == pytest.approx(-C * gamma)
    assert np.abs(reward.advantage - terms.advantage).max() > 0.1


def test_grpo_in_reference_mode_scores_rows_as_the_reference():
    """GRPO / RLOO: one score per row (its episode's environment reward minus its own penalty), statistics over
    the group's rows, as the reference's ``compute_grpo_outcome_advantage`` with ``compute_mean_std_cross_steps``."""
    rows = make_rows({**LOST, **WON})
    n, (groups, trajs, keys), steps, env_rewards, valid = estimator_inputs(rows)
    batch = StepBatch(
        group_ids=groups,
        traj_ids=trajs,
        step_ids=steps,
        anchor_keys=keys,
        step_rewards=(env_rewards - C * torch.as_tensor(~valid, dtype=torch.float64)).numpy(),
        env_rewards=env_rewards.numpy(),
        action_valid=valid,
        won=np.array([row["traj"].startswith("W") for row in rows]),
        env_error=np.zeros(n, dtype=bool),
        task_types=np.array([None] * n, dtype=object),
        history_dropped=np.zeros(n, dtype=np.int64),
        row_mask=np.ones(n, dtype=bool),
    )
    score = np.array([10.0 if row["traj"].startswith("W") else 0.0 for row in rows]) - C * ~valid  # (N,)
    grpo = outcome_advantages(batch, "grpo", penalty_mode="reference", invalid_action_penalty=C)
    np.testing.assert_allclose(grpo, (score - score.mean()) / (score.std(ddof=1) + EPS), rtol=0, atol=1e-5)
    rloo = outcome_advantages(batch, "rloo", penalty_mode="reference", invalid_action_penalty=C)
    np.testing.assert_allclose(rloo, score - (score.sum() - score) / (n - 1), rtol=0, atol=1e-5)
    # in the reward mode the scores are per trajectory (5 of them), so the values differ
    per_traj = outcome_advantages(batch, "grpo")
    assert np.abs(per_traj - grpo).max() > 0.05
    with pytest.raises(ValueError, match="invalid_action_penalty_mode='both'"):
        outcome_advantages(batch, "grpo", penalty_mode="both")


def test_every_step_credit_estimator_honours_the_mode():
    """HGPO with K = 0 (depth 1 only) is GiGPO's step term; GraphGPO's graph return loses the row's own penalty;
    G2PO's step term reads values, not returns, so only its episode term changes; every episode term is the one
    above."""
    rows = make_rows({**LOST, **WON})
    gigpo = reference_terms(rows, gamma=0.95)
    hgpo = reference_terms(rows, gamma=0.95, method="hgpo")
    n, (groups, trajs, keys), steps, env_rewards, valid = estimator_inputs(rows)
    penalty = C * ~valid  # (N,)
    won = np.array([row["traj"].startswith("W") for row in rows])
    shallow = hgpo_advantage_terms(
        env_rewards,
        torch.ones(n, 1),
        groups,
        trajs,
        steps,
        keys,
        gamma=0.95,
        episode_stats="step",
        history_length=0,
        row_penalty=penalty,
    )
    np.testing.assert_allclose(shallow.step_adv, gigpo.step_adv, rtol=0, atol=1e-12)
    assert hgpo.step_return.tolist() == gigpo.step_return.tolist()
    graph = reference_terms(rows, gamma=0.95, method="graphgpo")
    no_penalty = graphgpo_advantage_terms(
        env_rewards, torch.ones(n, 1), groups, trajs, steps, keys, won=won, gamma=0.95, episode_stats="step"
    )
    np.testing.assert_allclose(
        graph.extras["graph_return"], no_penalty.extras["graph_return"] - penalty, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(graph.episode_adv, gigpo.episode_adv, rtol=0, atol=1e-12)
    cfg = GiGPOConfig(gamma=0.95, episode_stats="step", method="g2po")
    g2po_reward = cfg.advantage_terms(
        env_rewards, torch.ones(n, 1), groups, trajs, steps, keys, won=won, action_valid=valid
    )
    g2po_ref = reference_terms(rows, gamma=0.95, method="g2po")
    np.testing.assert_allclose(g2po_ref.step_adv, g2po_reward.step_adv, rtol=0, atol=1e-12)
    np.testing.assert_allclose(g2po_ref.episode_adv, gigpo.episode_adv, rtol=0, atol=1e-12)


def test_bad_combinations_are_refused_naming_the_keys():
    with pytest.raises(ValueError, match="invalid_action_penalty_mode=reference needs algorithm.gigpo.episode_stats"):
        GiGPOConfig(penalty_mode="reference")
    with pytest.raises(ValueError, match="invalid_action_penalty_mode='discount'"):
        GiGPOConfig(penalty_mode="discount", episode_stats="step")
    with pytest.raises(ValueError, match="row_penalty needs episode_stats='step'"):
        gigpo_advantage_terms(
            [0.0, 1.0], torch.ones(2, 1), ["u", "u"], ["a", "b"], [0, 0], ["s", "s"], row_penalty=[0.1, 0.0]
        )
    cfg = GiGPOConfig(penalty_mode="reference", episode_stats="step")
    with pytest.raises(ValueError, match="needs each row's env_rewards"):
        cfg.advantage_terms([0.0, 1.0], torch.ones(2, 1), ["u", "u"], ["a", "b"], [0, 0], ["s", "s"])
    # both engines' config checks: the local engine at load, verl's preflight before Ray
    with pytest.raises(ValueError, match="episode_stats"):
        load_config(["env.invalid_action_penalty_mode=reference"])
    cfg = load_config(["env.invalid_action_penalty_mode=reference", "algorithm.gigpo.episode_stats=step"])
    assert cfg.env.invalid_action_penalty_mode == "reference"
    # grpo has no episode_stats: the mode alone is checked
    load_config(["env.invalid_action_penalty_mode=reference", "algorithm.adv_estimator=grpo"])
    with pytest.raises(ValueError, match="invalid_action_penalty_mode='x'"):
        load_config(["env.invalid_action_penalty_mode=x", "algorithm.adv_estimator=grpo"])
