"""Template files from the user's own checkout of the reference implementation (verl-agent), read at run time: no
reference text is stored in this repository."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from verl_gigpo.rollout.prompts import parse_template

__all__ = ["PROMPT_FILES", "REFERENCE_LAYOUTS", "WrittenTemplate", "read_reference_template", "write_templates"]

#: environment -> the file of a verl-agent checkout holding its prompt templates (module-level string constants
#: ``<ENV>_TEMPLATE``, every step with history, and ``<ENV>_TEMPLATE_NO_HIS``, the first step)
PROMPT_FILES = {
    "alfworld": "agent_system/environments/prompts/alfworld.py",
    "webshop": "agent_system/environments/prompts/webshop.py",
    "sokoban": "agent_system/environments/prompts/sokoban.py",
    "search": "agent_system/environments/prompts/search.py",
}

#: The layout options that reproduce what the reference's code (not its prompt files) does around the prose: its
#: history items (agent_system/memory/memory.py) and admissible-action lists (agent_system/environments/env_manager.py)
REFERENCE_LAYOUTS = {
    "alfworld": {"history_item": "bracketed", "admissible_actions": "quoted_indent", "first_step_number": 1},
    "webshop": {"history_item": "bracketed", "admissible_actions": "quoted_comma", "first_step_number": 1},
    "sokoban": {"history_item": "bracketed", "admissible_actions": "comma", "first_step_number": 1},
    "search": {"history_item": "step_blocks", "admissible_actions": "comma", "first_step_number": 1},
}

MARK = "--- gigpo prompt: {} ---\n"


@dataclass(frozen=True)
class WrittenTemplate:
    """One template file written: the environment, where it went and the overrides that use it."""

    env: str
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


def read_reference_template(checkout: Path, env: str) -> str:
    """The text of ``env``'s template file made from ``checkout``'s :data:`PROMPT_FILES` entry: a comment naming the
    source, the ``step`` section (``<ENV>_TEMPLATE``) and, when the file has one, the ``first_step`` section
    (``<ENV>_TEMPLATE_NO_HIS``), each verbatim.

    Raises:
        FileNotFoundError: the checkout has no such file.
        ValueError: the file lacks ``<ENV>_TEMPLATE``, or a template writes a field this project does not fill.
    """
    source = checkout / PROMPT_FILES[env]
    constants = _string_constants(source.read_text(encoding="utf-8"), str(source))
    name = f"{env.upper()}_TEMPLATE"
    if name not in constants:
        raise ValueError(f"{source}: no module-level string {name}; is this a verl-agent checkout?")
    step, first = constants[name], constants.get(f"{name}_NO_HIS")
    if first is not None and not step.endswith("\n"):
        raise ValueError(f"{source}: {name} does not end with a newline, so it cannot come before a second section")
    text = (
        f"Written by python -m verl_gigpo.prompts from-reference from {source} ({name}"
        f"{f', {name}_NO_HIS' if first is not None else ''}). Text before the first marker line is a comment.\n"
        + MARK.format("step")
        + step
        + (MARK.format("first_step") + first if first is not None else "")
    )
    parse_template(text, str(source))  # refuses unknown fields, naming them
    return text


def write_templates(checkout: Path, out: Path, envs: list[str] | None = None) -> tuple[list[WrittenTemplate], dict]:
    """Write ``<out>/<env>.txt`` for each environment of ``envs`` (default all of :data:`PROMPT_FILES`) whose file
    the checkout has. Returns ``(written, skipped)``: ``skipped`` maps an environment to why it was not written."""
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], {}
    for env in envs or list(PROMPT_FILES):
        try:
            text = read_reference_template(checkout, env)
        except FileNotFoundError:
            skipped[env] = f"no {checkout / PROMPT_FILES[env]}"
            continue
        except (ValueError, SyntaxError) as exc:
            skipped[env] = str(exc)
            continue
        path = out / f"{env}.txt"
        path.write_text(text, encoding="utf-8")
        layout = REFERENCE_LAYOUTS[env]
        overrides = [f"env.prompt.template={path}", *(f"env.prompt.{k}={v}" for k, v in layout.items())]
        written.append(WrittenTemplate(env, path, overrides))
    return written, skipped
