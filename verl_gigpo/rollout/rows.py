"""One episode -> its step rows: the one schema of a training row, for both engines and the credit records.

    rows = episode_rows(episode, text_chars=200)   # one EpisodeRow per step (one placeholder row if it failed at reset)

:data:`ROW_FIELDS` declares every field once; the writer (:func:`episode_rows`, verl's ``extra_fields``), the
readers (``StepBatch``) and the table in docs/estimators.md#the-step-row-schema (checked by a test) derive from it.
Plain Python (no verl, no numpy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verl_gigpo.rollout.types import Episode

__all__ = [
    "IMAGES_FIELD",
    "REQUIRED_FIELDS",
    "ROW_FIELDS",
    "EpisodeRow",
    "RowField",
    "action_text",
    "episode_rows",
    "schema_table",
    "truncate_text",
]

EPISODE = "episode"
"""The :attr:`RowField.level` of a field that describes the whole episode (the same on each of its rows)."""


@dataclass(frozen=True)
class RowField:
    """One field of a step row: its key, ``StepBatch`` column and dtype, reader's ``default``, ``placeholder`` (for
    a ``"step"`` field on a failed episode's placeholder row), ``read`` (from the episode or the step) and ``doc``.
    ``text`` fields are written only with ``text_chars`` > 0."""

    name: str
    dtype: str
    default: Any
    doc: str
    level: str
    read: Callable[[Any], Any]
    placeholder: Any = None
    column: str | None = None
    required: bool = False
    text: bool = False


def _timing(key: str) -> Callable[[Episode], float]:
    return lambda ep: float(ep.timing.get(key, 0.0))


#: every field of a step row, in the order the writer emits them
# fmt: off
ROW_FIELDS: tuple[RowField, ...] = (
    RowField(
        "traj_id", "object", "", "the trajectory id (verl: ``{uid}_{session_id}``), unique per trajectory", EPISODE,
        lambda ep: ep.traj_id, column="traj_ids", required=True,
    ),
    RowField("env_name", "object", None, "the environment's registered name", EPISODE, lambda ep: ep.task.env_name),
    RowField("task_id", "object", None, "the task's id", EPISODE, lambda ep: ep.task_id, column="task_ids"),
    RowField(
        "task_type", "object", None, "the task's type (e.g. ALFWorld's pick/clean/...)", EPISODE,
        lambda ep: ep.task_type, column="task_types",
    ),
    RowField("split", "object", None, "the task's split", EPISODE, lambda ep: ep.task.split),
    RowField("seed", "object", None, "the task's seed", EPISODE, lambda ep: ep.task.seed),
    RowField(
        "won", "bool", False, "the EPISODE was won (same on every row of the trajectory)", EPISODE,
        lambda ep: bool(ep.won), column="won", required=True,
    ),
    RowField(
        "env_error", "bool", False, "the environment raised or missed a deadline: its rows are masked", EPISODE,
        lambda ep: ep.env_error is not None, column="env_error", required=True,
    ),
    RowField(
        "env_error_message", "object", "", "what happened (empty when nothing did)", EPISODE,
        lambda ep: ep.env_error or "",
    ),
    RowField(
        "episode_length", "int64", -1, "steps of the episode (0: failed at reset; -1 when unknown)", EPISODE,
        lambda ep: int(ep.length), column="episode_lengths",
    ),
    RowField(
        "episode_return", "float64", 0.0, "the sum of the episode's step rewards", EPISODE,
        lambda ep: float(ep.episode_return),
    ),
    RowField(
        "env_seconds", "float64", 0.0, "seconds the episode spent inside the environment", EPISODE, _timing("env"),
        column="env_seconds",
    ),
    RowField(
        "generate_seconds", "float64", 0.0, "seconds the episode awaited the generator", EPISODE,
        _timing("generate"), column="generate_seconds",
    ),
    RowField(
        "abandoned_threads", "int64", 0, "environment calls abandoned in a thread at a deadline (0 or 1)", EPISODE,
        lambda ep: int(ep.abandoned_threads), column="abandoned_threads",
    ),
    RowField(
        "step_id", "int64", 0, "0-based step index", "step", lambda st: int(st.step_id), placeholder=0,
        column="step_ids", required=True,
    ),
    RowField(
        "anchor_key", "object", "", "anchor key of the state the action was taken from (``algorithm.gigpo.key_mode``)",
        "step", lambda st: st.anchor_key, placeholder="", column="anchor_keys", required=True,
    ),
    RowField(
        "step_reward", "float64", 0.0, "environment reward minus ``env.invalid_action_penalty`` when invalid", "step",
        lambda st: float(st.step_reward), placeholder=0.0, column="step_rewards", required=True,
    ),
    RowField(
        "env_reward", "float64", None, "environment reward alone (a row that lacks it: its step reward)", "step",
        lambda st: float(st.env_reward), placeholder=0.0,
    ),
    RowField(
        "action_valid", "bool", True, "the reply was valid under ``env.invalid_action``", "step",
        lambda st: bool(st.action_valid), placeholder=False, column="action_valid", required=True,
    ),
    RowField(
        "history_dropped", "int64", 0, "past steps dropped from the prompt to fit ``data.max_prompt_length``",
        "step", lambda st: int(st.history_dropped), placeholder=0, column="history_dropped",
    ),
    RowField(
        "prompt_truncated", "bool", False, "the prompt's ids were cut from the left (``env.prompt.overlong=cut_left``)",
        "step", lambda st: bool(st.prompt_truncated), placeholder=False,
    ),
    RowField(
        "observation_truncated", "bool", False, "the observation was cut to 8 characters per prompt token", "step",
        lambda st: bool(st.observation_truncated), placeholder=False, column="observation_truncated",
    ),
    RowField(
        "observation", "object", "", "the step's observation (credit records on: ``text_chars`` > 0)", "step",
        lambda st: st.observation, placeholder="", column="observations", text=True,
    ),
    RowField(
        "action", "object", "", "the parsed action, or the reply when invalid (``text_chars`` > 0)", "step",
        lambda st: action_text(st.action, st.response_text, st.action_valid), placeholder="", column="actions",
        text=True,
    ),
)
# fmt: on

#: verl's step rows only: the extra field naming the step's images, PNG paths relative to the run's ``credit/`` folder
#: (the agent loop stores them there when credit records are due; not a schema field, read into
#: ``StepBatch.image_refs``)
IMAGES_FIELD = "images"

#: the fields a step-credit estimator cannot do without (a row lacking one was not written by :func:`episode_rows`)
REQUIRED_FIELDS = tuple(f.name for f in ROW_FIELDS if f.required)


def schema_table() -> str:
    """The Markdown table of :data:`ROW_FIELDS` that docs/estimators.md carries."""
    lines = ["| field | level | dtype | default | placeholder | `StepBatch` | meaning |", "|---" * 7 + "|"]
    for f in ROW_FIELDS:
        placeholder = "the episode's" if f.level == EPISODE else repr(f.placeholder)
        column = f"`{f.column}`" if f.column else "-"
        lines.append(f"| `{f.name}` | {f.level} | {f.dtype} | {f.default!r} | {placeholder} | {column} | {f.doc} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class EpisodeRow:
    """One step row: ``fields`` (verl's ``extra_fields``), ``prompt_ids`` (P,), ``response_ids`` (R,),
    ``response_logprobs`` (R,) or None; ``placeholder`` for a failed reset's row (no tokens)."""

    fields: dict[str, Any]
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None
    generation_info: dict[str, Any]
    placeholder: bool = False
    images: list[Any] = field(default_factory=list)


def episode_rows(episode: Episode, *, text_chars: int = 0) -> list[EpisodeRow]:
    """The ``max(episode.length, 1)`` step rows of ``episode`` (one placeholder if reset failed); ``text_chars`` > 0
    adds ``observation`` and ``action`` cut to that length."""
    common = {f.name: f.read(episode) for f in ROW_FIELDS if f.level == EPISODE}
    steps = [f for f in ROW_FIELDS if f.level != EPISODE and (text_chars > 0 or not f.text)]
    if not episode.steps:
        placeholder = {**common, **{f.name: f.placeholder for f in steps}}
        return [EpisodeRow(placeholder, [], [], None, {}, placeholder=True)]
    rows = []
    for step in episode.steps:
        fields = {**common, **{f.name: f.read(step) for f in steps}}
        for f in steps:
            if f.text:
                fields[f.name] = truncate_text(fields[f.name], text_chars)
        rows.append(
            EpisodeRow(
                fields,
                list(step.prompt_ids),
                list(step.response_ids),
                step.response_logprobs,
                dict(step.generation_info),
                images=list(step.images),
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
