"""Prompt templates of the WebShop environments (fields documented on :class:`environments.base.TextEnv`).

Written for instruction-tuned chat models (e.g. Qwen2.5-Instruct), in the style of the GiGPO paper's WebShop
prompt: the shopping instruction (``{task}``), the last few (page, action) pairs, the current page, the available
actions and the output format ``<think>...</think><action>...</action>``. Used by both the simulator
(``webshop``) and the adapter to a real WebShop (``webshop_real``).

Fields besides the common ones (:meth:`environments.base.TextEnv.render_prompt`): ``{strategy}``, the
:data:`WEBSHOP_STRATEGY` sentences (how to shop well, and how a purchase is scored) or nothing (the environments'
``strategy_hints=False``: the reference's prompt has no such advice); ``{progress}``, the current step's number with
or without the step limit (:data:`WEBSHOP_STEP_LIMIT_PHRASES`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "WEBSHOP_HISTORY_ITEM",
    "WEBSHOP_PROMPT",
    "WEBSHOP_STEP_LIMIT_PHRASES",
    "WEBSHOP_STRATEGY",
    "check_strategy_hints",
    "strategy_fields",
]

WEBSHOP_PROMPT = (
    "You are an expert autonomous agent shopping online for a customer.\n"
    "Instruction: {task}\n"
    "The shop is a website you operate with text actions: search[keywords] runs a search (only on the search "
    "page; write your own keywords), and click[button] clicks a button, product id or option value shown on the "
    "page, written exactly as listed, e.g. click[buy now].{strategy}\n"
    "{history}"
    "Current page ({progress}):\n{observation}\n"
    "Available actions: {admissible_actions}\n"
    "First reason step by step inside <think>...</think>, then give exactly one action inside "
    "<action>...</action>, for example <action>click[< prev]</action>."
)

#: ``{strategy}`` with ``strategy_hints=True`` (the default): advice on shopping and on the score.
WEBSHOP_STRATEGY = (
    " Open products that may fit, check their description and features, select every option the instruction asks "
    "for, and buy with click[buy now] before the step limit. Buying ends the episode and is scored on how well the "
    "product, its options and its price match."
)

#: ``{progress}``: with the step limit, and without it (``TextEnv.step_limit_phrases``).
WEBSHOP_STEP_LIMIT_PHRASES = {"progress": ("step {step_number} of {max_steps}", "step {step_number}")}

WEBSHOP_HISTORY_ITEM = "Step {step}: page: {observation}\nAction: {action}\n"


def check_strategy_hints(value: Any) -> bool:
    """``value`` when it is a bool (the environments' ``strategy_hints`` argument).

    Raises:
        ValueError: naming ``strategy_hints`` and the value.
    """
    if not isinstance(value, bool):
        raise ValueError(
            f"strategy_hints={value!r} must be true or false (true: the prompt advises how to shop and says how a "
            "purchase is scored; false: it does not, as the reference's prompt)"
        )
    return value


def strategy_fields(strategy_hints: bool) -> dict[str, str]:
    """The ``{strategy}`` field of :data:`WEBSHOP_PROMPT`: :data:`WEBSHOP_STRATEGY`, or nothing."""
    return {"strategy": WEBSHOP_STRATEGY if strategy_hints else ""}
