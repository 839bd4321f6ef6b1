"""The episode runner shared by the verl agent loop and the local engine.

One call plays one episode of one task::

    episode = await run_episode(
        TaskSpec("sokoban", seed=3), generator=server, encoder=ChatPromptEncoder(tokenizer),
        tokenizer=tokenizer, config=EpisodeConfig(max_steps=20), traj_id="t0", sampling_params={...})

Each step: render the environment's prompt (task, last ``history_length`` steps, current observation,
admissible actions) -> encode (chat template) -> ``await generator.generate(...)`` -> decode -> ``parse_action``
-> ``env.step`` (in a thread, off the event loop) -> record a :class:`StepRecord`. Environment calls run in a
thread pool (or, for environments that are not thread-parallel, in worker processes) so that hundreds of episodes
proceed concurrently with no lock-step barrier between them, each call under its deadline
(:mod:`verl_gigpo.rollout.envcalls`).

An environment error (any exception from ``make``/``reset``/``step``, or a missed deadline) ends the episode:
``Episode.env_error`` holds the message, the steps played so far are kept, and the caller decides what to do with
them (the verl agent loop masks them out of training). Nothing is swallowed silently: the error is also logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from environments import TextEnv
from verl_gigpo.rollout.envcalls import EnvCalls
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.pool import EnvPool
from verl_gigpo.rollout.threads import EnvThreadPool
from verl_gigpo.rollout.types import Episode, EpisodeConfig, Generator, StepRecord, TaskSpec

__all__ = ["ChatPromptEncoder", "build_prompt", "run_episode"]

logger = logging.getLogger(__name__)

#: Shown in the history in place of an action when the reply held none.
INVALID_IN_HISTORY = "(invalid output)"


class ChatPromptEncoder:
    """Turn a prompt text into prompt token ids with the tokenizer's chat template (one user message).

    Args:
        tokenizer: a Hugging Face tokenizer. Without a chat template the raw text is encoded.
        system_prompt: optional system message placed before the user message.
        chat_template_kwargs: extra arguments for ``apply_chat_template`` (e.g. ``enable_thinking``).
    """

    def __init__(self, tokenizer: Any, system_prompt: str | None = None, chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def __call__(self, text: str) -> list[int]:
        """Return the token ids (P,) of ``text`` wrapped as a user turn plus the generation prompt."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        messages = [{"role": "user", "content": text}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        rendered = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )
        return list(self.tokenizer.encode(rendered, add_special_tokens=False))


def build_prompt(
    env: TextEnv,
    observation: str,
    info: dict[str, Any],
    history: list[tuple[str, str]],
    encoder: Callable[[str], list[int]],
    config: EpisodeConfig,
) -> tuple[str, list[int], int, bool]:
    """Render and encode the prompt, dropping the oldest history until it fits ``config.max_prompt_length``.

    Returns ``(prompt_text, prompt_ids, history_used, prompt_truncated)``. When even the history-free prompt
    is too long, its ids are cut from the LEFT (the end holds the observation and the format instruction).
    """
    keep = min(config.history_length, len(history))
    while True:
        text = env.render_prompt(observation, info, history[len(history) - keep :] if keep else [])
        ids = encoder(text)
        if len(ids) <= config.max_prompt_length:
            return text, ids, keep, False
        if keep == 0:
            return text, ids[-config.max_prompt_length :], 0, True
        keep -= 1


async def run_episode(
    task: TaskSpec,
    *,
    generator: Generator,
    encoder: Callable[[str], list[int]],
    tokenizer: Any,
    config: EpisodeConfig,
    traj_id: str,
    sampling_params: dict[str, Any],
    env_factory: Callable[[TaskSpec, EpisodeConfig], TextEnv] = make_task_env,
    executor: EnvThreadPool | None = None,
    env_pool: EnvPool | None = None,
    execution: EnvExecution | None = None,
) -> Episode:
    """Play one episode of ``task`` and return it with one :class:`StepRecord` per step.

    Args:
        task: which environment/task to play.
        generator: async ``generate(request_id, prompt_ids=..., sampling_params=...)`` (verl server manager or
            :class:`verl_gigpo.local.server.LocalGenerationServer`); the request id is ``traj_id`` for every
            step, so servers with sticky sessions keep the episode's prefix cache.
        encoder: prompt text -> prompt token ids (usually :class:`ChatPromptEncoder`).
        tokenizer: decodes the response (``skip_special_tokens=True``) before ``parse_action``.
        config: episode settings (step limit, history, lengths, penalty, key mode).
        traj_id: unique id of this trajectory.
        sampling_params: passed to the generator unchanged.
        env_factory: builds the environment (default: the registry, :func:`make_task_env`); ignored with a pool.
        executor: the threads environment calls run in (default: a process-wide pool of 64,
            :func:`verl_gigpo.rollout.envcalls.default_threads`; ``EnvThreadPool(0)`` runs them inline).
        env_pool: reuse environments across episodes (recommended when building one is expensive, e.g. ALFWorld);
            without a pool the environment is built for this episode and closed at its end. A pool with worker
            processes hosts the environments that are not thread-parallel there (:mod:`verl_gigpo.rollout.pool`).
        execution: the deadlines of environment calls (default :class:`EnvExecution`'s: 60 s a step, 300 s a
            reset); a missed one ends the episode with an ``EnvDeadlineError`` (:mod:`verl_gigpo.rollout.envcalls`).
    """
    episode = Episode(traj_id=traj_id, task=task)
    timing = {"generate": 0.0, "env": 0.0, "glue": 0.0}
    episode.timing = timing
    env: TextEnv | None = None
    calls = EnvCalls(
        task,
        config,
        episode,
        execution=execution if execution is not None else EnvExecution(),
        threads=executor,
        env_pool=env_pool,
        factory=env_factory,
    )

    async def finish(env: TextEnv) -> None:
        await calls.finish(env, broken=episode.env_error is not None)

    try:
        env = await calls.acquire()
        observation, info = await calls.reset(env)
    except Exception as exc:  # noqa: BLE001 - recorded on the episode and logged, never swallowed
        episode.env_error = f"{type(exc).__name__}: {exc}"
        logger.warning("episode %s: environment failed at reset: %s", traj_id, episode.env_error)
        if env is not None:
            await finish(env)
        return episode

    episode.task_id, episode.task_type = info.get("task_id"), info.get("task_type")
    history: list[tuple[str, str]] = []
    step_id = 0
    try:
        while True:
            glue_start = time.perf_counter()
            prompt_text, prompt_ids, used, cut = build_prompt(env, observation, info, history, encoder, config)
            timing["glue"] += time.perf_counter() - glue_start

            gen_start = time.perf_counter()
            out = await generator.generate(traj_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            timing["generate"] += time.perf_counter() - gen_start

            glue_start = time.perf_counter()
            response_ids = list(out.token_ids)[: config.max_response_length]
            logprobs = list(out.log_probs)[: config.max_response_length] if out.log_probs else None
            response_text = tokenizer.decode(response_ids, skip_special_tokens=True)
            action, valid = env.parse_action(response_text)
            timing["glue"] += time.perf_counter() - glue_start

            try:
                next_obs, env_reward, terminated, truncated, next_info = await calls.step(env, action, step_id)
            except Exception as exc:  # noqa: BLE001 - recorded on the episode and logged, never swallowed
                episode.env_error = f"{type(exc).__name__}: {exc}"
                logger.warning("episode %s: environment failed at step %d: %s", traj_id, step_id, episode.env_error)
                break

            step_reward = float(env_reward) - (0.0 if valid else config.invalid_action_penalty)
            episode.steps.append(
                StepRecord(
                    step_id=step_id,
                    observation=observation,
                    anchor_key=info["anchor_key"],
                    prompt_text=prompt_text,
                    prompt_ids=prompt_ids,
                    response_ids=response_ids,
                    response_logprobs=logprobs,
                    response_text=response_text,
                    action=action,
                    action_valid=valid,
                    env_reward=float(env_reward),
                    step_reward=step_reward,
                    terminated=terminated,
                    truncated=truncated,
                    won=bool(next_info.get("won", False)),
                    history_used=used,
                    history_dropped=min(config.history_length, len(history)) - used,
                    prompt_truncated=cut,
                    generation_info=dict(getattr(out, "extra_fields", None) or {}),
                )
            )
            episode.episode_return += step_reward
            history.append((observation, action if valid else INVALID_IN_HISTORY))
            observation, info = next_obs, next_info
            step_id += 1
            if terminated or truncated:
                break
    finally:
        await finish(env)

    episode.won = bool(episode.steps and episode.steps[-1].won)
    return episode
