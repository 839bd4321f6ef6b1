"""The one prompt builder of both engines: each step's prompt text is the environment's own prompt, or a template
file the user supplies (``env.prompt.template``) filled with the environment's fields.

The file format, the fields and the layout options are in docs/environments.md ("Prompt templates").
"""

from __future__ import annotations

import functools
import logging
import os
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from environments.images import IMAGE_INFO_KEY

if TYPE_CHECKING:
    from environments import TextEnv

#: ``options`` below is a :class:`verl_gigpo.rollout.types.PromptOptions` (not imported: types imports this module)
PromptOptions = Any

__all__ = [
    "FIELDS",
    "FIELD_ALIASES",
    "HISTORY_ITEMS",
    "IMAGE_MARK",
    "SECTIONS",
    "PromptTemplate",
    "fill_template",
    "image_parts",
    "load_template",
    "moot_key_warnings",
    "parse_template",
    "render_prompt",
    "template_values",
]

logger = logging.getLogger(__name__)

#: The fields a template may write, and what each holds.
FIELDS = {
    "task": "the task description",
    "observation": "the current observation",
    "admissible_actions": "the admissible actions, laid out by env.prompt.admissible_actions ('any' when unbounded)",
    "step": "steps taken so far (0 at an episode's first step)",
    "step_number": "the current step's number: step + env.prompt.first_step_number",
    "max_steps": "the step limit (env.max_steps)",
    "history": "the past steps the prompt shows, laid out by env.prompt.history_item (empty without history)",
    "history_count": "how many past steps the history shows",
    "image": "where the prompt's images go (IMAGE_MARK; empty without images; without it they come before the text)",
    "formula": "the formula built so far (EZPoints; another environment refuses a template that writes it)",
}

#: What ``{image}`` writes into a prompt's text: the chat turn's images go there (:func:`image_parts`).
IMAGE_MARK = "<image>"

#: Other spellings of the fields (the reference's variable names), so that its templates drop in unchanged.
FIELD_ALIASES = {
    "task_description": "task",
    "current_observation": "observation",
    "available_actions": "admissible_actions",
    "step_count": "step",
    "current_step": "step_number",
    "action_history": "history",
    "memory_context": "history",
    "history_length": "history_count",
    "text_formula": "formula",
}

#: ``env.prompt.history_item``: how a template's ``{history}`` writes the past steps (N: a step's number).
HISTORY_ITEMS = {
    "env": "the environment's own: 'Recent history:' then its item per step, each ending in a newline",
    "bracketed": "[Observation N: 'observation', Action N: 'action'], one per line, no newline after the last",
    "step_blocks": "Step N:action observation, each followed by a newline, items separated by a blank line",
}

#: The sections of a template file: ``step`` (required) and ``first_step`` (used when a prompt shows no history).
SECTIONS = ("step", "first_step")

_MARKER = re.compile(r"^--- gigpo prompt: (\S*) ---$", re.MULTILINE)

_KEY = "env.prompt.template"


@dataclass(frozen=True)
class PromptTemplate:
    """A parsed template file: ``step`` (the prompt's text with fields) and ``first_step`` (the text of a prompt that
    shows no history; None = ``step`` with an empty history)."""

    path: str
    step: str
    first_step: str | None = None

    def text(self, history_shown: int) -> str:
        """The section a prompt with ``history_shown`` past steps fills."""
        return self.first_step if history_shown == 0 and self.first_step is not None else self.step


def parse_template(text: str, path: str = "<template>") -> PromptTemplate:
    """Parse a template file's ``text`` into its sections (format: docs/environments.md#prompt-templates).

    Raises ValueError naming ``env.prompt.template``, the file and the bad section or field.
    """
    marks = list(_MARKER.finditer(text))
    if not marks:
        sections = {"step": text}
    else:
        sections = {}
        for i, mark in enumerate(marks):
            name = mark.group(1)
            if name not in SECTIONS:
                raise ValueError(f"{_KEY}={path}: unknown section {name!r}; known sections: {list(SECTIONS)}")
            if name in sections:
                raise ValueError(f"{_KEY}={path}: the section {name!r} appears twice; keep one")
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            sections[name] = text[mark.end() + 1 : end]
        if "step" not in sections:
            raise ValueError(f"{_KEY}={path}: no 'step' section (a line '--- gigpo prompt: step ---' before its text)")
    for name, body in sections.items():
        _check_fields(body, path, name)
    return PromptTemplate(path=path, step=sections["step"], first_step=sections.get("first_step"))


def _check_fields(body: str, path: str, section: str) -> None:
    """Refuse a section whose format fields are malformed or unknown (one line naming the field and the known ones)."""
    known = [*FIELDS, *FIELD_ALIASES]
    try:
        parsed = list(string.Formatter().parse(body))
    except ValueError as exc:
        raise ValueError(
            f"{_KEY}={path}: its {section} section is not a format string ({exc}); write a literal brace as "
            "{{ or }}"
        ) from None
    images = 0
    for _, field, _, _ in parsed:
        if field is None:
            continue
        name = re.match(r"[^.\[]*", field).group(0)
        if name not in known:
            raise ValueError(
                f"{_KEY}={path}: unknown field {{{name}}} in its {section} section; known fields: "
                f"{', '.join(known)} (a literal brace is written {{{{ or }}}})"
            )
        images += name == "image"
    if images > 1:
        raise ValueError(f"{_KEY}={path}: its {section} section writes {{image}} {images} times; write it once")


@functools.lru_cache(maxsize=32)
def _read(path: str, mtime_ns: int, size: int) -> PromptTemplate:
    return parse_template(Path(path).read_text(encoding="utf-8"), path)


def load_template(path: str | os.PathLike[str]) -> PromptTemplate:
    """The parsed template file at ``path`` (``~`` expanded), re-read when it changes; ValueError names
    ``env.prompt.template``."""
    where = os.path.expanduser(os.fspath(path))
    try:
        stat = os.stat(where)
        return _read(where, stat.st_mtime_ns, stat.st_size)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{_KEY}={path}: cannot read it ({type(exc).__name__}); give the path of a template file (python -m "
            "verl_gigpo.prompts from-reference writes them) or null for the environment's own prompt"
        ) from None


def _history_text(env: TextEnv, items: Sequence[tuple[int, str, str]], layout: str) -> str:
    """The ``{history}`` field: the past steps ``(number, observation, action)`` in the ``layout`` of
    :data:`HISTORY_ITEMS`."""
    if not items:
        return ""
    if layout == "bracketed":
        return "\n".join(f"[Observation {n}: '{obs}', Action {n}: '{act}']" for n, obs, act in items)
    if layout == "step_blocks":
        return "\n".join(f"Step {n}:{act} {obs}\n" for n, obs, act in items)
    lines = [env.history_item_template.format(step=n, observation=obs, action=act) for n, obs, act in items]
    return "Recent history:\n" + "".join(lines)


class _Unfilled:
    """A field this environment does not fill: formatting it raises one line naming the field and the template."""

    def __init__(self, env: str, field: str) -> None:
        self.env, self.field = env, field

    def __format__(self, spec: str) -> str:
        spellings = " or ".join(f"{{{name}}}" for name in [self.field, *_spellings(self.field)])
        raise ValueError(
            f"{_KEY}: the template writes {spellings}, which {self.env} does not fill; remove it or use a "
            "template written for this environment"
        )


def _spellings(field: str) -> list[str]:
    return [alias for alias, name in FIELD_ALIASES.items() if name == field]


def template_values(env: TextEnv, fields: dict[str, Any], options: PromptOptions, images: int = 0) -> dict[str, Any]:
    """Every field of :data:`FIELDS` and :data:`FIELD_ALIASES`, from :meth:`TextEnv.prompt_fields`' ``fields`` and
    the number of ``images`` the prompt shows (``{image}`` is :data:`IMAGE_MARK` when there are any)."""
    values = {
        "task": fields["task"],
        "observation": fields["observation"],
        "admissible_actions": options.style.action_list(fields["actions"]),
        "step": fields["step"],
        "step_number": fields["step_number"],
        "max_steps": fields["max_steps"],
        "history": _history_text(env, fields["history"], options.history_item),
        "history_count": len(fields["history"]),
        "image": IMAGE_MARK if images else "",
        "formula": fields["formula"] if "formula" in fields else _Unfilled(env.name, "formula"),
    }
    return values | {alias: values[name] for alias, name in FIELD_ALIASES.items()}


def render_prompt(
    env: TextEnv,
    observation: str,
    info: dict[str, Any],
    history: Sequence[tuple[str, str]],
    options: PromptOptions,
) -> str:
    """The prompt text of one step, the given past ``(observation, action)`` pairs shown: the environment's own
    (``env.render_prompt`` in ``options.style``) without ``options.template``, else the template's section for this
    many history items filled with :func:`template_values`."""
    if options.template is None:
        return env.render_prompt(observation, info, history, options.style)
    return fill_template(load_template(options.template), env, observation, info, history, options)


def fill_template(
    template: PromptTemplate,
    env: TextEnv,
    observation: str,
    info: dict[str, Any],
    history: Sequence[tuple[str, str]],
    options: PromptOptions,
) -> str:
    """``template``'s section for ``len(history)`` past steps, filled with :func:`template_values` of this state.

    Raises ValueError naming a field that ``env`` does not fill."""
    fields = env.prompt_fields(observation, info, history, options.style)
    images = len(info.get(IMAGE_INFO_KEY) or ())
    return template.text(len(history)).format_map(template_values(env, fields, options, images))


def image_parts(text: str, count: int) -> list[dict[str, str]]:
    """One chat turn's content parts: ``count`` images where ``text`` holds :data:`IMAGE_MARK` (``{image}``), else
    before the text; empty text parts are left out. Raises ValueError when the mark appears more than once."""
    pieces = text.split(IMAGE_MARK)
    if len(pieces) > 2:
        raise ValueError(
            f"the prompt holds {IMAGE_MARK} {len(pieces) - 1} times; a template writes {{image}} once, and an "
            f"observation with images may not contain {IMAGE_MARK}"
        )
    before, after = pieces if len(pieces) == 2 else ("", text)
    parts = [{"type": "text", "text": before}, *({"type": "image"} for _ in range(count))]
    parts.append({"type": "text", "text": after})
    return [part for part in parts if part["type"] == "image" or part["text"]]


#: Warnings already logged in this process (one each).
_WARNED: set[str] = set()


def moot_key_warnings(options: PromptOptions) -> list[str]:
    """The ``env.prompt.*`` keys set away from their defaults that change nothing with these options, one line each:
    ``show_step_limit`` under a template (its text decides), ``history_item`` without one. Each is also logged as a
    warning once per process."""
    found = []
    if options.template is not None and not options.style.show_step_limit:
        found.append(
            f"env.prompt.show_step_limit=false has no effect with {_KEY}={options.template}: the template wins, and "
            "states the step limit exactly where it writes {max_steps}"
        )
    if options.template is None and options.history_item != "env":
        found.append(
            f"env.prompt.history_item={options.history_item} has no effect without {_KEY}: the environment's own "
            "prompt lays out its history itself"
        )
    for line in found:
        if line not in _WARNED:
            _WARNED.add(line)
            logger.warning(line)
    return found
