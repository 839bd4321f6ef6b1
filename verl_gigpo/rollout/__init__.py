"""Episode logic shared by the verl agent loop and the local engine: prompt, generate, parse, step, bookkeeping.

Imports environments, never an engine. Bottom up: ``types`` <- ``factory``; ``execution/`` (where and how long
environment calls run) <- ``episode``; ``metrics`` and ``rows`` (the step-row schema) <- ``step_rows``.
"""

from verl_gigpo.rollout.episode import (
    ChatPromptEncoder,
    PromptTooLongError,
    build_prompt,
    chat_template_kwargs_from,
    run_episode,
)
from verl_gigpo.rollout.execution.pool import EnvPool
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.types import (
    Episode,
    EpisodeConfig,
    GenerationOutput,
    Generator,
    PromptOptions,
    StepRecord,
    TaskSpec,
)

__all__ = [
    "ChatPromptEncoder",
    "EnvPool",
    "Episode",
    "EpisodeConfig",
    "GenerationOutput",
    "Generator",
    "PromptOptions",
    "PromptTooLongError",
    "StepBatch",
    "StepRecord",
    "TaskSpec",
    "build_prompt",
    "chat_template_kwargs_from",
    "make_task_env",
    "run_episode",
]
