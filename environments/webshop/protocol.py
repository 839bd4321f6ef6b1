"""WebShop's text action protocol, shared by the simulator and the adapter to a real WebShop.

Actions are ``search[keywords]`` (only where the page has a search bar) and ``click[button]`` (a button, product id
or option value shown on the page). Like WebShop's text environment, the argument is lower-cased; here runs of
whitespace also collapse to one space, so ``"Click[ Buy  Now ]"`` is ``"click[buy now]"``.

``admissible_actions`` lists the clickables as ``click[...]`` and, on a page with a search bar, the single
placeholder :data:`SEARCH_PLACEHOLDER` (``"search[<your query>]"``): any keywords are allowed there.
"""

from __future__ import annotations

import re
from collections.abc import Collection

__all__ = ["MAX_QUERY_CHARS", "SEARCH_PLACEHOLDER", "canonical_action", "split_action"]

#: How the open-ended search action appears in ``admissible_actions``.
SEARCH_PLACEHOLDER = "search[<your query>]"
#: Longest accepted search query (after normalisation); longer ones are not valid actions.
MAX_QUERY_CHARS = 500

_ACTION = re.compile(r"(search|click)\s*\[(.*)\]", re.IGNORECASE | re.DOTALL)


def split_action(text: str) -> tuple[str, str] | None:
    """Split ``"verb[argument]"`` into ``(verb, normalised argument)``, or None when it is not of that form.

    The verb is ``"search"`` or ``"click"`` (any case); the argument is lower-cased with whitespace collapsed and must
    be non-empty, free of ``[`` and ``]`` and at most :data:`MAX_QUERY_CHARS` characters.
    """
    match = _ACTION.fullmatch(text.strip())
    if match is None:
        return None
    verb, arg = match.group(1).lower(), " ".join(match.group(2).lower().split())
    if not arg or "[" in arg or "]" in arg or len(arg) > MAX_QUERY_CHARS:
        return None
    return verb, arg


def canonical_action(text: str, *, has_search_bar: bool, clickables: Collection[str]) -> str | None:
    """The canonical action for ``text`` on a page, or None when it is not available there.

    Args:
        text: a candidate action (e.g. the content of an ``<action>`` tag).
        has_search_bar: whether ``search[...]`` is available on the page.
        clickables: the page's clickable names, lower case (``"buy now"``, ``"b0k3j9qx2m"``, ``"large"``).

    Returns:
        ``"search[<normalised keywords>]"``, ``"click[<clickable>]"`` or None.
    """
    parts = split_action(text)
    if parts is None:
        return None
    verb, arg = parts
    if verb == "search":
        return f"search[{arg}]" if has_search_bar else None
    return f"click[{arg}]" if arg in clickables else None
