"""A seeded, generated WebShop-style product catalogue, its shopping goals and its BM25 search index.

The catalogue is a pure function of ``(seed, num_products, num_train_goals)``: products are drawn from
``np.random.default_rng([seed, 0])`` and goals from ``np.random.default_rng([seed, 1])``, never from an episode
seed, so one environment instance (and every member of an episode group) sees the same shop. Building the
default catalogue (1,000 products, 500 test + 5,000 train goals, search index) takes well under a second;
:func:`build_catalogue` caches it, so all environments with the same settings share one instance.

Products: a category ("clothing", "shoes", "electronics", "grocery", "home"), a product type ("men's t-shirt"),
a title, 3-6 attributes ("machine wash", "gluten free"), buying options (size, color, flavor, ...), a price,
a description and feature bullets. See :mod:`environments.webshop.vocab` for the vocabulary.

Goals (WebShop's synthetic-instruction style): a target product, 1-3 of its attributes, one value for each of
its option groups and a price bound, written as text, e.g. ``"i need a men's t-shirt that is long sleeve and
machine wash, in size large, in navy, and price lower than 40.00 dollars"``. Split ``"test"`` holds goals
0-499 (fixed, like the paper's evaluation set), split ``"train"`` the next ``num_train_goals``.

Search: BM25 (``bm25s``) over title, product type, category path, attributes and option values; a query returns
at most 50 products with a positive score, best first (ties broken by catalogue order), as WebShop does.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import bm25s
import numpy as np
from bm25s.tokenization import Tokenized

from environments.webshop.vocab import (
    BRANDS,
    FILLER_BULLETS,
    FILLER_SENTENCES,
    OPTION_PHRASES,
    PRODUCT_TYPES,
    ProductType,
)

__all__ = [
    "NUM_TEST_GOALS",
    "SEARCH_RETURN_N",
    "Catalogue",
    "Goal",
    "Product",
    "build_catalogue",
    "generate_catalogue",
    "tokenize",
]

logger = logging.getLogger(__name__)
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG at import: its indexing chatter

#: Size of the fixed evaluation split (goals 0..499), as in WebShop.
NUM_TEST_GOALS = 500
#: Most products one search returns (WebShop's SEARCH_RETURN_N).
SEARCH_RETURN_N = 50

_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_ACRONYMS = {
    "usb-c": "USB-C",
    "usb-a": "USB-A",
    "hdmi": "HDMI",
    "led": "LED",
    "bpa": "BPA",
    "gmo": "GMO",
    "pfoa": "PFOA",
    "gan": "GaN",
    "4k": "4K",
    "dpi": "DPI",
}
_BULLET_TAILS = (
    "tested for everyday use",
    "a favourite of our regular customers",
    "the same standard in every batch",
    "no compromise on quality",
    "one of the reasons people come back",
)
# Words a search ignores: the bm25s English list plus the fixed words of an instruction.
_STOPWORDS = frozenset(bm25s.stopwords.STOPWORDS_EN) | {
    "i",
    "am",
    "need",
    "looking",
    "want",
    "find",
    "me",
    "buy",
    "which",
    "price",
    "lower",
    "than",
    "dollars",
    "s",
    "t",
}
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")


def tokenize(text: str) -> list[str]:
    """Search tokens of ``text``: lower-cased alphanumeric runs (``"15.6"`` stays one token), stopwords removed."""
    return [tok for tok in _TOKEN.findall(text.lower()) if tok not in _STOPWORDS]


@dataclass(frozen=True)
class Product:
    """One product of the catalogue (immutable).

    id: ASIN-like identifier, upper case (``"B0K3J9QX2M"``); pages show it, ``click[...]`` takes it lower-cased.
    category: top-level category. category_path: most general first, e.g. ``("clothing", "men's clothing",
    "shirts")``. product_type: audience + noun (``"men's t-shirt"``), WebShop's "query".
    type_nouns: the words of the type's noun (``("t-shirt",)``, ``("running", "shoes")``), used by the type
    reward's title score; the audience is left out (it is part of ``product_type``).
    options: ``((name, (value, ...)), ...)`` in display order. features: bullet points.
    """

    id: str
    category: str
    category_path: tuple[str, ...]
    product_type: str
    noun: str
    brand: str
    title: str
    type_nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: float
    rating: float
    description: str
    features: tuple[str, ...]

    @property
    def option_values(self) -> dict[str, str]:
        """Map option value -> option name (values are unique within a product)."""
        return {value: name for name, values in self.options for value in values}


@dataclass(frozen=True)
class Goal:
    """One shopping instruction.

    index: position in its split. product_id: the product the goal was made from (buying it with the wanted
    options scores 1.0; other products may score 1.0 too). attributes: wanted attribute phrases. options:
    wanted ``((name, value), ...)``. price_upper: the price bound in dollars. instruction: the text.
    """

    split: str
    index: int
    product_id: str
    category: str
    category_path: tuple[str, ...]
    product_type: str
    type_nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    price_upper: float
    instruction: str


def _title_case(phrase: str) -> str:
    return " ".join(_ACRONYMS.get(w, w[:1].upper() + w[1:]) for w in phrase.split())


def _join_words(items: list[str] | tuple[str, ...]) -> str:
    """``["a"]`` -> ``"a"``; ``["a", "b", "c"]`` -> ``"a, b and c"``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _article(number: str, next_word: str) -> str:
    if number != "singular":
        return ""
    return "an " if next_word[:1] in "aeiou" else "a "


class _Draws:
    """Uniform draws from a seeded ``np.random.Generator``, fetched in blocks (numpy's per-call overhead would
    dominate the catalogue build otherwise). Deterministic given the generator's seed."""

    def __init__(self, rng: np.random.Generator, block: int = 16384):
        self._rng = rng
        self._block = block
        self._buf: list[float] = []
        self._pos = 0

    def random(self) -> float:
        """A float in [0, 1)."""
        if self._pos == len(self._buf):
            self._buf = self._rng.random(self._block).tolist()
            self._pos = 0
        self._pos += 1
        return self._buf[self._pos - 1]

    def below(self, n: int) -> int:
        """An int in [0, n)."""
        return min(int(self.random() * n), n - 1)

    def sample(self, n: int, k: int) -> list[int]:
        """``k`` distinct ints from [0, n), in increasing order (partial Fisher-Yates shuffle)."""
        pool = list(range(n))
        for i in range(k):
            j = i + self.below(n - i)
            pool[i], pool[j] = pool[j], pool[i]
        return sorted(pool[:k])


def _make_id(draws: _Draws, taken: set[str]) -> str:
    while True:
        pid = "B0" + "".join(_ID_ALPHABET[draws.below(len(_ID_ALPHABET))] for _ in range(8))
        if pid not in taken:
            taken.add(pid)
            return pid


def _make_product(draws: _Draws, ptype: ProductType, taken: set[str]) -> Product:
    audience = ptype.audiences[draws.below(len(ptype.audiences))] if ptype.audiences else ""
    n_groups = len(ptype.attribute_groups)
    groups = draws.sample(n_groups, 3 + draws.below(min(6, n_groups) - 2))
    attributes = tuple(ptype.attribute_groups[g][draws.below(len(ptype.attribute_groups[g]))] for g in groups)
    options = []
    for name, pool in ptype.options:
        low_n, high_n = min(2, len(pool)), min(6, len(pool))
        chosen = draws.sample(len(pool), low_n + draws.below(high_n - low_n + 1))
        options.append((name, tuple(pool[i] for i in chosen)))
    low, high = ptype.price
    price = round(float(int(low + (high - low) * draws.random())) + 0.99, 2)
    brand = BRANDS[ptype.category][draws.below(len(BRANDS[ptype.category]))]
    # the title names 1-2 attributes, preferring ones that do not repeat a word of the noun ("protein protein bars")
    noun_words = set(ptype.noun.split())
    titled = [a for a in attributes if not noun_words & set(a.split())] or list(attributes)
    title_attrs = [titled[i] for i in draws.sample(len(titled), min(len(titled), 1 + draws.below(2)))]
    product_type = f"{audience} {ptype.noun}".strip()
    title = _title_case(" ".join([brand.lower(), audience, *title_attrs, ptype.noun]))
    desc_attrs = [attributes[i] for i in draws.sample(len(attributes), 2 + draws.below(2))]
    fillers = FILLER_SENTENCES[ptype.category]
    these, verb = ("These", "are") if ptype.number == "plural" else ("This", "is")
    description = (
        f"{title}. {these} {ptype.noun} from {brand} {verb} {_join_words(desc_attrs)}. "
        f"{fillers[draws.below(len(fillers))]}"
    )
    features = tuple(f"{a.upper()} - {_BULLET_TAILS[draws.below(len(_BULLET_TAILS))]}" for a in attributes)
    features += (FILLER_BULLETS[draws.below(len(FILLER_BULLETS))],)
    type_nouns = tuple(ptype.noun.split())
    return Product(
        id=_make_id(draws, taken),
        category=ptype.category,
        category_path=tuple(p.format(aud=audience) for p in ptype.path),
        product_type=product_type,
        noun=ptype.noun,
        brand=brand,
        title=title,
        type_nouns=type_nouns,
        attributes=attributes,
        options=tuple(options),
        price=price,
        rating=round(3.0 + 2.0 * draws.random(), 1),
        description=description,
        features=features,
    )


def _price_upper(draws: _Draws, price: float) -> float:
    """WebShop's bound: the larger of two distinct picks among the four multiples of 10 above ``price``."""
    first = int(price // 10.0) + 1
    return 10.0 * (first + max(draws.sample(4, 2)))


def _make_goal(draws: _Draws, product: Product, number: str, split: str, index: int) -> Goal:
    picked = draws.sample(len(product.attributes), 1 + draws.below(min(3, len(product.attributes))))
    attributes = tuple(product.attributes[i] for i in picked)
    options = tuple((name, values[draws.below(len(values))]) for name, values in product.options)
    price_upper = _price_upper(draws, product.price)
    phrase = product.product_type
    verb = "are" if number == "plural" else "is"
    template = draws.below(4)
    if template == 0:
        base = f"i need {_article(number, phrase)}{phrase} that {verb} {_join_words(attributes)}"
    elif template == 1:
        adjectives = " and ".join(attributes)
        base = f"i am looking for {_article(number, adjectives)}{adjectives} {phrase}"
    elif template == 2:
        base = f"find me {_article(number, phrase)}{phrase} with {_join_words(attributes)}"
    else:
        base = f"i want to buy {_article(number, phrase)}{phrase} which {verb} {_join_words(attributes)}"
    parts = [base] + [OPTION_PHRASES[name].format(v=value) for name, value in options]
    instruction = ", ".join(parts) + f", and price lower than {price_upper:.2f} dollars"
    return Goal(
        split=split,
        index=index,
        product_id=product.id,
        category=product.category,
        category_path=product.category_path,
        product_type=product.product_type,
        type_nouns=product.type_nouns,
        attributes=attributes,
        options=options,
        price_upper=price_upper,
        instruction=instruction,
    )


class Catalogue:
    """Products, goals and the BM25 index of one generated shop. Build it with :func:`build_catalogue`.

    Attributes:
        seed: the catalogue seed.
        products: every product, in catalogue order.
        goals: ``{"test": (...500 goals), "train": (...)}``.
        search: ``search(query) -> tuple[str, ...]``: ids of up to 50 products matching ``query``, best BM25 score
            first (ties in catalogue order), only products with a positive score; cached per query.
    """

    def __init__(self, seed: int, products: tuple[Product, ...], goals: Mapping[str, tuple[Goal, ...]]):
        self.seed = seed
        self.products = products
        self.goals: Mapping[str, tuple[Goal, ...]] = MappingProxyType(dict(goals))
        self._by_id = {p.id: p for p in products}
        docs = [
            " ".join(
                [
                    p.title,
                    p.product_type,
                    " ".join(p.category_path),
                    " ".join(p.attributes),
                    " ".join(v for _, values in p.options for v in values),
                ]
            )
            for p in products
        ]
        doc_tokens = [tokenize(d) for d in docs]
        self._vocab = {tok: i for i, tok in enumerate(sorted({t for toks in doc_tokens for t in toks}))}
        ids = [[self._vocab[t] for t in toks] for toks in doc_tokens]
        self._bm25 = bm25s.BM25()
        self._bm25.index(Tokenized(ids=ids, vocab=dict(self._vocab)), show_progress=False)
        self.search = functools.lru_cache(maxsize=4096)(self._search)

    def __len__(self) -> int:
        return len(self.products)

    def product(self, product_id: str) -> Product:
        """The product with id ``product_id`` (case-insensitive).

        Raises:
            KeyError: no such product.
        """
        try:
            return self._by_id[product_id.upper()]
        except KeyError:
            raise KeyError(f"no product with id {product_id!r} in this catalogue (seed {self.seed})") from None

    def _search(self, query: str) -> tuple[str, ...]:
        """Ids of up to :data:`SEARCH_RETURN_N` products for ``query``, best BM25 score first, ties by catalogue
        order; only products with a positive score. Cached per query (``self.search``)."""
        token_ids = [self._vocab[t] for t in tokenize(query) if t in self._vocab]
        if not token_ids:
            return ()
        scores = np.asarray(self._bm25.get_scores_from_ids(token_ids), dtype=np.float64)  # (num_products,)
        order = np.lexsort((np.arange(len(scores)), -scores))[:SEARCH_RETURN_N]
        return tuple(self.products[i].id for i in order if scores[i] > 0.0)

    def stats(self) -> dict[str, int]:
        """Counts for reports: products, product types, categories, distinct attributes, goals per split."""
        return {
            "products": len(self.products),
            "product_types": len({p.product_type for p in self.products}),
            "categories": len({p.category for p in self.products}),
            "attributes": len({a for p in self.products for a in p.attributes}),
            **{f"goals_{split}": len(goals) for split, goals in self.goals.items()},
        }


#: Largest generated catalogue (products) and training goal list: both are built in memory at construction.
MAX_PRODUCTS = 50_000
MAX_TRAIN_GOALS = 200_000


def build_catalogue(seed: int = 0, num_products: int = 1000, num_train_goals: int = 5000) -> Catalogue:
    """Generate (or fetch from the cache) the catalogue for these settings.

    Args:
        seed: catalogue seed (not an episode seed); products come from ``default_rng([seed, 0])``, goals from
            ``default_rng([seed, 1])``.
        num_products: number of products (at least 50, so that every search page can fill).
        num_train_goals: number of goals in the ``"train"`` split (the ``"test"`` split always has 500).

    Raises:
        ValueError: for a negative seed, fewer than 50 products or fewer than 1 train goal.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"catalogue seed must be a non-negative int, got {seed!r}")
    if isinstance(num_products, bool) or not isinstance(num_products, int) or not 50 <= num_products <= MAX_PRODUCTS:
        raise ValueError(
            f"num_products must be an int in [50, {MAX_PRODUCTS}], got {num_products!r} (the catalogue is built in "
            "memory, ~0.6 ms and ~5 KB per product; the real WebShop catalogue is the webshop_real environment)"
        )
    if (
        isinstance(num_train_goals, bool)
        or not isinstance(num_train_goals, int)
        or not 1 <= num_train_goals <= MAX_TRAIN_GOALS
    ):
        raise ValueError(f"num_train_goals must be an int in [1, {MAX_TRAIN_GOALS}], got {num_train_goals!r}")
    return _cached_catalogue(int(seed), num_products, num_train_goals)


@functools.lru_cache(maxsize=8)
def _cached_catalogue(seed: int, num_products: int, num_train_goals: int) -> Catalogue:
    return generate_catalogue(seed, num_products, num_train_goals)


def generate_catalogue(seed: int, num_products: int, num_train_goals: int) -> Catalogue:
    """Generate the catalogue afresh (no cache, no argument checks; use :func:`build_catalogue`)."""
    draws = _Draws(np.random.default_rng([int(seed), 0]))
    taken: set[str] = set()
    type_index = [draws.below(len(PRODUCT_TYPES)) for _ in range(num_products)]
    products = tuple(_make_product(draws, PRODUCT_TYPES[t], taken) for t in type_index)
    goal_draws = _Draws(np.random.default_rng([int(seed), 1]))
    goals: dict[str, list[Goal]] = {"test": [], "train": []}
    for n in range(NUM_TEST_GOALS + num_train_goals):
        split, index = ("test", n) if n < NUM_TEST_GOALS else ("train", n - NUM_TEST_GOALS)
        target = goal_draws.below(num_products)
        number = PRODUCT_TYPES[type_index[target]].number
        goals[split].append(_make_goal(goal_draws, products[target], number, split, index))
    catalogue = Catalogue(int(seed), products, {k: tuple(v) for k, v in goals.items()})
    logger.debug("built WebShop catalogue %s", catalogue.stats())
    return catalogue
