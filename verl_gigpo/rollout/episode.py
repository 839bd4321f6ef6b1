"""The episode runner shared by the verl agent loop and the local engine.

One call plays one episode of one task::

    episode = await run_episode(
        TaskSpec("sokoban", seed=3), generator=server, encoder=ChatPromptEncoder(tokenizer),
        tokenizer=tokenizer, config=EpisodeConfig(max_steps=20), traj_id="t0", sampling_params={...})

Each step: render the prompt -> encode -> generate -> decode -> ``parse_action`` -> ``env.step`` (off the event
loop, under its deadline) -> a :class:`StepRecord`. An environment error or a missed deadline ends the episode
(``Episode.env_error``, logged). Prompts and their budget: docs/environments.md#long-observations-and-the-prompt-budget;
where environment calls run: docs/environments-execution.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from environments import TextEnv
from environments.images import IMAGE_INFO_KEY
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.execution.envcalls import EnvCalls
from verl_gigpo.rollout.execution.pool import EnvPool
from verl_gigpo.rollout.execution.threads import EnvThreadPool
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.prompts import image_parts, render_prompt
from verl_gigpo.rollout.seeding import EpisodeSeeds
from verl_gigpo.rollout.types import Episode, EpisodeConfig, Generator, StepRecord, TaskSpec

__all__ = [
    "OFFLOAD_PROMPT_CHARS",
    "ChatPromptEncoder",
    "PromptTooLongError",
    "RESERVED_TEMPLATE_KWARGS",
    "build_prompt",
    "cap_observation",
    "chat_template_kwargs_from",
    "run_episode",
]

logger = logging.getLogger(__name__)

#: Prompts whose observations (current and shown history) hold more characters than this are rendered and
#: tokenised in a worker thread (docs/environments.md#long-observations-and-the-prompt-budget)
OFFLOAD_PROMPT_CHARS = 8_192

#: The longest run of characters :func:`_removed_block` slides a removed block left to align it with tokens.
_MAX_SLIDE = 256


#: ``apply_chat_template`` arguments the encoder sets itself (or that change what the call returns): refused in
#: ``data.apply_chat_template_kwargs``
RESERVED_TEMPLATE_KWARGS = (
    "conversation",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "return_dict",
    "return_tensors",
    "return_assistant_tokens_mask",
)

#: (chat template, kwargs) pairs whose effect :class:`ChatPromptEncoder` has checked in this process: the verl
#: agent loop builds an encoder per episode, and one warning per process is enough
_CHECKED_TEMPLATE_KWARGS: set[tuple[str, str]] = set()


def chat_template_kwargs_from(value: Any, *, key: str = "data.apply_chat_template_kwargs") -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` as a plain dict (None is ``{}``), e.g. ``{"enable_thinking": False}``.

    Raises ValueError naming ``key``: not a mapping, a non-string key, or a key in :data:`RESERVED_TEMPLATE_KWARGS`.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{key} must be a mapping of chat-template arguments (e.g. {key}.enable_thinking=false), got {value!r}"
        )
    out = {}
    for name, item in value.items():
        if not isinstance(name, str):
            raise ValueError(f"{key} has a key that is not a string: {name!r}")
        if name in RESERVED_TEMPLATE_KWARGS:
            raise ValueError(
                f"{key}.{name} is set by the episode runner itself (it renders one user turn plus the generation "
                f"prompt, as text); remove it: {key} holds the arguments the chat template reads, e.g. enable_thinking"
            )
        out[name] = _plain(item)
    return out


def _plain(value: Any) -> Any:
    """``value`` with mappings as dicts and sequences (not strings) as lists, recursively."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


class ChatPromptEncoder:
    """Turn a prompt text into prompt token ids with the tokenizer's chat template (one user message; the raw text
    without a template). ``processor`` (verl's ``model_config.processor``) encodes observations with images;
    ``chat_template_kwargs`` the template does not read are warned about once per process."""

    def __init__(
        self,
        tokenizer: Any,
        system_prompt: str | None = None,
        chat_template_kwargs: dict | None = None,
        processor: Any = None,
    ):
        self.tokenizer = tokenizer
        self.processor = processor
        self.system_prompt = system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if self.chat_template_kwargs:
            self._check_template_kwargs()

    def _check_template_kwargs(self) -> None:
        """Warn once per process about template arguments that cannot change the prompt."""
        template = getattr(self.tokenizer, "chat_template", None)
        probe = (str(template), repr(sorted(self.chat_template_kwargs.items())))
        if probe in _CHECKED_TEMPLATE_KWARGS:
            return
        _CHECKED_TEMPLATE_KWARGS.add(probe)
        if template is None:
            names = ", ".join(sorted(self.chat_template_kwargs))
            logger.warning("chat-template arguments (%s) are ignored: the tokenizer has no chat template", names)
            return
        unread = sorted(name for name in self.chat_template_kwargs if name not in str(template))
        if unread:
            logger.warning(
                "chat-template arguments (%s) change nothing in the prompt: this model's chat template does not read "
                "them (data.apply_chat_template_kwargs)",
                ", ".join(unread),
            )

    def encode_with_images(self, text: str, images: Sequence[Any]) -> list[int]:
        """The prompt ids (P,) of one user turn holding ``images`` where ``text`` has a template's ``{image}`` (else
        before it), placeholders expanded as verl's vLLM path does. Raises ValueError without a processor."""
        if self.processor is None:
            raise ValueError(
                "the observation has images but the model has no processor: use a vision-language model "
                "(e.g. python -m verl_gigpo.dev.tiny_vl_model) or the environment's text observation"
            )
        content = image_parts(text, len(images))
        messages = [{"role": "user", "content": content}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        rendered = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )
        return [int(i) for i in self.processor(text=[rendered], images=list(images))["input_ids"][0]]

    def __call__(self, text: str) -> list[int]:
        """Return the token ids (P,) of ``text`` wrapped as a user turn plus the generation prompt."""
        return list(self.tokenizer.encode(self._render(text), add_special_tokens=False))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int] | None]:
        """``(ids (P,), starts (P,))``: each token's start position in ``text`` (template tokens outside
        ``[0, len(text))``); ``starts`` is None without offsets or when the template alters ``text``."""
        rendered = self._render(text)
        at = rendered.rfind(text)
        try:
            encoded = self.tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError:  # slow (Python) tokenizers have no offsets
            return list(self.tokenizer.encode(rendered, add_special_tokens=False)), None
        ids = list(encoded["input_ids"])
        if at < 0:
            return ids, None
        return ids, [start - at for start, _ in encoded["offset_mapping"]]

    def _render(self, text: str) -> str:
        """``text`` as one user turn plus the generation prompt (the chat template), or as is without a template."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            return text
        messages = [{"role": "user", "content": text}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )


class PromptTooLongError(ValueError):
    """A prompt over ``max_prompt_length`` under ``env.prompt.overlong=fail_episode`` (or with images): the episode
    fails there."""


def cap_observation(text: str, max_chars: int) -> tuple[str, bool]:
    """``(text, False)``, or ``(its last max_chars characters, True)`` when longer."""
    if len(text) <= max_chars:
        return text, False
    return text[len(text) - max_chars :], True


def build_prompt(
    env: TextEnv,
    observation: str,
    info: dict[str, Any],
    history: list[tuple[str, str]],
    encoder: Callable[[str], list[int]],
    config: EpisodeConfig,
    images: Sequence[Any] | None = None,
) -> tuple[str, list[int], int, bool]:
    """Render and encode the prompt with the last ``config.history_length`` steps of ``history`` and fit it into
    ``config.max_prompt_length`` tokens by ``config.prompt.overlong`` (docs/environments.md, "Long observations and
    the prompt budget"). ``images`` default to ``info["images"]``; a prompt with images is never cut.

    Returns ``(prompt_text, prompt_ids (P,), history_used, prompt_truncated)``.
    Raises PromptTooLongError under ``fail_episode``, or when a prompt with images cannot fit.
    """
    options, limit = config.prompt, config.max_prompt_length
    images = list(info.get(IMAGE_INFO_KEY) or []) if images is None else list(images)
    if images:  # the current observation's images only (the reference's visual prompt keeps no past images)
        encode_images = getattr(encoder, "encode_with_images", None)
        if encode_images is None:
            raise ValueError("the observation has images; encode prompts with ChatPromptEncoder(processor=...)")
        encoder = functools.partial(encode_images, images=images)  # a plain callable: no token offsets
    keep = min(config.history_length, len(history))
    shown = list(history[len(history) - keep :]) if keep else []
    text = render_prompt(env, observation, info, shown, options)
    above = options.history_free_above_chars
    if keep and above is not None and len(text) > above:
        keep, shown = 0, []
        text = render_prompt(env, observation, info, shown, options)
    encode_with_offsets = getattr(encoder, "encode_with_offsets", None)
    if encode_with_offsets is None:
        ids, starts = encoder(text), None
    else:
        ids, starts = encode_with_offsets(text)
    if len(ids) <= limit:
        return text, ids, keep, False
    if options.overlong == "fail_episode":
        raise PromptTooLongError(
            f"the prompt at step {info.get('step', 0)} has {len(ids)} tokens with {keep} history item(s), over "
            f"data.max_prompt_length={limit}; env.prompt.overlong=fail_episode ends the episode (its rows are left "
            "out of training); drop_history or cut_left would shorten the prompt instead"
        )
    if images and (options.overlong == "cut_left" or keep == 0):
        raise PromptTooLongError(
            f"the prompt at step {info.get('step', 0)} has {len(ids)} tokens with its image(s), over "
            f"data.max_prompt_length={limit}; a prompt with images cannot be cut: raise data.max_prompt_length or "
            "draw smaller images"
        )
    if options.overlong == "cut_left" or keep == 0:
        return text, ids[-limit:], keep, True
    drop = 0
    if starts is not None:
        first_token_at: dict[int, int] = {}
        for index, start in enumerate(starts):
            first_token_at.setdefault(start, index)
        while drop < keep:
            drop += 1
            shorter = render_prompt(env, observation, info, shown[drop:], options)
            cut = _removed_block(text, shorter, first_token_at)
            if cut is None:
                logger.debug("build_prompt: dropped history does not align with tokens; encoding afresh")
                break
            kept = ids[: cut[0]] + ids[cut[1] :]
            if len(kept) <= limit:
                return shorter, kept, keep - drop, False
            if drop == keep:
                return shorter, kept[-limit:], 0, True
        drop -= 1  # that drop could not be spliced: encode it (and any further one) afresh below
    while True:
        drop += 1
        shorter = render_prompt(env, observation, info, shown[drop:], options)
        ids = encoder(shorter)
        if len(ids) <= limit:
            return shorter, ids, keep - drop, False
        if drop >= keep:
            if images:
                raise PromptTooLongError(
                    f"the prompt at step {info.get('step', 0)} has {len(ids)} tokens with its image(s) and no history, "
                    f"over data.max_prompt_length={limit}: raise data.max_prompt_length or draw smaller images"
                )
            return shorter, ids[-limit:], 0, True


def _removed_block(full: str, shorter: str, first_token_at: dict[int, int]) -> tuple[int, int] | None:
    """The token range ``(i, j)`` of ``full``'s ids whose removal gives ``shorter``'s, when ``shorter`` is ``full``
    less one block starting and ending at token starts (slid left over repeated text to align); else None."""
    removed = len(full) - len(shorter)
    if removed <= 0:
        return None
    lo, hi = 0, len(shorter)  # longest common prefix, by bisection over C-speed slice compares
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if full[:mid] == shorter[:mid]:
            lo = mid
        else:
            hi = mid - 1
    start = lo
    if full[start + removed :] != shorter[start:]:
        return None  # more than one block differs
    for a in range(start, max(start - _MAX_SLIDE, 0) - 1, -1):
        if a < start and full[a] != full[a + removed]:
            break  # sliding further would change the text
        if a in first_token_at and a + removed in first_token_at:
            return first_token_at[a], first_token_at[a + removed]
    return None


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
    group_id: str | None = None,
    seeds: EpisodeSeeds | None = None,
) -> Episode:
    """Play one episode of ``task`` and return it with one :class:`StepRecord` per step.

    ``generator.generate(traj_id, prompt_ids=..., sampling_params=...)`` is called with ``traj_id`` on every step
    (sticky sessions keep the prefix cache). ``executor`` (default: a shared pool of 64 threads), ``env_pool`` (reuse
    environments, or host them in worker processes) and ``execution`` (deadlines) say where and how long environment
    calls run; ``seeds`` sets each step's request seed (None: ``sampling_params`` as given).
    """
    episode = Episode(traj_id=traj_id, task=task, group_id=group_id, seeds=seeds)
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
    observation, observation_cut = cap_observation(observation, config.max_observation_chars)
    keep = config.history_length
    # env.prompt.image_history: past steps whose images the prompt shows before the current observation's
    image_history, history_images = config.prompt.image_history, []
    current_images = list(info.get(IMAGE_INFO_KEY) or [])
    try:
        while True:
            glue_start = time.perf_counter()
            shown = history[len(history) - keep :] if keep else []
            shown_chars = len(observation) + sum(len(obs) for obs, _ in shown)
            images = [*(image for past in history_images[-image_history:] for image in past), *current_images]
            prompt_args = (env, observation, info, history, encoder, config, images)
            try:
                if shown_chars > OFFLOAD_PROMPT_CHARS:  # long prompts are tokenised off the event loop
                    built = await asyncio.get_running_loop().run_in_executor(None, build_prompt, *prompt_args)
                else:
                    built = build_prompt(*prompt_args)
            except PromptTooLongError as exc:  # env.prompt.overlong=fail_episode: recorded and logged
                episode.env_error = f"{type(exc).__name__}: {exc}"
                logger.warning("episode %s: %s", traj_id, exc)
                break
            prompt_text, prompt_ids, used, cut = built
            timing["glue"] += time.perf_counter() - glue_start

            gen_start = time.perf_counter()
            params = sampling_params if seeds is None else seeds.sampling_params(sampling_params, step_id)
            if images:  # verl's server manager and rollout servers take images as image_data
                out = await generator.generate(
                    traj_id, prompt_ids=prompt_ids, sampling_params=params, image_data=list(images)
                )
            else:
                out = await generator.generate(traj_id, prompt_ids=prompt_ids, sampling_params=params)
            timing["generate"] += time.perf_counter() - gen_start

            glue_start = time.perf_counter()
            response_ids = list(out.token_ids)[: config.max_response_length]
            logprobs = list(out.log_probs)[: config.max_response_length] if out.log_probs else None
            response_text = tokenizer.decode(response_ids, skip_special_tokens=True)
            if config.invalid_action == "admissible":  # the contract's default (environments overriding it too)
                action, valid = env.parse_action(response_text)
            else:  # format: a well-formed command is sent even when it is not an action now
                action, valid = env.parse_action(response_text, rule=config.invalid_action)
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
                    observation_truncated=observation_cut,
                    generation_info=dict(getattr(out, "extra_fields", None) or {}),
                    images=list(images),
                )
            )
            episode.episode_return += step_reward
            history.append((observation, config.prompt.history_action(action, response_text)))
            if image_history:
                history_images.append(current_images)
            current_images = list(next_info.get(IMAGE_INFO_KEY) or [])
            (observation, observation_cut), info = cap_observation(next_obs, config.max_observation_chars), next_info
            step_id += 1
            if terminated or truncated:
                break
    finally:
        await finish(env)

    episode.won = bool(episode.steps and episode.steps[-1].won)
    return episode
