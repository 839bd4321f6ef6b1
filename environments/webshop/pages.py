"""The simulated shop's pages: state, what each page shows, what can be clicked and where a click leads.

A page is a :class:`PageState` (immutable); :func:`render` gives its text, :func:`clickables` its buttons and
:func:`apply` the next page. All three are pure functions of the state and the catalogue.

Pages and their text (parts joined with ``" [SEP] "``, as in WebShop's text mode):

* search: ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search``; action ``search[...]``.
* results: ``Back to Search [SEP] Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP] <ID> [SEP] <title>
  [SEP] $<price> ...`` (10 products a page; ``< Prev`` only after page 1, ``Next >`` only when more follow).
* item: ``Back to Search [SEP] < Prev [SEP] <option name> [SEP] <value> ... [SEP] <title> [SEP] Price: $<price>
  [SEP] Rating: <rating> [SEP] Description [SEP] Features [SEP] Buy Now``; after an option is chosen a part
  ``Selected: color: navy, size: large`` follows the option lists (WebShop's plain text mode hides the selection,
  which would make different states read the same).
* item sub-pages: ``Back to Search [SEP] < Prev [SEP] <description>`` or ``... [SEP] <bullet> [SEP] <bullet> ...``.
* done: ``Thank you for shopping with us! [SEP] Purchased: [SEP] <ID> [SEP] <title> [SEP] Options: ... [SEP]
  Your score (min 0.0, max 1.0) [SEP] <reward>``.

The instruction is shown on the search page only: on the other pages the agent's prompt already carries it.

Navigation (as in WebShop): ``back to search`` from any page returns to a fresh search page; ``< prev`` on an item
returns to the results page it came from (the selection is dropped); ``< prev`` on a sub-page returns to the item
with its selection; clicking an option value selects it (replacing that option's earlier value); ``buy now``
ends the episode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from environments.webshop.catalogue import Catalogue, Product

__all__ = [
    "BACK_TO_SEARCH",
    "BUY_NOW",
    "NEXT_PAGE",
    "PAGE_SIZE",
    "PREV_PAGE",
    "SUB_PAGES",
    "PageState",
    "apply",
    "clickables",
    "render",
]

BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features")
#: Products per results page (WebShop's PRODUCT_WINDOW).
PAGE_SIZE = 10
SEP = " [SEP] "


@dataclass(frozen=True)
class PageState:
    """Where the agent is.

    kind: "search", "results", "item" or "done".
    query: normalised search keywords ("" on the search page).
    page: results page number, from 1 (0 on the search page).
    item: product id on item/done pages ("" elsewhere).
    options: selected ``((name, value), ...)`` sorted by name.
    sub: "" or an item sub-page ("description", "features").
    """

    kind: str = "search"
    query: str = ""
    page: int = 0
    item: str = ""
    options: tuple[tuple[str, str], ...] = ()
    sub: str = ""

    def digest(self) -> str:
        """The state as one line, e.g. ``item|q=navy t-shirt|p=1|id=B0...|opts=color=navy,size=large|sub=``."""
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return f"{self.kind}|q={self.query}|p={self.page}|id={self.item}|opts={opts}|sub={self.sub}"


def _results(catalogue: Catalogue, state: PageState) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(all result ids of the query, the ids shown on ``state.page``)."""
    found = catalogue.search(state.query)
    start = (state.page - 1) * PAGE_SIZE
    return found, found[start : start + PAGE_SIZE]


def _selection(options: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in options)


def clickables(catalogue: Catalogue, state: PageState) -> list[str]:
    """The clickable names of the page, lower case, in page order (empty on the search and done pages)."""
    if state.kind == "results":
        found, shown = _results(catalogue, state)
        out = [BACK_TO_SEARCH]
        if state.page > 1:
            out.append(PREV_PAGE)
        if state.page * PAGE_SIZE < len(found):
            out.append(NEXT_PAGE)
        return out + [pid.lower() for pid in shown]
    if state.kind == "item":
        if state.sub:
            return [BACK_TO_SEARCH, PREV_PAGE]
        product = catalogue.product(state.item)
        values = [v for _, vals in product.options for v in vals]
        return [BACK_TO_SEARCH, PREV_PAGE, *values, *SUB_PAGES, BUY_NOW]
    return []


def render(catalogue: Catalogue, state: PageState, instruction: str, reward: float | None = None) -> str:
    """The text of the page (see the module docstring). ``reward`` is shown on the done page."""
    if state.kind == "search":
        return SEP.join(["WebShop", "Instruction:", instruction, "Search"])
    if state.kind == "results":
        found, shown = _results(catalogue, state)
        parts = ["Back to Search", f"Page {state.page} (Total results: {len(found)})"]
        if state.page > 1:
            parts.append("< Prev")
        if state.page * PAGE_SIZE < len(found):
            parts.append("Next >")
        for pid in shown:
            product = catalogue.product(pid)
            parts += [product.id, product.title, f"${product.price:.2f}"]
        return SEP.join(parts)
    product = catalogue.product(state.item)
    if state.kind == "done":
        score = "" if reward is None else f"{reward:.3f}"
        selection = _selection(state.options) or "none"
        return SEP.join(
            [
                "Thank you for shopping with us!",
                "Purchased:",
                product.id,
                product.title,
                f"Options: {selection}",
                "Your score (min 0.0, max 1.0)",
                score,
            ]
        )
    if state.sub == "description":
        return SEP.join(["Back to Search", "< Prev", product.description])
    if state.sub == "features":
        return SEP.join(["Back to Search", "< Prev", *product.features])
    return _render_item(product, state)


def _render_item(product: Product, state: PageState) -> str:
    parts = ["Back to Search", "< Prev"]
    for name, values in product.options:
        parts += [name, *values]
    if state.options:
        parts.append(f"Selected: {_selection(state.options)}")
    parts += [
        product.title,
        f"Price: ${product.price:.2f}",
        f"Rating: {product.rating:.1f}",
        "Description",
        "Features",
        "Buy Now",
    ]
    return SEP.join(parts)


def apply(catalogue: Catalogue, state: PageState, verb: str, arg: str) -> PageState:
    """The page after ``verb[arg]`` (already checked to be available on ``state``).

    Raises:
        ValueError: the action is not available on this page (callers validate first; this guards misuse).
    """
    if verb == "search":
        if state.kind != "search":
            raise ValueError(f"search is only available on the search page, not on a {state.kind} page")
        return PageState(kind="results", query=arg, page=1)
    if arg not in clickables(catalogue, state):
        raise ValueError(f"{arg!r} is not clickable on this page; clickables: {clickables(catalogue, state)}")
    if arg == BACK_TO_SEARCH:
        return PageState()
    if state.kind == "results":
        if arg == NEXT_PAGE:
            return replace(state, page=state.page + 1)
        if arg == PREV_PAGE:
            return replace(state, page=state.page - 1)
        return PageState(kind="item", query=state.query, page=state.page, item=catalogue.product(arg).id)
    # item page or one of its sub-pages
    if state.sub:  # only "< prev" is left
        return replace(state, sub="")
    if arg == PREV_PAGE:
        return PageState(kind="results", query=state.query, page=state.page)
    if arg in SUB_PAGES:
        return replace(state, sub=arg)
    if arg == BUY_NOW:
        return PageState(kind="done", item=state.item, options=state.options)
    name = catalogue.product(state.item).option_values[arg]
    chosen = dict(state.options)
    chosen[name] = arg
    return replace(state, options=tuple(sorted(chosen.items())))
