"""Prompt templates of the WebShop environments (fields documented on :class:`environments.base.TextEnv`).

Written for instruction-tuned chat models (e.g. Qwen2.5-Instruct), in the style of the GiGPO paper's WebShop
prompt: the shopping instruction (``{task}``), the last few (page, action) pairs, the current page, the available
actions and the output format ``<think>...</think><action>...</action>``. Used by both the simulator
(``webshop``) and the adapter to a real WebShop (``webshop_real``).
"""

from __future__ import annotations

__all__ = ["WEBSHOP_HISTORY_ITEM", "WEBSHOP_PROMPT"]

WEBSHOP_PROMPT = (
    "You are an expert autonomous agent shopping online for a customer.\n"
    "Instruction: {task}\n"
    "The shop is a website you operate with text actions: search[keywords] runs a search (only on the search "
    "page; write your own keywords), and click[button] clicks a button, product id or option value shown on the "
    "page, written exactly as listed, e.g. click[buy now]. Open products that may fit, check their description "
    "and features, select every option the instruction asks for, and buy with click[buy now] before the step "
    "limit. Buying ends the episode and is scored on how well the product, its options and its price match.\n"
    "{history}"
    "Current page (step {step} of {max_steps}):\n{observation}\n"
    "Available actions: {admissible_actions}\n"
    "First reason step by step inside <think>...</think>, then give exactly one action inside "
    "<action>...</action>, for example <action>click[< prev]</action>."
)

WEBSHOP_HISTORY_ITEM = "Step {step}: page: {observation}\nAction: {action}\n"
