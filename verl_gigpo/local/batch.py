"""The step rows of one iteration of the local engine: what the rollout hands to the advantages and the update.

    batch = LocalBatch.from_episodes(episodes, n)    # episodes in (task, member) order, n members per task

One row per environment step (N rows) of every episode that ran without an environment error, in a fixed order:
task, member, step. Episodes with an error are dropped (with a warning); trajectory ids count the episodes kept.
(The verl engine's per-row step data, built from verl's batch, is :class:`verl_gigpo.trainer.StepBatch`.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verl_gigpo.rollout import Episode

__all__ = ["LocalBatch"]

logger = logging.getLogger(__name__)


@dataclass
class LocalBatch:
    """The step rows of one iteration (N rows, T trajectories kept), in a fixed order: task, member, step."""

    prompts: list[list[int]]  # (N,) prompt token ids of each row
    responses: list[list[int]]  # (N,) response token ids of each row
    rollout_logprobs: list[list[float] | None]  # (N,) the server's log-probs of the response tokens
    rewards: np.ndarray  # (N,) float64
    group_ids: np.ndarray  # (N,) int64, the task index
    traj_ids: np.ndarray  # (N,) int64
    step_ids: np.ndarray  # (N,) int64
    anchor_keys: np.ndarray  # (N,) object (str)
    traj_returns: np.ndarray  # (T,) float64, one per trajectory kept
    traj_groups: np.ndarray  # (T,) int64
    won: np.ndarray | None = None  # (N,) bool, the row's episode was won
    action_valid: np.ndarray | None = None  # (N,) bool, the row's reply held a valid action

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def from_episodes(cls, episodes: Sequence[Episode], n: int) -> LocalBatch:
        """The rows of ``episodes``, given in (task, member) order with ``n`` members per task (the task index of
        episode ``i`` is ``i // n``)."""
        prompts, responses, logprobs = [], [], []
        rewards, groups, trajs, steps, keys, won, valid = [], [], [], [], [], [], []
        traj_returns, traj_groups = [], []
        for index, ep in enumerate(episodes):
            if ep.env_error is not None:
                logger.warning("episode %s dropped from training: %s", ep.traj_id, ep.env_error)
                continue
            group = index // n
            traj = len(traj_returns)
            traj_returns.append(ep.episode_return)
            traj_groups.append(group)
            for s in ep.steps:
                prompts.append(list(s.prompt_ids))
                responses.append(list(s.response_ids))
                logprobs.append(s.response_logprobs)
                rewards.append(s.step_reward)
                groups.append(group)
                trajs.append(traj)
                steps.append(s.step_id)
                keys.append(s.anchor_key)
                won.append(bool(ep.won))
                valid.append(bool(s.action_valid))
        return cls(
            prompts=prompts,
            responses=responses,
            rollout_logprobs=logprobs,
            rewards=np.asarray(rewards, dtype=np.float64),
            group_ids=np.asarray(groups, dtype=np.int64),
            traj_ids=np.asarray(trajs, dtype=np.int64),
            step_ids=np.asarray(steps, dtype=np.int64),
            anchor_keys=np.asarray(keys, dtype=object),
            traj_returns=np.asarray(traj_returns, dtype=np.float64),
            traj_groups=np.asarray(traj_groups, dtype=np.int64),
            won=np.asarray(won, dtype=bool),
            action_valid=np.asarray(valid, dtype=bool),
        )
