"""Template files from the user's own checkout of the reference implementation (verl-agent), read at run time: no
reference text is stored in this repository."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from environments import make_env
from verl_gigpo.rollout.prompts import PromptTemplate, fill_template, parse_template
from verl_gigpo.rollout.types import PromptOptions

__all__ = [
    "PROMPT_FILES",
    "REFERENCE_LAYOUTS",
    "REFERENCE_TEMPLATES",
    "ReferenceTemplate",
    "WrittenTemplate",
    "read_reference_template",
    "write_templates",
]

_PROMPTS = "agent_system/environments/prompts/"


@dataclass(frozen=True)
class ReferenceTemplate:
    """Where one template is in a verl-agent checkout and what its code does around it: the environment, the file,
    the module-level string of every step (``step``) and of the first step (``first_step``, None = none), whether the
    reference's code formats the string (``str.format``: ``{{`` is a brace; unformatted, every character is shown),
    the ``env.prompt`` layout its code uses, and the environment settings the template is for."""

    env: str
    file: str
    step: str
    first_step: str | None = None
    formatted: bool = True
    layout: tuple[tuple[str, object], ...] = ()
    settings: tuple[tuple[str, object], ...] = ()


_NO_HISTORY = (("env.history_length", 0), ("env.kwargs.observation", "image"))

#: template name -> where its text is in a verl-agent checkout and what the reference's code does around it: history
#: items (agent_system/memory/memory.py), admissible-action lists and which strings it formats
#: (agent_system/environments/env_manager.py: SokobanEnvironmentManager.build_text_obs,
#: GymCardEnvironmentManager.build_text_obs). Its image templates hold ``<image>`` where the image goes, keep no
#: history and list no actions; of the card games it formats EZPoints' only (``text_formula``).
REFERENCE_TEMPLATES = {
    "alfworld": ReferenceTemplate(
        "alfworld",
        _PROMPTS + "alfworld.py",
        "ALFWORLD_TEMPLATE",
        "ALFWORLD_TEMPLATE_NO_HIS",
        layout=(("history_item", "bracketed"), ("admissible_actions", "quoted_indent"), ("first_step_number", 1)),
    ),
    "webshop": ReferenceTemplate(
        "webshop",
        _PROMPTS + "webshop.py",
        "WEBSHOP_TEMPLATE",
        "WEBSHOP_TEMPLATE_NO_HIS",
        layout=(("history_item", "bracketed"), ("admissible_actions", "quoted_comma"), ("first_step_number", 1)),
    ),
    "sokoban": ReferenceTemplate(
        "sokoban",
        _PROMPTS + "sokoban.py",
        "SOKOBAN_TEMPLATE",
        "SOKOBAN_TEMPLATE_NO_HIS",
        layout=(("history_item", "bracketed"), ("admissible_actions", "comma"), ("first_step_number", 1)),
    ),
    "search": ReferenceTemplate(
        "search",
        _PROMPTS + "search.py",
        "SEARCH_TEMPLATE",
        "SEARCH_TEMPLATE_NO_HIS",
        layout=(("history_item", "step_blocks"), ("admissible_actions", "comma"), ("first_step_number", 1)),
    ),
    "sokoban_image": ReferenceTemplate(
        "sokoban", _PROMPTS + "sokoban.py", "SOKOBAN_VISUAL_TEMPLATE", formatted=False, settings=_NO_HISTORY
    ),
    "ezpoints": ReferenceTemplate(
        "ezpoints", _PROMPTS + "gym_cards.py", "GYM_CARDS_EZPOINTS_TEMPLATE", settings=_NO_HISTORY
    ),
    "numberline": ReferenceTemplate(
        "numberline", _PROMPTS + "gym_cards.py", "GYM_CARDS_NUMBERLINE_TEMPLATE", formatted=False, settings=_NO_HISTORY
    ),
    "blackjack": ReferenceTemplate(
        "blackjack", _PROMPTS + "gym_cards.py", "GYM_CARDS_BLACKJACK_TEMPLATE", formatted=False, settings=_NO_HISTORY
    ),
}

#: template name -> the file of a verl-agent checkout holding it
PROMPT_FILES = {name: ref.file for name, ref in REFERENCE_TEMPLATES.items()}

#: template name -> the ``env.prompt`` layout options that reproduce what the reference's code does around the prose
REFERENCE_LAYOUTS = {name: dict(ref.layout) for name, ref in REFERENCE_TEMPLATES.items()}

#: what the reference writes where an image goes (its rollout loop swaps it for the vision tokens)
REFERENCE_IMAGE_MARK = "<image>"

MARK = "--- gigpo prompt: {} ---\n"


@dataclass(frozen=True)
class WrittenTemplate:
    """One template file written: its name (:data:`REFERENCE_TEMPLATES`), where it went and the overrides that use
    it (``python -m verl_gigpo.main``'s form: a new ``env.kwargs`` key takes a ``+``)."""

    name: str
    path: Path
    overrides: list[str]


def _string_constants(source: str, filename: str) -> dict[str, str]:
    """The module-level ``NAME = "..."`` string constants of a Python file, read without running it."""
    constants = {}
    for node in ast.parse(source, filename=filename).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                constants[node.targets[0].id] = node.value.value
    return constants


def read_reference_template(checkout: Path, name: str) -> str:
    """The text of template ``name``'s file made from ``checkout`` (:data:`REFERENCE_TEMPLATES`): a comment naming
    the source, the ``step`` section and, when the file has one, the ``first_step`` section, each verbatim. A string
    the reference's code does not format has its braces doubled (its model sees them as written); an image
    template's ``<image>`` becomes ``{image}``.

    Raises:
        FileNotFoundError: the checkout has no such file.
        ValueError: the file lacks the string, or a template writes a field this project does not fill for its
            environment (or, for an image template, not one ``<image>``).
    """
    ref = REFERENCE_TEMPLATES[name]
    source = checkout / ref.file
    constants = _string_constants(source.read_text(encoding="utf-8"), str(source))
    if ref.step not in constants:
        raise ValueError(f"{source}: no module-level string {ref.step}; is this a verl-agent checkout?")
    step, first = constants[ref.step], constants.get(ref.first_step) if ref.first_step else None
    if first is not None and not step.endswith("\n"):
        raise ValueError(f"{source}: {ref.step} does not end with a newline, so it cannot come before a second section")
    if not ref.formatted:
        step, first = (None if t is None else t.replace("{", "{{").replace("}", "}}") for t in (step, first))
    settings = dict(ref.settings)
    if settings.get("env.kwargs.observation") == "image":
        marks = step.count(REFERENCE_IMAGE_MARK)
        if marks != 1:
            raise ValueError(
                f"{source}: {ref.step} holds {REFERENCE_IMAGE_MARK} {marks} times; an image template places its "
                "one image there, so it needs exactly one"
            )
        step = step.replace(REFERENCE_IMAGE_MARK, "{image}")
    names = ref.step + (f", {ref.first_step}" if first is not None else "")
    text = (
        f"Written by python -m verl_gigpo.prompts from-reference from {source} ({names}). Text before the first "
        "marker line is a comment.\n"
        + MARK.format("step")
        + step
        + (MARK.format("first_step") + first if first is not None else "")
    )
    template = parse_template(text, str(source))  # refuses unknown fields, naming them
    if settings.get("env.kwargs.observation") == "image":
        _check_filled(template, ref, settings)
    return text


def _check_filled(template: PromptTemplate, ref: ReferenceTemplate, settings: dict) -> None:
    """Fill ``template`` from a fresh image episode of ``ref.env`` (task 0): ValueError names a field this project
    does not fill for it."""
    kwargs = {
        key.removeprefix("env.kwargs."): value for key, value in settings.items() if key.startswith("env.kwargs.")
    }
    env = make_env(ref.env, **kwargs)
    try:
        observation, info = env.reset(seed=0)
        fill_template(template, env, observation, info, [], PromptOptions())
    except ValueError as exc:
        raise ValueError(f"{ref.file}: {ref.step}: {exc}") from None
    finally:
        env.close()


def write_templates(checkout: Path, out: Path, names: list[str] | None = None) -> tuple[list[WrittenTemplate], dict]:
    """Write ``<out>/<name>.txt`` for each template of ``names`` (default all of :data:`REFERENCE_TEMPLATES`) whose
    file the checkout has. Returns ``(written, skipped)``: ``skipped`` maps a name to why it was not written."""
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], {}
    for name in names or list(REFERENCE_TEMPLATES):
        ref = REFERENCE_TEMPLATES[name]
        try:
            text = read_reference_template(checkout, name)
        except FileNotFoundError:
            skipped[name] = f"no {checkout / ref.file}"
            continue
        except (ValueError, SyntaxError) as exc:
            skipped[name] = str(exc)
            continue
        path = out / f"{name}.txt"
        path.write_text(text, encoding="utf-8")
        overrides = [
            f"env.prompt.template={path}",
            *(f"env.prompt.{key}={value}" for key, value in ref.layout),
            *(f"{'+' if key.startswith('env.kwargs.') else ''}{key}={value}" for key, value in ref.settings),
        ]
        written.append(WrittenTemplate(name, path, overrides))
    return written, skipped
