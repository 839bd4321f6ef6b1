"""Adapter to a real WebShop installation (princeton-nlp/WebShop), speaking this package's text protocol.

    from environments import make_env
    env = make_env("webshop_real", num_products=1000, human_goals=True)   # needs `import web_agent_site`
    obs, info = env.reset(seed=7, options={"split": "test"})

It wraps WebShop's own text environment, ``web_agent_site.envs.web_agent_text_env.WebAgentTextEnv`` with
``observation_mode="text"``: WebShop's products, goals, Lucene search, pages and reward (``get_reward``) are used
as they are. What this adapter adds is the contract of :class:`environments.base.TextEnv`:

* **Tasks.** WebShop's goal list (after its fixed shuffle) is split as in WebShop's baselines: ``"test"`` = goals
  0-499, ``"train"`` = goals 500 and up. ``reset(seed=i)`` plays test goal ``i mod 500`` or train goal
  ``500 + i mod (n_goals - 500)``; ``task_id`` is ``"<split>-<WebShop goal index>"``, ``task_type`` the goal's
  category.
* **Actions.** The same syntax as the simulator (:mod:`environments.webshop.protocol`); ``search[...]`` only where
  the page has a search bar, ``click[...]`` only for the page's clickables (WebShop itself silently ignores other
  actions; here they are invalid actions under the ``admissible`` rule, and unmatched commands that change nothing
  under the ``format`` rule, which also sends a tag-less reply's last 20 characters). ``admissible_actions`` =
  ``"search[<your query>]"`` on the search page, else the clickables as ``click[...]`` (WebShop's own ``search``
  button is left out, as in WebShop's baselines).
* **Observation.** WebShop's text-mode page, unchanged. **Reward.** WebShop's, on ``click[buy now]``
  (terminated; ``won`` = reward == 1.0).
* **State digest.** Built from WebShop's session record: page kind (from the URL), keywords, results page,
  product, selected options (sorted, so the order of clicks does not matter) and sub-page.

Sessions: each adapter uses its own WebShop session prefix, and by default all adapters with the same settings
share one WebShop ``SimServer`` (loading the products and search index once per process, not once per group
member).

Status: written against WebShop's source (``web_agent_text_env.py``, ``engine.py``, ``goal.py``) but untested end
to end here — WebShop cannot be installed offline (its data, spaCy model and search index come from Google Drive
and GitHub).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from environments.base import StepResult, TextEnv
from environments.webshop.catalogue import NUM_TEST_GOALS
from environments.webshop.prompt import (
    WEBSHOP_HISTORY_ITEM,
    WEBSHOP_PROMPT,
    WEBSHOP_STEP_LIMIT_PHRASES,
    check_strategy_hints,
    strategy_fields,
)
from environments.webshop.protocol import SEARCH_PLACEHOLDER, canonical_action, split_action
from environments.webshop.reward import check_success_reward, episode_reward

__all__ = ["INSTALL_HINT", "WebShopRealEnv"]


INSTALL_HINT = (
    "environment 'webshop_real' needs a working WebShop installation (princeton-nlp/WebShop; the PyPI package "
    "'webshop' is an empty stub). Install it with Python <= 3.10 and Java: "
    "`git clone https://github.com/princeton-nlp/WebShop && cd WebShop && ./setup.sh -d small` "
    "(or `-d all`; it installs WebShop's requirements, downloads the product data and the spaCy model "
    "en_core_web_lg, and builds the search index), then put the checkout on the path: "
    "`export PYTHONPATH=/path/to/WebShop:$PYTHONPATH` so that `import web_agent_site` works. "
    "Without it, use the built-in simulator: make_env('webshop')."
)

# WebShop page names (SimServer.get_page_name) -> this package's page kinds.
_PAGE_KINDS = {"": "search", "search_results": "results", "item_page": "item", "item_sub_page": "item", "done": "done"}

_SERVERS: dict[tuple[Any, ...], Any] = {}
_SERVERS_LOCK = threading.Lock()
_SESSION_COUNTER = itertools.count()


def _import_webshop() -> type:
    """WebShop's ``WebAgentTextEnv`` class.

    Raises:
        ImportError: WebShop (or its spaCy model) is missing; the message says how to install it.
    """
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} (import failed: {exc!r})") from exc
    except OSError as exc:  # web_agent_site.engine.goal loads the spaCy model at import; a missing model is OSError
        raise ImportError(
            f"{INSTALL_HINT} Importing web_agent_site failed with {exc!r}: if the spaCy model is missing, run "
            "`python -m spacy download en_core_web_lg`."
        ) from exc
    return WebAgentTextEnv


class WebShopRealEnv(TextEnv):
    """A real WebShop behind the :class:`TextEnv` contract (see the module docstring).

    Args:
        key_mode: anchor-key mode (``"state"``, ``"observation"`` or ``"history:K"``).
        max_steps: step limit of an episode (default 15).
        num_products: WebShop's ``num_products`` (None = every product in the data file; 100, 1000 or 100000 need
            the matching prebuilt search index).
        human_goals: use WebShop's 12,087 human-written instructions (True, as in the paper) or its synthetic ones.
        file_path: WebShop's product file (None = WebShop's default ``DEFAULT_FILE_PATH``).
        share_server: share one WebShop ``SimServer`` between adapters with the same settings in this process.
        success_reward: None = WebShop's score as the reward; a number R = R for a purchase scoring 1.0, else 0
            (the reference's GiGPO runs use 10; :func:`environments.webshop.reward.episode_reward`).
        strategy_hints: the prompt advises how to shop and says how a purchase is scored (default True); False
            leaves that out, as the reference's prompt (:data:`environments.webshop.prompt.WEBSHOP_STRATEGY`).

    Raises:
        ImportError: WebShop is not importable (the message says how to install it).
        ValueError: a bad value.
    """

    name = "webshop_real"
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
        num_products: int | None = None,
        human_goals: bool = True,
        file_path: str | None = None,
        share_server: bool = True,
        success_reward: float | None = None,
        strategy_hints: bool = True,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        self.success_reward = check_success_reward(success_reward)
        self.strategy_hints = check_strategy_hints(strategy_hints)
        if num_products is not None and (isinstance(num_products, bool) or not isinstance(num_products, int)):
            raise ValueError(f"num_products must be None or an int, got {num_products!r}")
        text_env_cls = _import_webshop()
        kwargs: dict[str, Any] = {
            "observation_mode": "text",
            "num_products": num_products,
            "human_goals": bool(human_goals),
            "session_prefix": f"gigpo{next(_SESSION_COUNTER)}-",
        }
        if file_path is not None:
            kwargs["file_path"] = file_path
        key = (file_path, num_products, bool(human_goals))
        with _SERVERS_LOCK:
            server = _SERVERS.get(key) if share_server else None
            self._env = text_env_cls(server=server, **kwargs)
            if share_server:
                _SERVERS.setdefault(key, self._env.server)
        self._sub = ""
        self._has_search_bar = True
        self._clickables: dict[str, str] = {}  # normalised name -> WebShop's clickable name

    # ------------------------------------------------------------------ WebShop access
    def num_tasks(self, split: str) -> int:
        """Number of WebShop goals in ``split``: ``min(500, goals loaded)`` for ``"test"``, the rest for
        ``"train"`` (``reset(seed=i)`` plays goal ``i`` modulo it).

        Raises:
            ValueError: unknown split, or ``"train"`` when WebShop loaded 500 goals or fewer.
        """
        return self._split_goals(split)[1]

    def task_type_of(self, seed: int, split: str) -> str | None:
        """The category of the WebShop goal ``reset(seed=seed)`` plays in ``split`` (None when it has none).

        Raises:
            ValueError: unknown split, or ``"train"`` when WebShop loaded 500 goals or fewer.
        """
        offset, size = self._split_goals(split)
        category = self._env.server.goals[offset + int(seed) % size].get("category")
        return None if category is None else str(category)

    def _session(self) -> dict[str, Any]:
        return self._env.server.user_sessions[self._env.session]

    def _page_name(self) -> str:
        return self._env.server.get_page_name(self._env.browser.current_url) or ""

    def _refresh_actions(self) -> None:
        available = self._env.get_available_actions()
        self._has_search_bar = bool(available["has_search_bar"])
        self._clickables = {}
        for name in available["clickables"]:
            if name == "search":  # the search page's button; searching is the search[...] action
                continue
            self._clickables.setdefault(" ".join(str(name).lower().split()), name)

    def _split_goals(self, split: str) -> tuple[int, int]:
        """``(offset, size)`` of ``split`` in WebShop's goal list (see the module docstring)."""
        self._check_split(split)
        n = len(self._env.server.goals)
        if split == "test":
            return 0, min(NUM_TEST_GOALS, n)
        if n <= NUM_TEST_GOALS:
            raise ValueError(
                f"webshop_real: WebShop loaded only {n} goals, so there is no train split (goals 500 and up); "
                "load more products (num_products=None) or use split 'test'"
            )
        return NUM_TEST_GOALS, n - NUM_TEST_GOALS

    def _goal_index(self, split: str) -> int:
        offset, size = self._split_goals(split)
        draw = self.seed if self.seed is not None else int(self.np_random.integers(size))
        return offset + draw % size

    # ------------------------------------------------------------------ hooks
    def _prompt_fields(self) -> dict[str, str]:
        """``{strategy}``: the shopping advice, or nothing (``strategy_hints``)."""
        return strategy_fields(self.strategy_hints)

    def _reset(self, split: str, options: dict[str, Any]) -> str:
        index = self._goal_index(split)
        obs, _ = self._env.reset(session=index)
        goal = self._session()["goal"]
        self.task_description = str(goal["instruction_text"])
        self.task_id = f"{split}-{index}"
        self.task_type = str(goal.get("category")) if goal.get("category") is not None else None
        self._sub = ""
        self._refresh_actions()
        return obs

    def _step(self, action: str) -> StepResult:
        obs, reward, done, _ = self._env.step(action)  # the canonical action, in WebShop's spelling (_match_action)
        parts = split_action(action)
        self._sub = parts[1] if parts is not None and self._page_name() == "item_sub_page" else ""
        self._refresh_actions()
        score = float(reward or 0.0)
        return StepResult(
            observation=obs,
            reward=episode_reward(score, self.success_reward) if done else 0.0,
            terminated=bool(done),
            won=bool(done) and score == 1.0,
            extra={"task_score": score} if done else None,
        )

    def _state_digest(self) -> str:
        kind = _PAGE_KINDS.get(self._page_name(), self._page_name())
        if kind == "search":
            return "search|q=|p=0|id=|opts=|sub="
        session = self._session()
        options = ",".join(f"{k}={v}" for k, v in sorted((session.get("options") or {}).items()))
        asin = session.get("asin") or ""
        if kind == "done":
            return f"done|q=|p=0|id={asin}|opts={options}|sub="
        query = " ".join(session.get("keywords") or [])
        page = session.get("page") or 0
        return f"{kind}|q={query}|p={page}|id={asin}|opts={options}|sub={self._sub}"

    def _state_observation(self) -> str:
        return self._env.observation

    def _match_action(self, candidate: str) -> str | None:
        action = canonical_action(candidate, has_search_bar=self._has_search_bar, clickables=self._clickables)
        if action is None or not action.startswith("click["):
            return action
        return f"click[{self._clickables[action[len('click[') : -1]]}]"  # WebShop's own spelling of the clickable

    def _admissible_actions(self) -> list[str] | None:
        actions = [SEARCH_PLACEHOLDER] if self._has_search_bar else []
        return actions + [f"click[{name}]" for name in self._clickables.values()]

    def example_actions(self) -> list[str]:
        """On the search page: searches for the instruction (without its price clause) and for the goal's
        product query; elsewhere the admissible clicks."""
        if not self._has_search_bar:
            return list(self._admissible_actions() or [])
        goal = self._session()["goal"]
        queries = [self.task_description.split(", and price lower than")[0], str(goal.get("query") or "")]
        out: list[str] = []
        for query in queries:
            parts = split_action(f"search[{query}]")
            if parts is not None and f"search[{parts[1]}]" not in out:
                out.append(f"search[{parts[1]}]")
        return out

    def close(self) -> None:
        """Close WebShop's environment (the shared server stays loaded for other adapters)."""
        self._env.close()
