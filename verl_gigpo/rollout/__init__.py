"""Episode logic shared by the verl agent loop and the local engine: prompt, generate, parse, step, bookkeeping.

Imports environments, never an engine (neither verl glue nor :mod:`verl_gigpo.local`).
"""

from verl_gigpo.rollout.episode import ChatPromptEncoder, build_prompt, make_task_env, run_episode
from verl_gigpo.rollout.pool import EnvPool
from verl_gigpo.rollout.types import Episode, EpisodeConfig, GenerationOutput, Generator, StepRecord, TaskSpec

__all__ = [
    "ChatPromptEncoder",
    "EnvPool",
    "Episode",
    "EpisodeConfig",
    "GenerationOutput",
    "Generator",
    "StepRecord",
    "TaskSpec",
    "build_prompt",
    "make_task_env",
    "run_episode",
]
