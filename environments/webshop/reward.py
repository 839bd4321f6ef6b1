"""WebShop's purchase reward, re-implemented for the generated catalogue.

For a goal with wanted attributes ``A`` (``|A| = n_attr``), wanted options ``O`` (``|O| = n_opt``) and price bound
``u``, buying product ``p`` with selected options ``s``::

    r_total = r_type * (n_attr_matched + n_opt_matched + r_price) / (n_attr + n_opt + 1)

* ``n_attr_matched``: wanted attributes ``a`` with ``a`` in ``p.attributes``, or else ``a`` occurring as whole words
  in ``p``'s title, feature bullets or description (lower-cased) — WebShop's fallback.
* ``n_opt_matched``: wanted options ``(name, value)`` with ``s[name] == value``.
* ``r_price``: 1 if ``p.price <= u`` else 0.
* ``r_type`` (WebShop's type reward), from ``query_match`` (same product type, e.g. "men's t-shirt"),
  ``category_match`` (the two category paths share at least 2 nodes) and the title score
  ``title_score = |nouns(p) & nouns(goal)| / |nouns(goal)|`` over the words of the type noun (e.g. {"running",
  "shoes"}; the audience "men's"/"women's" is not one of them)::

      r_type = 0.0  if title_score == 0
               0.1  if 0 < title_score < 0.1
               0.5  if title_score >= 0.1 and not (query_match or category_match or title_score > 0.2)
               1.0  otherwise

Deviations from WebShop's ``get_reward``, on purpose (numbered):

1. Attribute and option values are compared exactly after lower-casing, not with ``thefuzz`` ratios > 85: the
   catalogue's vocabulary is controlled, so fuzzy matching would only add false matches between near names.
2. Options are matched per option name and only against the selection; WebShop also counts a selected value that
   merely occurs in the title/description, which rewards, e.g., picking the wrong colour of a product whose title
   names another colour.
3. The title score uses the type nouns the catalogue records instead of spaCy part-of-speech tags of the title
   (no spaCy model offline). Brand and audience words are not among them, so a product of another type whose noun
   shares no word with the goal's scores ``r_type = 0`` even from the same brand or for the same audience
   (WebShop's noun overlap often gives such a product ``r_type = 1``),
   while the same type for another audience (a women's t-shirt for a men's t-shirt goal) keeps ``r_type = 1``
   (as in WebShop; the audience still decides ``query_match``). Partial overlaps stay as lenient as WebShop's:
   "wireless mouse" for a "wireless earbuds" goal has ``title_score = 0.5`` and so ``r_type = 1``.
4. The attribute fallback matches whole words (WebShop: any substring), so "cotton" does not match "cottonwood".
5. Every goal has a price bound, so ``r_price`` is never undefined.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from environments.webshop.catalogue import Goal, Product

__all__ = [
    "RewardBreakdown",
    "check_success_reward",
    "contains_phrase",
    "episode_reward",
    "purchase_reward",
    "type_reward",
]


@dataclass(frozen=True)
class RewardBreakdown:
    """The parts of one purchase's reward (see the module docstring for the formula)."""

    total: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    n_attr: int
    n_attr_matched: int
    n_opt: int
    n_opt_matched: int
    r_price: float

    def as_dict(self) -> dict[str, float | int | bool]:
        """The fields as a plain dict (for ``info``)."""
        return dict(self.__dict__)


def contains_phrase(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words (case-insensitive)."""
    pattern = r"(?<![a-z0-9])" + re.escape(phrase.lower()) + r"(?![a-z0-9])"
    return re.search(pattern, text.lower()) is not None


def type_reward(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    """WebShop's type reward. Returns ``(r_type, query_match, category_match, title_score)``."""
    query_match = product.product_type == goal.product_type
    category_match = len(set(product.category_path) & set(goal.category_path)) >= 2
    wanted = set(goal.type_nouns)
    title_score = len(set(product.type_nouns) & wanted) / len(wanted) if wanted else 0.2
    if title_score == 0.0:
        r_type = 0.0
    elif title_score < 0.1:
        r_type = 0.1
    elif not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    else:
        r_type = 1.0
    return r_type, query_match, category_match, title_score


def purchase_reward(goal: Goal, product: Product, selected: Mapping[str, str]) -> RewardBreakdown:
    """Reward of buying ``product`` with the options ``selected`` (``{option name: value}``) for ``goal``.

    Returns:
        the breakdown; ``total`` is in [0, 1] and equals 1.0 exactly when every part matches.
    """
    r_type, query_match, category_match, title_score = type_reward(product, goal)
    text = " ".join([product.title, " ".join(product.features), product.description])
    own = {a.lower() for a in product.attributes}
    n_attr_matched = sum(1 for a in goal.attributes if a.lower() in own or contains_phrase(text, a))
    chosen = {k.lower(): v.lower() for k, v in selected.items()}
    n_opt_matched = sum(1 for name, value in goal.options if chosen.get(name.lower()) == value.lower())
    r_price = 1.0 if product.price <= goal.price_upper else 0.0
    n_attr, n_opt = len(goal.attributes), len(goal.options)
    total = r_type * (n_attr_matched + n_opt_matched + r_price) / (n_attr + n_opt + 1)
    return RewardBreakdown(
        total=float(total),
        r_type=r_type,
        query_match=query_match,
        category_match=category_match,
        title_score=title_score,
        n_attr=n_attr,
        n_attr_matched=n_attr_matched,
        n_opt=n_opt,
        n_opt_matched=n_opt_matched,
        r_price=r_price,
    )


def check_success_reward(success_reward: float | None) -> float | None:
    """Return ``success_reward`` as a float (or None) when it is a finite number >= 0 (or None).

    Raises:
        ValueError: anything else, naming the argument.
    """
    if success_reward is None:
        return None
    if isinstance(success_reward, bool) or not isinstance(success_reward, int | float) or not success_reward >= 0:
        raise ValueError(
            f"success_reward must be None (WebShop's score as the reward) or a finite number >= 0 (the reward of a "
            f"purchase that scores 1.0, e.g. 10 as the GiGPO paper's runs), got {success_reward!r}"
        )
    if success_reward == float("inf"):
        raise ValueError(f"success_reward must be finite, got {success_reward!r}")
    return float(success_reward)


def episode_reward(score: float, success_reward: float | None) -> float:
    """The environment reward of a purchase with WebShop's ``score`` in [0, 1].

    ``success_reward`` None: the score itself (WebShop's own reward). A number: ``success_reward`` when the score is
    1.0 (a perfect purchase, ``won``), else 0 — the reference implementation's rule for the GiGPO runs
    (verl-agent ``agent_system/environments/env_package/webshop/envs.py:47-53``: 10 on a win, 0 otherwise).
    """
    if success_reward is None:
        return float(score)
    return success_reward if score == 1.0 else 0.0
