"""Prompt templates for ALFWorld, in the style of the GiGPO paper's ALFWorld prompt (arXiv 2505.10978, App.).

The prompt holds, in this order: the role and the task ("Your task is to: ..."), how many steps were taken,
the last K (observation, action) pairs, the current observation, the admissible actions, and the answer
format ``<think>...</think><action>...</action>``. ``TextEnv.render_prompt`` fills the fields: ``{task}``,
``{history}`` (empty at the first step, else "Recent history:" followed by one
:data:`ALFWORLD_HISTORY_ITEM` per past step), ``{observation}``, ``{admissible_actions}`` (comma-separated, or one
quoted action per line: ``PromptStyle.admissible_actions``) and ``{steps_taken}``, the step count with or without
the step limit (:data:`ALFWORLD_STEP_LIMIT_PHRASES`, ``PromptStyle.show_step_limit``).
"""

from __future__ import annotations

__all__ = ["ALFWORLD_HISTORY_ITEM", "ALFWORLD_PROMPT", "ALFWORLD_STEP_LIMIT_PHRASES"]

ALFWORLD_PROMPT = (
    "You are an expert agent acting in a household simulated by ALFWorld (the text version of ALFRED). "
    "Your task is to: {task}\n"
    "{steps_taken}\n"
    "{history}"
    "Your current observation is:\n{observation}\n"
    "The admissible actions now are: [{admissible_actions}]\n"
    "Think about the situation step by step first, inside <think> </think> tags. Then choose exactly one "
    "admissible action, written exactly as listed, and give it inside <action> </action> tags."
)

ALFWORLD_HISTORY_ITEM = "[Step {step}] Observation: {observation}\nAction: {action}\n"

#: ``{steps_taken}``: with the step limit, and without it (``TextEnv.step_limit_phrases``).
ALFWORLD_STEP_LIMIT_PHRASES = {
    "steps_taken": ("You have taken {step} of at most {max_steps} steps so far.", "You have taken {step} steps so far.")
}
