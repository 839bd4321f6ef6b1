"""The two engines build the same step rows from the same episodes (CPU, no Ray).

Real gridnav episodes are played with fixed action scripts (two tasks, four episodes each; in task 0 one episode's
environment raises at its third step and one fails at reset; in task 1, whose returns differ, one raises at its third
step). They go through:

* verl's path: the agent loop's rows (:func:`verl_gigpo.verl_glue.agent_loop.episode_to_outputs`) as verl's V1
  agent-loop worker stores them (``AgentLoopOutput.as_dict`` plus ``uid``, :func:`verl.utils.tensordict_utils.
  list_of_dict_to_tensordict`), one verl padding row (``construct_minimal_padding_template``, tagged ``is_padding``),
  then what the ``gigpo_sync`` trainer mode does with them (:meth:`StepBatch.from_rows`,
  :meth:`StepBatch.advantage_terms`, :func:`verl_gigpo.verl_glue.trainer.episode_metrics`);
* the local engine's path: :meth:`StepBatch.from_episodes`, :meth:`StepBatch.advantage_terms` with the local config's
  estimator settings, the episode metrics of its rows, its run-level metric names and its row split;
* GRPO and RLOO: :func:`verl_gigpo.advantage.outcome.outcome_advantages`, which both engines call, on either path's
  rows.

Rows, groups, masks, advantages and metric names must agree.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from verl.trainer.ppo.padding_utils import construct_minimal_padding_template
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from environments.gridnav.env import GridNavEnv
from verl_gigpo.advantage.outcome import outcome_advantages
from verl_gigpo.dev.smoke import val_metric
from verl_gigpo.local.config import gigpo_config, load_config
from verl_gigpo.local.update import split_rows
from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, GenerationOutput, TaskSpec, run_episode
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.metrics import episode_metrics, run_names, val_names
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.agent_loop import episode_to_outputs
from verl_gigpo.verl_glue.metrics_file import TRAINING_STEP_KEY
from verl_gigpo.verl_glue.trainer import episode_metrics as trainer_episode_metrics
from verl_gigpo.verl_glue.trainer import plan_mini_batches

#: per task seed, one action script per episode (replayed in order, the last action repeated)
SCRIPTS = {  # task 0: the goal is 3 steps right (north wall); task 1: 1 down, then 4 right
    0: [["right"], ["up", "right"], ["down", "right", "up", "right", "right"], ["right"]],
    1: [["down", "right"], ["right", "down", "right"], ["jump", "down", "right"], ["up", "up", "left"]],
}
#: (seed, member) of the episodes whose environment fails: at its third step, and at reset
FAIL_AT_STEP, FAIL_AT_RESET, FAIL_LATE = (0, 1), (0, 3), (1, 2)
CONFIG = EpisodeConfig(max_steps=6, history_length=1, max_prompt_length=256, max_response_length=4)


class _Scripted:
    """A generator replying each episode's scripted actions (the request id is the trajectory id)."""

    def __init__(self, tokenizer, script: list[str]):
        self.replies = [tokenizer.encode(a, add_special_tokens=False) for a in script]
        self.calls = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return GenerationOutput(token_ids=list(reply), log_probs=[-0.5] * len(reply))


class _Failing(GridNavEnv):
    """gridnav whose environment raises at reset (``at == 0``) or at its ``at``-th step."""

    def __init__(self, at: int, **kwargs):
        super().__init__(**kwargs)
        self.at, self.steps = at, 0

    def reset(self, *, seed=None, options=None):
        if self.at == 0:
            raise RuntimeError("injected failure at reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            raise RuntimeError("injected failure at step")
        return super().step(action)


@pytest.fixture(scope="module")
def episodes(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    encoder = ChatPromptEncoder(tokenizer)
    played = []
    for seed, scripts in SCRIPTS.items():
        for member, script in enumerate(scripts):
            fail = {FAIL_AT_STEP: 3, FAIL_AT_RESET: 0, FAIL_LATE: 3}.get((seed, member))

            def factory(task, cfg, fail=fail):
                if fail is None:
                    return make_task_env(task, cfg)
                return _Failing(fail, max_steps=cfg.max_steps, key_mode=cfg.key_mode)

            played.append(
                asyncio.run(
                    run_episode(
                        TaskSpec("gridnav", seed=seed),
                        generator=_Scripted(tokenizer, script),
                        encoder=encoder,
                        tokenizer=tokenizer,
                        config=CONFIG,
                        traj_id=f"t{seed}-{member}",
                        sampling_params={},
                        env_factory=factory,
                        group_id=f"task{seed}",
                    )
                )
            )
    return tokenizer, played


def _verl_rows(tokenizer, episodes):
    """What verl hands the trainer mode: the agent loop's rows stored as verl's V1 worker stores them, plus one
    padding row built by verl's padding code. Returns (the TensorDict of rows, is_padding tags)."""
    fields = []
    for episode in episodes:
        placeholder = tokenizer.encode(f"environment failed: {episode.env_error}")[:64] or [0]
        for output in episode_to_outputs(
            episode, placeholder_prompt_ids=placeholder, eos_id=tokenizer.eos_token_id, weight_version=0
        ):
            field = output.as_dict()
            field["uid"] = episode.group_id  # verl's uid: one per task draw, shared by its rollout.n episodes
            fields.append(field)
    pad, _ = construct_minimal_padding_template(fields[0], {"status": "success"}, tokenizer.eos_token_id)
    pad["uid"] = "pad0"
    fields.append(pad)
    return list_of_dict_to_tensordict(fields), [False] * (len(fields) - 1) + [True]


@pytest.fixture(scope="module")
def both(episodes):
    tokenizer, played = episodes
    data, is_padding = _verl_rows(tokenizer, played)
    verl = StepBatch.from_rows(list(data["uid"]), list(data["extra_fields"]), is_padding)
    local = StepBatch.from_episodes(played)
    return played, data, verl, local


def test_the_episodes_hold_what_the_comparison_needs(episodes):
    _, played = episodes
    failed = [ep.traj_id for ep in played if ep.env_error is not None]
    assert failed == ["t0-1", "t0-3", "t1-2"] and played[1].length == 2 and played[3].length == 0
    assert played[6].length == 2 and played[6].episode_return == pytest.approx(-0.1)  # "jump" played, then raised
    assert any(ep.won for ep in played) and not all(ep.won for ep in played if ep.env_error is None)
    assert any(not s.action_valid for ep in played for s in ep.steps)  # "jump" is penalised


def test_rows_groups_and_masks_are_the_same(both):
    played, _, verl, local = both
    real = ~verl.padding
    assert real.sum() == len(local) == sum(max(ep.length, 1) for ep in played)  # placeholder row of t0-3
    # one schema (verl_gigpo.rollout.rows.episode_rows): every per-row column is the same on both engines
    for column in (
        "group_ids",
        "traj_ids",
        "step_ids",
        "anchor_keys",
        "action_valid",
        "won",
        "env_error",
        "task_types",
        "task_ids",
        "history_dropped",
        "episode_lengths",
        "observation_truncated",
        "abandoned_threads",
        "env_seconds",
        "generate_seconds",
    ):
        assert getattr(verl, column)[real].tolist() == getattr(local, column).tolist(), column
    np.testing.assert_array_equal(verl.step_rewards[real], local.step_rewards)
    np.testing.assert_array_equal(verl.env_rewards[real], local.env_rewards)
    # groups come from the task draw's id, never from positions; failed episodes are masked, not dropped
    assert set(local.group_ids) == {"task0", "task1"}
    assert local.row_mask.tolist() == [not ep.env_error for ep in played for _ in range(max(ep.length, 1))]
    assert verl.row_mask.tolist() == [*local.row_mask.tolist(), False]  # and verl's padding row
    # the local engine's token columns are the tokens verl stores (placeholder rows aside: no tokens locally)
    n, data = len(local), both[1]
    stored = {name: [t.tolist() for t in data[name].unbind(0)][:n] for name in ("prompts", "responses")}
    steps = [bool(r) for r in local.responses]
    assert sum(steps) == n - 1
    for name, column in (("prompts", local.prompts), ("responses", local.responses)):
        assert [x for x, s in zip(stored[name], steps, strict=True) if s] == [
            x for x, s in zip(column, steps, strict=True) if s
        ], name


def test_advantages_are_the_same(both):
    played, data, verl, local = both
    cfg = gigpo_config(load_config(["algorithm.gigpo.key_mode=state", "algorithm.gamma=0.9"]))
    response_mask = data["response_mask"].to_padded_tensor(0)  # (N + 1, L)
    verl_terms = verl.advantage_terms(cfg, response_mask)
    verl_adv, verl_stats = verl_terms.token_level(response_mask)[0], dict(verl_terms.stats)
    terms = local.advantage_terms(cfg)
    n = len(local)
    first_token = verl_adv[:n, 0].double().numpy()  # (N,) verl's per-row advantage (on every response token)
    np.testing.assert_allclose(first_token, terms.advantage, rtol=0, atol=1e-6)
    assert np.all(terms.advantage[~local.row_mask] == 0) and verl_adv[~torch.as_tensor(verl.row_mask)].abs().sum() == 0
    assert np.abs(terms.advantage).max() > 0  # a real signal
    assert dict(terms.stats).keys() == verl_stats.keys()
    for name, value in verl_stats.items():
        if name != "gigpo/num_masked_rows":  # verl counts its padding row too
            assert terms.stats[name] == pytest.approx(value, abs=1e-6), name
    assert verl_stats["gigpo/num_masked_rows"] == terms.stats["gigpo/num_masked_rows"] + 1


def _outcome_equations(episodes, estimator: str, norm: bool) -> dict[str, float]:
    """GRPO / RLOO written out per trajectory from the episodes' returns, over the given episodes of each task."""
    out = {}
    for group in {ep.group_id for ep in episodes}:
        members = [ep for ep in episodes if ep.group_id == group]
        returns = np.array([ep.episode_return for ep in members])
        n = len(returns)
        if estimator == "rloo":
            adv = returns - (returns.sum() - returns) / (n - 1)  # minus the mean of the others
        else:
            adv = returns - returns.mean()
            adv = adv / (returns.std(ddof=1) + 1e-6) if norm else adv
        out.update({ep.traj_id: float(a) for ep, a in zip(members, adv, strict=True)})
    return out


@pytest.mark.parametrize(("estimator", "norm"), [("grpo", True), ("grpo", False), ("rloo", True)])
def test_grpo_and_rloo_are_the_same_and_leave_failed_episodes_out(both, estimator, norm):
    """grpo / rloo on both engines' rows: one score per trajectory (its return) grouped by task, failed episodes and
    verl's padding row in no statistic and at 0; checked against the equations written out from the episodes."""
    played, _, verl, local = both
    from_verl = outcome_advantages(verl, estimator, norm_adv_by_std=norm)  # (N + 1,)
    from_local = outcome_advantages(local, estimator, norm_adv_by_std=norm)  # (N,)
    np.testing.assert_array_equal(from_verl[:-1], from_local)
    assert from_verl[-1] == 0.0
    finished = [ep for ep in played if ep.env_error is None]
    expected = _outcome_equations(finished, estimator, norm)
    rows = [expected.get(ep.traj_id, 0.0) for ep in played for _ in range(max(ep.length, 1))]
    np.testing.assert_allclose(from_local, rows, rtol=0, atol=1e-5)
    assert np.abs(from_local).max() > 0
    # counting the failed episodes' partial returns (what verl's own step would do) changes task 1's advantages
    with_failed = _outcome_equations(played, estimator, norm)
    assert any(abs(with_failed[ep.traj_id] - expected[ep.traj_id]) > 1e-3 for ep in finished if ep.group_id == "task1")


def test_outcome_advantages_names_what_it_computes(both):
    with pytest.raises(ValueError, match=r"computes \['grpo', 'rloo'\], not 'gae'"):
        outcome_advantages(both[3], "gae")


def test_metric_names_and_values_are_the_same(both):
    _, _, verl, local = both
    from_verl, from_local = trainer_episode_metrics(verl), episode_metrics(local.trajectory_summaries())
    assert from_verl.keys() == from_local.keys()
    for name, value in from_verl.items():
        assert from_local[name] == pytest.approx(value, abs=1e-12), name
    assert from_local["episode/num_step_rows"] == len(local) and from_local["env/env_error_rate"] == 3 / 8
    # run-level names: what verl's file logger writes (step, training/global_step, timing_s/step, timing_s/testing,
    # val-core/<data source>/acc/mean@1) is on the local engine's lines too
    train_line = {**run_names(3, training=True), "timing_s/step": 1.0}
    val_line = {**run_names(0, training=False), **val_names("gridnav", {"val/success_rate": 0.25}, seconds=2.0)}
    assert train_line["step"] == train_line[TRAINING_STEP_KEY] == 3.0 and TRAINING_STEP_KEY not in val_line
    assert val_metric(val_line) == "val-core/gridnav/acc/mean@1" and val_line[val_metric(val_line)] == 0.25
    assert val_line["timing_s/testing"] == val_line["timing_s/val"] == 2.0


@pytest.mark.parametrize("rows_per_step", [1, 3, 7, 100])
def test_the_update_split_is_the_same(both, rows_per_step):
    """verl's gigpo_sync plan and the local engine's split give the same number of optimizer steps for the unmasked
    rows, and the local split holds every row once."""
    _, _, _, local = both
    rows = int(local.row_mask.sum())
    split = split_rows(local.group_ids[local.row_mask], mini_batch_rows=rows_per_step, rng=np.random.default_rng(0))
    assert len(split) == plan_mini_batches(rows, rows_per_step, 1).num_mini_batches == math.ceil(rows / rows_per_step)
    assert sorted(np.concatenate(split).tolist()) == list(range(rows))
    assert max(map(len, split)) - min(map(len, split)) <= 1


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "env.max_steps=7",
            "env.history_length=1",
            "env.invalid_action=format",
            "env.parse.lowercase=true",
            "env.parse.collapse_whitespace=false",
            "data.max_prompt_length=300",
            "algorithm.gigpo.key_mode=state",
        ],
        [
            "env.max_steps=12",
            "env.history_length=2",
            "env.invalid_action_penalty=0.25",
            "data.max_prompt_length=512",
            "algorithm.gigpo.key_mode=observation",
            "algorithm.adv_estimator=graphgpo",
        ],
    ],
)
def test_both_engines_build_the_same_episode_config(overrides):
    """One constructor (``EpisodeConfig.from_env``): the same keys give the same episode settings on both engines,
    and a bad value is refused by both with the key named."""
    from hydra import compose, initialize_config_dir

    from verl_gigpo.local.setup import episode_config
    from verl_gigpo.verl_glue.agent_loop import episode_config_from

    shared = ["data.max_response_length=4", "actor_rollout_ref.rollout.response_length=4"]
    local_cfg = load_config([*overrides, "actor_rollout_ref.rollout.response_length=4"])
    with initialize_config_dir(
        config_dir=str(Path(__file__).resolve().parents[1] / "verl_gigpo" / "config"), version_base=None
    ):
        verl_cfg = compose(config_name="gigpo_trainer", overrides=[*overrides, shared[0]])
    assert episode_config(local_cfg, gigpo_config(local_cfg)) == episode_config_from(verl_cfg)

    local_cfg.env.history_length = -1
    verl_cfg.env.history_length = -1
    with pytest.raises(ValueError, match=r"^env\.history_length=-1 must be") as local_error:
        episode_config(local_cfg, gigpo_config(local_cfg))
    with pytest.raises(ValueError, match=r"^env\.history_length=-1 must be") as verl_error:
        episode_config_from(verl_cfg)
    assert str(local_error.value) == str(verl_error.value)


def test_the_reference_penalty_placement_is_the_same_on_both_engines(both):
    """env.invalid_action_penalty_mode=reference reads the environment's rewards, which both engines' rows carry
    (verl: the agent loop's env_reward field), and gives the same advantages on both. (The one invalid reply, "jump",
    is in an episode whose environment then failed, so its rows are masked: tests/test_penalty_mode.py shows what the
    mode changes.)"""
    played, data, verl, local = both
    real = ~verl.padding
    np.testing.assert_array_equal(verl.env_rewards[real], local.env_rewards)
    assert (
        (local.env_rewards != local.step_rewards).sum()
        == sum(not s.action_valid for ep in played for s in ep.steps)
        > 0
    )
    overrides = ["algorithm.gigpo.key_mode=state", "algorithm.gigpo.episode_stats=step"]
    cfg = gigpo_config(load_config([*overrides, "env.invalid_action_penalty_mode=reference"]))
    response_mask = data["response_mask"].to_padded_tensor(0)  # (N + 1, L)
    verl_adv, _ = verl.advantage_terms(cfg, response_mask).token_level(response_mask)
    terms = local.advantage_terms(cfg)
    np.testing.assert_allclose(verl_adv[: len(local), 0].double().numpy(), terms.advantage, rtol=0, atol=1e-6)
    assert np.abs(terms.advantage).max() > 0
    for estimator in ("grpo", "rloo"):
        kwargs = {"penalty_mode": "reference", "invalid_action_penalty": 0.1}
        from_verl = outcome_advantages(verl, estimator, **kwargs)
        np.testing.assert_array_equal(from_verl[:-1], outcome_advantages(local, estimator, **kwargs))
        assert from_verl[-1] == 0.0


#: a third group (task 1's layout): both episodes win, in 5 and 6 steps from the same start (one first bumps into the
#: north wall), so their returns are equal and their step returns from the shared states differ
ALL_WIN_SCRIPTS = [["right", "down", "right"], ["up", "right", "down", "right"]]


@pytest.fixture(scope="module")
def with_all_win(episodes):
    """The module's episodes plus the all-win group ``task2``, as verl's rows and as the local engine's."""
    tokenizer, played = episodes
    encoder = ChatPromptEncoder(tokenizer)
    extra = [
        asyncio.run(
            run_episode(
                TaskSpec("gridnav", seed=1),
                generator=_Scripted(tokenizer, script),
                encoder=encoder,
                tokenizer=tokenizer,
                config=CONFIG,
                traj_id=f"t2-{member}",
                sampling_params={},
                group_id="task2",
            )
        )
        for member, script in enumerate(ALL_WIN_SCRIPTS)
    ]
    assert [ep.won for ep in extra] == [True, True] and [ep.length for ep in extra] == [5, 6]
    data, is_padding = _verl_rows(tokenizer, [*played, *extra])
    verl = StepBatch.from_rows(list(data["uid"]), list(data["extra_fields"]), is_padding)
    return verl, StepBatch.from_episodes([*played, *extra])


@pytest.mark.parametrize(
    ("estimator", "overrides"),
    [
        ("gigpo", []),
        ("gigpo", ["env.invalid_action_penalty_mode=reference", "algorithm.gigpo.episode_stats=step"]),
        ("hgpo", []),
        ("graphgpo", []),
        ("g2po", []),
        ("grpo", []),
    ],
)
def test_dynamic_sampling_keeps_the_same_groups_on_both_engines(with_all_win, estimator, overrides):
    """The keep test of dynamic sampling (group_signal) on verl's rows and on the local engine's gives the same
    decisions. Task 0: every finished episode lost with reward 0 (no signal at all: dropped by both filters); task 1:
    returns differ, and the one failed episode counts in neither test (kept by both); task 2: both win, in 5 and 6
    steps (equal returns: the episode filter drops it; GiGPO's step term keeps it under the signal filter)."""
    from verl_gigpo.rollout.dynamic import group_signal

    verl, local = with_all_win
    cfg = load_config([f"algorithm.adv_estimator={estimator}", "algorithm.gigpo.key_mode=state", *overrides])
    gigpo = gigpo_config(cfg) if estimator != "grpo" else None
    filters = ("episode", "signal") if gigpo is not None else ("episode",)
    for name in filters:
        decisions = [group_signal(rows, name, gigpo, penalty_mode="reward") for rows in (verl, local)]
        for column in ("group_ids", "episode", "step", "keep", "score"):
            assert getattr(decisions[0], column).tolist() == getattr(decisions[1], column).tolist(), (name, column)
        assert decisions[1].group_ids.tolist() == ["task0", "task1", "task2"]
        assert decisions[1].episode.tolist() == [False, True, False]
        if estimator == "gigpo":
            assert decisions[1].keep.tolist() == [False, True, name == "signal"], name
            assert decisions[1].step.tolist()[::2] == [False, True]
