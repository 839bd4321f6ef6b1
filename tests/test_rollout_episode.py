"""CPU tests of the shared episode runner (verl_gigpo.rollout) on real environments with a tiny real model served by
the project's local generation server."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from environments import EnvError, make_env
from environments.gridnav.env import GridNavEnv
from verl_gigpo.local.server import LocalGenerationServer
from verl_gigpo.rollout import ChatPromptEncoder, EnvPool, EpisodeConfig, TaskSpec, build_prompt, run_episode

SAMPLING = {"temperature": 1.0, "max_tokens": 3}


@pytest.fixture(scope="module")
def served(action_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(action_model_dir)
    model = AutoModelForCausalLM.from_pretrained(action_model_dir)
    return tokenizer, LocalGenerationServer(model, tokenizer, seed=0)


def _play(served, tasks, config, **kwargs):
    tokenizer, server = served

    async def main():
        return await asyncio.gather(
            *[
                run_episode(
                    task,
                    generator=server,
                    encoder=ChatPromptEncoder(tokenizer),
                    tokenizer=tokenizer,
                    config=config,
                    traj_id=f"traj{i}",
                    sampling_params=SAMPLING,
                    **kwargs,
                )
                for i, task in enumerate(tasks)
            ]
        )

    return asyncio.run(main())


@pytest.mark.parametrize("pooled", [False, True], ids=["fresh-envs", "env-pool"])
def test_steps_replay_exactly_in_a_fresh_environment(served, pooled):
    tokenizer, server = served
    config = EpisodeConfig(max_steps=6, max_prompt_length=512, max_response_length=3, key_mode="state")
    tasks = [TaskSpec("gridnav", seed=s) for s in range(4) for _ in range(3)]
    pool = EnvPool() if pooled else None
    episodes = _play(served, tasks, config, env_pool=pool)
    if pooled:  # a second round reuses the first round's environments (reset, not rebuilt)
        episodes += _play(served, tasks, config, env_pool=pool)
        assert pool.reused >= len(tasks) and pool.created <= len(tasks) and len(pool) == pool.created
    assert server.stats["max_batch"] > 1  # concurrent episodes were batched into shared forward passes
    for ep in episodes:
        assert ep.env_error is None and 1 <= ep.length <= 6
        env = make_env("gridnav", max_steps=6, key_mode="state")
        obs, info = env.reset(seed=ep.task.seed)
        history = []
        for step in ep.steps:
            # the anchor key is that of the state the action was taken FROM; the prompt is the env's template
            assert step.anchor_key == info["anchor_key"] and step.observation == obs
            assert step.prompt_text == env.render_prompt(obs, info, history[-2:])
            assert len(step.response_logprobs) == len(step.response_ids) <= 3
            action, valid = env.parse_action(step.response_text)
            assert (action, valid) == (step.action, step.action_valid)
            obs_next, reward, terminated, truncated, info = env.step(action)
            assert step.env_reward == reward and step.step_reward == pytest.approx(reward - (0 if valid else 0.1))
            assert (step.terminated, step.truncated, step.won) == (terminated, truncated, info["won"])
            history.append((obs, action if valid else "(invalid output)"))
            obs = obs_next
        assert ep.won == info["won"]
        assert ep.episode_return == pytest.approx(sum(s.step_reward for s in ep.steps))
        assert ep.timing["generate"] > 0 and ep.timing["env"] > 0


def test_history_is_dropped_oldest_first_to_fit_the_prompt_budget(served):
    tokenizer, _ = served
    encoder = ChatPromptEncoder(tokenizer)
    env = make_env("gridnav", max_steps=10, key_mode="state")
    obs, info = env.reset(seed=0)
    history = [(f"old observation {i} " * 5, "up") for i in range(4)]
    full = encoder(env.render_prompt(obs, info, history[-3:]))
    none = encoder(env.render_prompt(obs, info, []))
    budget = len(full) - 1  # one token too few for 3 history items
    config = EpisodeConfig(history_length=3, max_prompt_length=budget)
    text, ids, used, cut = build_prompt(env, obs, info, history, encoder, config)
    assert used < 3 and not cut and len(ids) <= budget
    assert text == env.render_prompt(obs, info, history[len(history) - used :])  # the NEWEST items are kept
    # even the history-free prompt is too long: the ids are cut from the left, the episode goes on
    config = EpisodeConfig(history_length=3, max_prompt_length=len(none) - 5)
    text, ids, used, cut = build_prompt(env, obs, info, history, encoder, config)
    assert used == 0 and cut and ids == none[5:]


def test_a_short_prompt_budget_never_fails_an_episode(served):
    config = EpisodeConfig(max_steps=5, history_length=4, max_prompt_length=60, max_response_length=3, key_mode="state")
    (episode,) = _play(served, [TaskSpec("gridnav", seed=1)], config)
    assert episode.env_error is None and episode.length >= 1
    assert all(len(s.prompt_ids) <= 60 for s in episode.steps)
    assert any(s.history_dropped > 0 or s.prompt_truncated for s in episode.steps)


class _FailingGridNav(GridNavEnv):
    """A real gridnav environment whose engine breaks on its first valid action from step 3 on."""

    def _step(self, action):
        if self._step_count >= 3:
            raise RuntimeError("engine crashed")
        return super()._step(action)


def test_an_environment_error_ends_the_episode_and_is_recorded(served):
    config = EpisodeConfig(max_steps=8, max_prompt_length=512, max_response_length=3, key_mode="state")

    def factory(task, cfg):
        return _FailingGridNav(max_steps=cfg.max_steps, key_mode=cfg.key_mode, min_path=6)

    episodes = _play(served, [TaskSpec("gridnav", seed=2)] * 2, config, env_factory=factory)
    for ep in episodes:
        assert ep.length >= 2  # the steps before the failing one are kept; the failing step is not a row
        assert ep.env_error.startswith("EnvError") and "engine crashed" in ep.env_error
        assert f"step={ep.length + 1}" in ep.env_error


def test_a_failing_reset_gives_an_empty_episode_with_the_error(served):
    config = EpisodeConfig(max_steps=4, key_mode="state")
    (episode,) = _play(served, [TaskSpec("gridnav", seed=0, split="no-such-split")], config)
    assert episode.steps == [] and "no-such-split" in episode.env_error


def test_env_kwargs_must_not_repeat_episode_settings(served):
    config = EpisodeConfig(max_steps=4, key_mode="state")
    (episode,) = _play(served, [TaskSpec("gridnav", seed=0, env_kwargs={"max_steps": 3})], config)
    assert "env.max_steps" in episode.env_error


def test_env_error_type_carries_name_task_and_step():
    env = _FailingGridNav(max_steps=8, min_path=6)
    env.reset(seed=0)
    env.step("up")
    env.step("up")
    with pytest.raises(EnvError) as info:
        env.step("up")
    assert (info.value.env_name, info.value.step) == ("gridnav", 3) and info.value.task_id == env.task_id
