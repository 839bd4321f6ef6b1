"""WebShop: the project's own WebShop-style simulator (generated catalogue, BM25 search, WebShop's pages, text
protocol and reward) and an adapter to a real WebShop installation (princeton-nlp/WebShop).

    from environments import make_env
    env = make_env("webshop")         # the simulator (environments.webshop.env.WebShopEnv)
    env = make_env("webshop_real")    # a real WebShop, when `web_agent_site` is importable (real.WebShopRealEnv)
"""

from environments.webshop.catalogue import NUM_TEST_GOALS, Catalogue, Goal, Product, build_catalogue
from environments.webshop.env import WebShopEnv
from environments.webshop.pages import PageState
from environments.webshop.protocol import SEARCH_PLACEHOLDER, canonical_action, split_action
from environments.webshop.real import WebShopRealEnv
from environments.webshop.reward import RewardBreakdown, purchase_reward

__all__ = [
    "NUM_TEST_GOALS",
    "SEARCH_PLACEHOLDER",
    "Catalogue",
    "Goal",
    "PageState",
    "Product",
    "RewardBreakdown",
    "WebShopEnv",
    "WebShopRealEnv",
    "build_catalogue",
    "canonical_action",
    "purchase_reward",
    "split_action",
]
