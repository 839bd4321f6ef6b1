"""Episode logic shared by the verl agent loop and the local engine: prompt, generate, parse, step, bookkeeping.

Imports environments, never an engine (neither verl glue nor :mod:`verl_gigpo.local`). Its modules import each
other one way, bottom up: ``types`` (data) <- ``factory`` (building an environment); ``execution`` (deadline and
worker settings), ``threads`` (a thread pool that survives hung calls), ``wire`` (the pipe protocol) <-
``procpool`` (environments in worker processes; ``procworker`` is the worker's ``__main__``, imported by nothing)
<- ``pool`` <- ``envcalls`` (an episode's environment calls under their deadlines) <- ``episode``; ``metrics`` (the
episode metrics) and ``rows`` (one episode -> its step rows: the one schema of a training row, for verl's agent loop,
both engines' batches and the credit records) <- ``step_rows`` (one training batch's step rows, :class:`StepBatch`,
for both engines).
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
