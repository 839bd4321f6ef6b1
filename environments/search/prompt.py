"""Prompt of the search-QA environment, in the style of Search-R1 and the GiGPO paper's search setting.

The model reasons inside ``<think>...</think>``, then either searches (``<search>query</search>``; the results
come back inside ``<information>...</information>``) or answers (``<answer>...</answer>``), one action per turn.
Fields (``str.format``): ``{task}`` the question, ``{history}`` the rendered past turns (may be empty),
``{observation}`` the current observation, ``{step}`` turns used so far, ``{max_steps}`` the turn limit.
:data:`SEARCH_HISTORY_ITEM` renders one past turn (``{step}``, ``{observation}``, ``{action}``); the base class
puts ``"Recent history:\n"`` before the items.
"""

from __future__ import annotations

__all__ = ["SEARCH_HISTORY_ITEM", "SEARCH_PROMPT"]

SEARCH_PROMPT = (
    "You answer a question with the help of a search engine over a document collection. "
    "Your own memory is not reliable here: look the facts up.\n"
    "Question: {task}\n"
    "Every turn, first reason inside <think> and </think>: what do you know so far, and what is still missing? "
    "Then take exactly one action:\n"
    "- to look something up, write a short query between <search> and </search>; the best matching passages "
    "will be returned between <information> and </information>;\n"
    "- when you are sure, write the final answer, a few words only with no explanation, between <answer> and "
    "</answer>, for example <answer> Marrowick </answer>.\n"
    "You may search several times, but you have {max_steps} turns in all and the episode ends with your answer.\n"
    "{history}"
    "Current observation ({step} of {max_steps} turns used):\n{observation}\n"
)

SEARCH_HISTORY_ITEM = "[after {step} turns]\n{observation}\nYour action: {action}\n"
