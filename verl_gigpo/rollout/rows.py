"""One episode -> its step rows: the one schema of a training row, for both engines and the credit records.

    rows = episode_rows(episode, text_chars=200)   # one EpisodeRow per step (one placeholder row if it failed at reset)

verl's agent loop (:func:`verl_gigpo.verl_glue.agent_loop.episode_to_outputs`) puts each row's :attr:`EpisodeRow.fields`
into ``AgentLoopOutput.extra_fields``; :meth:`StepBatch.from_rows <verl_gigpo.rollout.step_rows.StepBatch.from_rows>`
reads them back on verl's trainer mode, :meth:`StepBatch.from_episodes
<verl_gigpo.rollout.step_rows.StepBatch.from_episodes>` reads them straight from this function on the local engine, and
the credit records read the same columns. The fields, the same names everywhere:

=====================  ===========================================================================================
traj_id                the episode's trajectory id (verl: ``{uid}_{session_id}``), unique per trajectory
step_id                0-based step index
anchor_key             anchor key of the state the action was taken from (``algorithm.gigpo.key_mode``)
step_reward            environment reward minus ``env.invalid_action_penalty`` when the reply was invalid
env_reward             environment reward alone
action_valid           the reply was valid under ``env.invalid_action`` (``admissible`` or ``format``)
won                    the EPISODE was won (same on every row of the trajectory)
env_name, task_id      environment and its task id; task_type (e.g. ALFWorld's pick/clean/...), split, seed
env_error              the environment raised or missed a deadline; the episode stopped there and its rows are
                       masked (no statistic, no loss); env_error_message: what happened ("" when nothing did)
abandoned_threads      the episode's environment calls abandoned in a thread at a deadline (0 or 1)
history_dropped        past steps dropped from this prompt to fit ``data.max_prompt_length``
prompt_truncated       the prompt's ids were cut from the left (``env.prompt.overlong=cut_left``)
observation_truncated  the step's observation was cut to 8 characters per prompt token before tokenising
episode_length         number of steps of the episode (0: failed at reset); episode_return: sum of its step rewards
env_seconds            seconds the episode spent inside the environment; generate_seconds: awaiting the generator
observation, action    only with ``text_chars`` > 0 (credit records on): the step's observation and the parsed action
                       (the reply when invalid), cut to ``text_chars`` characters
=====================  ===========================================================================================

The placeholder rule, written here only: an episode whose environment failed before its first step has one row
(``step_id`` 0, empty anchor key, rewards 0, ``action_valid`` False, no tokens) carrying every field a real row
carries, so that the failure is counted (``env/env_error_rate``) while the row takes part in no statistic and no loss.
verl's agent loop gives that row a short prompt and one EOS token with response_mask 0 (verl needs a token).

Plain Python (no verl, no numpy): :mod:`verl_gigpo.rollout` serves both engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_gigpo.rollout.types import Episode

__all__ = ["REQUIRED_FIELDS", "EpisodeRow", "action_text", "episode_rows", "truncate_text"]

#: the fields every row carries and a step-credit estimator cannot do without (a row lacking one was not written by
#: :func:`episode_rows`: wrong agent loop)
REQUIRED_FIELDS = ("traj_id", "step_id", "anchor_key", "step_reward", "action_valid", "won", "env_error")


@dataclass(frozen=True)
class EpisodeRow:
    """One step row of an episode.

    fields: the row's fields (the table of the module docstring; verl's ``extra_fields``).
    prompt_ids, response_ids: the step's token ids (P,) and (R,); empty for the placeholder row.
    response_logprobs: the generator's log-probs of the response tokens (R,), or None (placeholder, or none reported).
    generation_info: the generator output's extra fields (verl's servers report the weight versions there).
    placeholder: the row stands for an episode that failed at reset (it is no step).
    """

    fields: dict[str, Any]
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None
    generation_info: dict[str, Any]
    placeholder: bool = False


def episode_rows(episode: Episode, *, text_chars: int = 0) -> list[EpisodeRow]:
    """The step rows of ``episode``: one per step in step order, or one placeholder row when its environment failed
    before the first step (see the module docstring for the fields and the placeholder rule).

    Args:
        episode: a finished episode.
        text_chars: > 0 adds ``observation`` and ``action`` texts cut to that many characters (credit records);
            0 adds none.

    Returns:
        ``max(episode.length, 1)`` rows.
    """
    common = {
        "traj_id": episode.traj_id,
        "env_name": episode.task.env_name,
        "task_id": episode.task_id,
        "task_type": episode.task_type,
        "split": episode.task.split,
        "seed": episode.task.seed,
        "won": bool(episode.won),
        "env_error": episode.env_error is not None,
        "env_error_message": episode.env_error or "",
        "episode_length": int(episode.length),
        "episode_return": float(episode.episode_return),
        "env_seconds": float(episode.timing.get("env", 0.0)),
        "generate_seconds": float(episode.timing.get("generate", 0.0)),
        "abandoned_threads": int(episode.abandoned_threads),
    }
    if not episode.steps:
        placeholder = {
            **common,
            "step_id": 0,
            "anchor_key": "",
            "step_reward": 0.0,
            "env_reward": 0.0,
            "action_valid": False,
            "history_dropped": 0,
            "prompt_truncated": False,
            "observation_truncated": False,
            **({"observation": "", "action": ""} if text_chars > 0 else {}),
        }
        return [EpisodeRow(placeholder, [], [], None, {}, placeholder=True)]
    rows = []
    for step in episode.steps:
        fields = {
            **common,
            "step_id": int(step.step_id),
            "anchor_key": step.anchor_key,
            "step_reward": float(step.step_reward),
            "env_reward": float(step.env_reward),
            "action_valid": bool(step.action_valid),
            "history_dropped": int(step.history_dropped),
            "prompt_truncated": bool(step.prompt_truncated),
            "observation_truncated": bool(step.observation_truncated),
        }
        if text_chars > 0:
            fields["observation"] = truncate_text(step.observation, text_chars)
            fields["action"] = truncate_text(
                action_text(step.action, step.response_text, step.action_valid), text_chars
            )
        rows.append(
            EpisodeRow(
                fields,
                list(step.prompt_ids),
                list(step.response_ids),
                step.response_logprobs,
                dict(step.generation_info),
            )
        )
    return rows


def truncate_text(text: Any, max_chars: int) -> str:
    """``str(text)`` cut to at most ``max_chars`` characters (the last one an ellipsis when cut); None -> ""."""
    if text is None:
        return ""
    text = str(text)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def action_text(action: Any, response_text: str, action_valid: bool) -> str:
    """The action a row shows: the parsed action when the reply held a valid one, else the reply itself."""
    return str(action) if action_valid and action is not None else str(response_text)
