"""A synthetic :class:`verl_gigpo.rollout.StepRecord` for tests of the row conversion and the episode metrics."""

from __future__ import annotations

from verl_gigpo.rollout import StepRecord


def make_step(
    i: int,
    *,
    valid: bool = True,
    reward: float = 0.0,
    dropped: int = 0,
    versions: tuple[int, int] | None = None,
    cut: bool = False,
) -> StepRecord:
    """Step ``i`` of a made-up episode: a 3-token prompt, a 2-token reply ``up`` (or no valid action, which costs
    the 0.1 invalid-action penalty in ``step_reward``), ``dropped`` history items, an observation cut to the cap
    when ``cut``, and, when ``versions`` is given, the rollout server's weight versions
    ``(min_global_steps, max_global_steps)`` in ``generation_info``."""
    return StepRecord(
        step_id=i,
        observation=f"obs{i}",
        anchor_key=f"key{i}",
        prompt_text="p",
        prompt_ids=[1, 2, 3],
        response_ids=[7, 8],
        response_logprobs=[-0.5, -0.25],
        response_text="up",
        action="up" if valid else None,
        action_valid=valid,
        env_reward=reward,
        step_reward=reward - (0.0 if valid else 0.1),
        terminated=False,
        truncated=False,
        won=False,
        history_dropped=dropped,
        observation_truncated=cut,
        generation_info={} if versions is None else {"min_global_steps": versions[0], "max_global_steps": versions[1]},
    )
