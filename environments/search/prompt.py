"""Prompt of the search-QA environment, in the style of Search-R1 and the GiGPO paper's search setting.

The model reasons inside ``<think>...</think>``, then either searches (``<search>query</search>``; the results
come back inside ``<information>...</information>``) or answers (``<answer>...</answer>``), one action per turn.
Fields (``str.format``): ``{task}`` the question, ``{history}`` the rendered past turns (may be empty),
``{observation}`` the current observation, and the phrases of :data:`SEARCH_STEP_LIMIT_PHRASES`: ``{turn_rule}``
(how many turns there are, or only that the answer ends the episode) and ``{turns_used}`` (turns used so far, with or
without the limit). :data:`SEARCH_HISTORY_ITEM` renders one past turn (``{step}`` its number, ``{observation}``,
``{action}``); the base class puts ``"Recent history:\n"`` before the items.
"""

from __future__ import annotations

__all__ = ["SEARCH_HISTORY_ITEM", "SEARCH_PROMPT", "SEARCH_STEP_LIMIT_PHRASES"]

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
    "{turn_rule}\n"
    "{history}"
    "Current observation ({turns_used}):\n{observation}\n"
)

#: ``{turn_rule}`` and ``{turns_used}``: with the turn limit, and without it (``TextEnv.step_limit_phrases``).
SEARCH_STEP_LIMIT_PHRASES = {
    "turn_rule": (
        "You may search several times, but you have {max_steps} turns in all and the episode ends with your answer.",
        "You may search several times; the episode ends with your answer.",
    ),
    "turns_used": ("{step} of {max_steps} turns used", "{step} turns used"),
}

SEARCH_HISTORY_ITEM = "[turn {step}]\n{observation}\nYour action: {action}\n"
