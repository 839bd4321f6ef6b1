"""WebShop as a text environment: the project's own simulator over a generated catalogue.

    from environments import make_env
    env = make_env("webshop", key_mode="state", max_steps=15)
    obs, info = env.reset(seed=3, options={"split": "test"})     # goal 3 of the fixed 500-goal test split
    obs, reward, terminated, truncated, info = env.step("search[men's t-shirt long sleeve navy]")

**Shop.** A catalogue generated from ``catalogue_seed`` (default 1,000 products over clothing, shoes, electronics
accessories, grocery and home), searched with BM25; see :mod:`environments.webshop.catalogue`. Pages, their text
and navigation are WebShop's (search, results with 10 products a page, item, description, features, done); see
:mod:`environments.webshop.pages`.

**Tasks.** ``reset(seed=i, options={"split": s})`` plays goal ``i mod len(split)`` of split ``s``: ``"test"`` has
the fixed goals 0-499 (so ``seed=500`` is goal 0 again; evaluate on seeds 0-499), ``"train"`` the next
``num_train_goals`` (default 5,000). ``reset(seed=None)`` draws a goal from the environment's generator.
``info["task_type"]`` is the target's category.

**Actions** (:mod:`environments.webshop.protocol`): ``search[keywords]`` on the search page, ``click[x]`` for a
button / product id / option value on the page, case-insensitive (canonical form lower case). An action that is
not available on the current page is not a valid action (``parse_action`` gives ``(None, False)``; the runner
then takes the invalid-action step); under the ``format`` invalid-action rule it is sent as an unmatched command
and, as in WebShop, nothing happens (the page stays). A reply without an action block sends its last 20
characters, as the reference's ``webshop_projection`` does. ``admissible_actions`` lists the clicks, and
``"search[<your query>]"`` on the
search page; ``example_actions()`` gives concrete searches there (the instruction without its price clause, the
product type, the product type with the wanted attributes).

**Reward** (:mod:`environments.webshop.reward`): 0 on every step except ``click[buy now]``, which ends the episode
(``terminated``) with WebShop's score
``r_type * (n_attr_matched + n_opt_matched + r_price) / (n_attr + n_opt + 1)`` in [0, 1];
``won`` is ``score == 1.0``. ``info["reward_parts"]`` then holds the breakdown and ``info["task_score"]`` the score.
With ``success_reward=R`` the reward is R for a purchase that scores 1.0 and 0 otherwise, the reference
implementation's rule for the GiGPO runs (10 there; the score stays in ``task_score``)
(:func:`environments.webshop.reward.episode_reward`).

**Anchor keys.** ``state``: :meth:`PageState.digest` — page kind, query, results page, product id, selected options,
sub-page. ``observation``: the page text (a pure function of that state).
"""

from __future__ import annotations

from typing import Any

from environments.base import StepResult, TextEnv
from environments.webshop.catalogue import Catalogue, Goal, build_catalogue
from environments.webshop.pages import PAGE_SIZE, PageState, apply, clickables, render
from environments.webshop.prompt import (
    WEBSHOP_HISTORY_ITEM,
    WEBSHOP_PROMPT,
    WEBSHOP_STEP_LIMIT_PHRASES,
    check_strategy_hints,
    strategy_fields,
)
from environments.webshop.protocol import SEARCH_PLACEHOLDER, canonical_action, split_action
from environments.webshop.reward import check_success_reward, episode_reward, purchase_reward

__all__ = ["WebShopEnv"]


_PRICE_CLAUSE = ", and price lower than"


class WebShopEnv(TextEnv):
    """WebShop-style shopping over a generated catalogue (see the module docstring).

    Args:
        key_mode: anchor-key mode (``"state"``, ``"observation"`` or ``"history:K"``).
        max_steps: step limit of an episode (default 15, the GiGPO paper's WebShop horizon).
        catalogue_seed: seed of the generated catalogue and its goals (not an episode seed).
        num_products: catalogue size (>= 50).
        num_train_goals: goals in the ``"train"`` split (the ``"test"`` split always has 500).
        success_reward: None (default) = WebShop's score in [0, 1] as the reward; a number R = R for a purchase
            scoring 1.0, else 0 (the reference's GiGPO runs: 10; :func:`environments.webshop.reward.episode_reward`).
        strategy_hints: the prompt advises how to shop and says how a purchase is scored (default True); False
            leaves that out, as the reference's prompt (:data:`environments.webshop.prompt.WEBSHOP_STRATEGY`).

    Raises:
        ValueError: a bad value.
    """

    name = "webshop"
    splits = ("train", "test")
    prompt_template = WEBSHOP_PROMPT
    history_item_template = WEBSHOP_HISTORY_ITEM
    step_limit_phrases = WEBSHOP_STEP_LIMIT_PHRASES
    format_fallback_chars = 20

    def __init__(
        self,
        *,
        key_mode: str = "state",
        max_steps: int = 15,
        catalogue_seed: int = 0,
        num_products: int = 1000,
        num_train_goals: int = 5000,
        success_reward: float | None = None,
        strategy_hints: bool = True,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        self.success_reward = check_success_reward(success_reward)
        self.strategy_hints = check_strategy_hints(strategy_hints)
        self.catalogue: Catalogue = build_catalogue(catalogue_seed, num_products, num_train_goals)
        self.goal: Goal | None = None
        self._page = PageState()
        self._reward: float | None = None

    def num_tasks(self, split: str) -> int:
        """Number of goals of ``split`` (500 for ``"test"``, ``num_train_goals`` for ``"train"``); ``reset(seed=i)``
        plays goal ``i`` modulo it.

        Raises:
            ValueError: unknown split.
        """
        self._check_split(split)
        return len(self.catalogue.goals[split])

    def task_type_of(self, seed: int, split: str) -> str:
        """The category of goal ``seed mod len(split)``, the goal ``reset(seed=seed)`` plays.

        Raises:
            ValueError: unknown split.
        """
        self._check_split(split)
        goals = self.catalogue.goals[split]
        return goals[int(seed) % len(goals)].category

    # ------------------------------------------------------------------ hooks
    def _prompt_fields(self) -> dict[str, str]:
        """``{strategy}``: the shopping advice, or nothing (``strategy_hints``)."""
        return strategy_fields(self.strategy_hints)

    def _reset(self, split: str, options: dict[str, Any]) -> str:
        goals = self.catalogue.goals[split]
        index = self.seed % len(goals) if self.seed is not None else int(self.np_random.integers(len(goals)))
        self.goal = goals[index]
        self.task_description = self.goal.instruction
        self.task_id = f"{split}-{index}"
        self.task_type = self.goal.category
        self._page = PageState()
        self._reward = None
        return self._state_observation()

    def _step(self, action: str) -> StepResult:
        parts = split_action(action)
        assert parts is not None, action  # a canonical action (from _match_action) always splits
        self._page = apply(self.catalogue, self._page, *parts)
        if self._page.kind != "done":
            return StepResult(observation=self._state_observation())
        assert self.goal is not None
        score = purchase_reward(self.goal, self.catalogue.product(self._page.item), dict(self._page.options))
        self._reward = score.total
        return StepResult(
            observation=self._state_observation(),
            reward=episode_reward(score.total, self.success_reward),
            terminated=True,
            won=score.total == 1.0,
            extra={"reward_parts": score.as_dict(), "purchased": self._page.item, "task_score": score.total},
        )

    def _state_digest(self) -> str:
        return self._page.digest()

    def _state_observation(self) -> str:
        return render(self.catalogue, self._page, self.task_description, self._reward)

    def _match_action(self, candidate: str) -> str | None:
        action = canonical_action(
            candidate,
            has_search_bar=self._page.kind == "search",
            clickables=set(clickables(self.catalogue, self._page)),
        )
        if action is None or self.parse_style.collapse_whitespace:
            return action
        # env.parse.collapse_whitespace=false, as WebShop's own parser: no space before the bracket, and a click
        # names the button exactly (a search's words are split anyway)
        written = self.parse_style.match_form(candidate)
        return action if written == action or (action.startswith("search[") and written.startswith("search[")) else None

    def _admissible_actions(self) -> list[str] | None:
        if self._page.kind == "search":
            return [SEARCH_PLACEHOLDER]
        return [f"click[{c}]" for c in clickables(self.catalogue, self._page)]

    # ------------------------------------------------------------------ helpers for tests and the checker
    @property
    def page(self) -> PageState:
        """The current page state."""
        return self._page

    def example_actions(self) -> list[str]:
        """On the search page, three concrete searches built from the goal; elsewhere the admissible clicks."""
        if self._page.kind != "search" or self.goal is None:
            return list(self._admissible_actions() or [])
        goal = self.goal
        queries = [
            goal.instruction.split(_PRICE_CLAUSE)[0],
            goal.product_type,
            " ".join([goal.product_type, *goal.attributes]),
        ]
        out: list[str] = []
        for query in queries:
            action = canonical_action(f"search[{query}]", has_search_bar=True, clickables=())
            if action is not None and action not in out:
                out.append(action)
        return out

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Pairs of different action sequences that reach the same page from the fresh search page:
        leave and come back (item -> back to search, item -> < prev, sub-page -> < prev, next > -> < prev),
        search again, and select options twice or in another order."""
        pairs = super().checker_paths()
        if self._page.kind != "search" or self.goal is None:
            return pairs
        search = self.example_actions()[0]
        found = self.catalogue.search(search[len("search[") : -1])
        pairs.append(([search, "click[back to search]"], []))
        if not found:
            return pairs
        item = f"click[{found[0].lower()}]"
        pairs += [
            ([search, item, "click[back to search]"], []),
            ([search, item, "click[back to search]", search], [search]),
            ([search, item, "click[< prev]"], [search]),
            ([search, item, "click[description]", "click[< prev]"], [search, item]),
        ]
        groups = [[f"click[{v}]" for v in values] for _, values in self.catalogue.product(found[0]).options]
        if groups and len(groups[0]) >= 2:
            first, second = groups[0][0], groups[0][1]
            pairs += [
                ([search, item, first, second], [search, item, second]),
                ([search, item, first, first], [search, item, first]),
                ([search, item, first, "click[features]", "click[< prev]"], [search, item, first]),
            ]
        if len(groups) >= 2:
            pairs.append(([search, item, groups[0][0], groups[1][0]], [search, item, groups[1][0], groups[0][0]]))
        if len(found) > PAGE_SIZE:
            other = f"click[{found[PAGE_SIZE].lower()}]"
            pairs += [
                ([search, "click[next >]", "click[< prev]"], [search]),
                ([search, "click[next >]", other, "click[< prev]"], [search, "click[next >]"]),
            ]
        return pairs
