"""CPU tests of the shared episode runner (verl_gigpo.rollout) on real environments with a tiny real model served by
the project's local generation server."""

from __future__ import annotations

import asyncio

import pytest
from episode_play import SAMPLING, play_episodes
from transformers import AutoModelForCausalLM, AutoTokenizer

from environments import EnvError, make_env
from environments.gridnav.env import GridNavEnv
from verl_gigpo.local.server import LocalGenerationServer
from verl_gigpo.rollout import (
    ChatPromptEncoder,
    EnvPool,
    EpisodeConfig,
    GenerationOutput,
    TaskSpec,
    build_prompt,
    run_episode,
)
from verl_gigpo.rollout.metrics import episode_metrics, summaries_from_episodes


@pytest.fixture(scope="module")
def served(action_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(action_model_dir)
    model = AutoModelForCausalLM.from_pretrained(action_model_dir)
    return tokenizer, LocalGenerationServer(model, tokenizer, seed=0)


@pytest.mark.parametrize("pooled", [False, True], ids=["fresh-envs", "env-pool"])
def test_steps_replay_exactly_in_a_fresh_environment(served, pooled):
    tokenizer, server = served
    config = EpisodeConfig(max_steps=6, max_prompt_length=512, max_response_length=3, key_mode="state")
    tasks = [TaskSpec("gridnav", seed=s) for s in range(4) for _ in range(3)]
    pool = EnvPool() if pooled else None
    episodes = play_episodes(served, tasks, config, env_pool=pool)
    if pooled:  # a second round reuses the first round's environments (reset, not rebuilt)
        episodes += play_episodes(served, tasks, config, env_pool=pool)
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
    (episode,) = play_episodes(served, [TaskSpec("gridnav", seed=1)], config)
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

    episodes = play_episodes(served, [TaskSpec("gridnav", seed=2)] * 2, config, env_factory=factory)
    for ep in episodes:
        assert ep.length >= 2  # the steps before the failing one are kept; the failing step is not a row
        assert ep.env_error.startswith("EnvError") and "engine crashed" in ep.env_error
        assert f"step={ep.length + 1}" in ep.env_error


def test_a_failing_reset_gives_an_empty_episode_with_the_error(served):
    config = EpisodeConfig(max_steps=4, key_mode="state")
    (episode,) = play_episodes(served, [TaskSpec("gridnav", seed=0, split="no-such-split")], config)
    assert episode.steps == [] and "no-such-split" in episode.env_error


def test_env_kwargs_must_not_repeat_episode_settings(served):
    config = EpisodeConfig(max_steps=4, key_mode="state")
    (episode,) = play_episodes(served, [TaskSpec("gridnav", seed=0, env_kwargs={"max_steps": 3})], config)
    assert "env.max_steps" in episode.env_error


def test_env_error_type_carries_name_task_and_step():
    env = _FailingGridNav(max_steps=8, min_path=6)
    env.reset(seed=0)
    env.step("up")
    env.step("up")
    with pytest.raises(EnvError) as info:
        env.step("up")
    assert (info.value.env_name, info.value.step) == ("gridnav", 3) and info.value.task_id == env.task_id


# ------------------------------------------------------------------------------ tokenising: once per step, capped
class _CountingEncoder(ChatPromptEncoder):
    """The real chat-template encoder, counting how often it tokenises."""

    calls = 0

    def __call__(self, text):
        self.calls += 1
        return super().__call__(text)

    def encode_with_offsets(self, text):
        self.calls += 1
        return super().encode_with_offsets(text)


def _reencoding_reference(env, obs, info, history, encode, config):
    """The plain rule build_prompt follows, by re-encoding every candidate: the newest history that fits."""
    keep = min(config.history_length, len(history))
    for used in range(keep, -1, -1):
        text = env.render_prompt(obs, info, history[len(history) - used :] if used else [])
        ids = encode(text)
        if len(ids) <= config.max_prompt_length:
            return text, ids, used, False
    return text, ids[-config.max_prompt_length :], 0, True


@pytest.mark.parametrize("name", ["gridnav", "sokoban", "webshop", "search"])
def test_build_prompt_tokenises_once_and_equals_reencoding(served, name):
    tokenizer, _ = served
    env = make_env(name)
    obs, info = env.reset(seed=0)
    history = [(f"an earlier observation {i} " * (3 + i), f"action {i}") for i in range(4)]
    plain = ChatPromptEncoder(tokenizer)
    lengths = [len(plain(env.render_prompt(obs, info, history[len(history) - k :] if k else []))) for k in range(4)]
    # budgets that keep 3, 2, 1 and 0 history items, and one that cuts even the history-free prompt
    for budget in (lengths[3], lengths[3] - 1, lengths[2] - 1, lengths[1] - 1, lengths[0] - 7):
        config = EpisodeConfig(history_length=3, max_prompt_length=budget)
        encoder = _CountingEncoder(tokenizer)
        built = build_prompt(env, obs, info, history, encoder, config)
        assert encoder.calls == 1, budget
        assert built == _reencoding_reference(env, obs, info, history, plain, config), budget
        assert built[1] == plain(built[0]) or built[3]  # the spliced ids are the fresh encoding of the text
    # a plain callable (no offsets) gives the same prompts by re-encoding
    config = EpisodeConfig(history_length=3, max_prompt_length=lengths[1] - 1)
    assert build_prompt(env, obs, info, history, plain.__call__, config) == build_prompt(
        env, obs, info, history, plain, config
    )


class _HugeObservationGridNav(GridNavEnv):
    """Real gridnav whose first step, valid or not, answers with a 2 MB observation (the rest is normal)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if info["step"] == 1:
            obs = "the log of a broken tool\n" * 80_000 + obs
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("budget", [200, 2048])  # 2048: the capped observation (16,384 chars) is tokenised off the loop
def test_a_huge_observation_is_capped_and_each_prompt_tokenised_once(served, budget):
    tokenizer, server = served
    config = EpisodeConfig(max_steps=4, history_length=2, max_prompt_length=budget, max_response_length=3)
    encoder = _CountingEncoder(tokenizer)

    def factory(task, cfg):
        return _HugeObservationGridNav(max_steps=cfg.max_steps, key_mode=cfg.key_mode, min_path=6)

    async def main():
        return await run_episode(
            TaskSpec("gridnav", seed=3),
            generator=server,
            encoder=encoder,
            tokenizer=tokenizer,
            config=config,
            traj_id="huge",
            sampling_params=SAMPLING,
            env_factory=factory,
        )

    episode = asyncio.run(main())
    assert episode.env_error is None and episode.length == 4  # min_path=6: no win within 4 steps
    assert encoder.calls == episode.length  # one tokenisation per step, whatever was dropped or cut
    cut = [s.observation_truncated for s in episode.steps]
    assert cut == [False, True, False, False] and episode.num_observation_truncated == 1
    huge = episode.steps[1]
    assert len(huge.observation) == config.max_observation_chars == 8 * budget
    assert huge.observation.split("\n")[-1].startswith("walls:")  # the END is kept: the grid's own observation
    assert huge.prompt_truncated and len(huge.prompt_ids) == budget
    assert all(len(s.prompt_ids) <= budget for s in episode.steps)
    metrics = episode_metrics(summaries_from_episodes([episode]))
    assert metrics["env/observation_truncated_rate"] == pytest.approx(1 / 4)


class _Scripted:
    """A generator that always answers ``reply`` (token ids of the tiny model's tokenizer)."""

    def __init__(self, tokenizer, reply):
        self.ids = tokenizer.encode(reply, add_special_tokens=False)

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        return GenerationOutput(token_ids=list(self.ids))


@pytest.mark.parametrize("rule", ["admissible", "format"])
def test_the_invalid_action_rule_decides_the_penalty_and_what_is_sent(served, rule):
    """A well-formed reply naming no move: under ``admissible`` it is invalid, penalised and not executed; under
    ``format`` (the reference's rule) it is sent, costs the step, and is not penalised. The state stays either way."""
    tokenizer, _ = served
    config = EpisodeConfig(max_steps=3, history_length=2, max_response_length=64, invalid_action=rule)

    async def main():
        return await run_episode(
            TaskSpec("gridnav", seed=0),
            generator=_Scripted(tokenizer, "<think>I am stuck.</think><action>jump</action>"),
            encoder=ChatPromptEncoder(tokenizer),
            tokenizer=tokenizer,
            config=config,
            traj_id="rule",
            sampling_params={},
        )

    episode = asyncio.run(main())
    assert episode.length == 3 and len({s.anchor_key for s in episode.steps}) == 1  # the state never changed
    sent, valid, penalty = ("jump", True, 0.0) if rule == "format" else (None, False, 0.1)
    assert all((s.action, s.action_valid, s.step_reward) == (sent, valid, -penalty) for s in episode.steps)
    shown = "jump" if rule == "format" else "(invalid output)"
    assert episode.steps[-1].prompt_text.count(f" -> {shown}\n") == 2  # the history shows what was sent
