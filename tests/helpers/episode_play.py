"""Play tasks concurrently through the episode runner with a real tokenizer and generation server (tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, TaskSpec, run_episode

#: sampling of the played episodes: temperature 1, replies of up to 3 tokens (action word, EOS, one spare)
SAMPLING = {"temperature": 1.0, "max_tokens": 3}


def play_episodes(served: tuple[Any, Any], tasks: Sequence[TaskSpec], config: EpisodeConfig, **kwargs: Any) -> list:
    """``run_episode`` for every task at once (trajectory ids ``traj0``, ``traj1``, ...), with ``served`` =
    (tokenizer, generation server) and :data:`SAMPLING`; ``kwargs`` go to ``run_episode``. Returns the episodes in
    task order."""
    tokenizer, server = served

    async def main() -> list:
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
