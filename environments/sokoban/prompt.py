"""Prompt templates of the Sokoban environment (fields documented on :class:`environments.base.TextEnv`).

Written for instruction-tuned chat models such as Qwen2.5-Instruct, in the style of the GiGPO paper's prompts:
the task and the rules, the last few (observation, action) pairs, the current grid, the admissible actions and
the output format ``<think>...</think><action>...</action>``. The legend is part of ``{task}`` (the task
description), so it is shown once per prompt.
"""

from __future__ import annotations

__all__ = ["SOKOBAN_HISTORY_ITEM", "SOKOBAN_PROMPT", "SOKOBAN_STEP_LIMIT_PHRASES", "SOKOBAN_TASK"]

#: The task description (``info["task"]``); ``{legend}`` is filled in by the environment.
SOKOBAN_TASK = "Push every box onto a target. Legend: {legend}."

SOKOBAN_PROMPT = (
    "You are an expert Sokoban player.\n"
    "Task: {task}\n"
    "Rules: each action moves you (the player) one cell up, down, left or right. Walking into a box pushes it one "
    "cell the same way, but only when the cell behind it is floor or a target; boxes can be pushed, never pulled. "
    "Walking into a wall, or pushing a box into a wall or another box, changes nothing but still uses a move. "
    "A box pushed into a corner that is not a target is stuck there for good.\n"
    "{history}"
    "Current observation ({moves_used}):\n{observation}\n"
    "Admissible actions: {admissible_actions}\n"
    "First reason step by step inside <think>...</think>: locate yourself, the boxes and the targets, and plan the "
    "pushes while avoiding dead corners. Then give exactly one action inside <action>...</action>, "
    "for example <action>left</action>."
)

SOKOBAN_HISTORY_ITEM = "Observation {step}:\n{observation}\nYour action: {action}\n"

#: ``{moves_used}``: with the step limit, and without it (``TextEnv.step_limit_phrases``).
SOKOBAN_STEP_LIMIT_PHRASES = {"moves_used": ("{step} of {max_steps} moves used", "{step} moves used")}
