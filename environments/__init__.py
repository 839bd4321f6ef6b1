"""Text-agent environments with anchor-state keys (see :mod:`environments.base` for the contract).

    from environments import make_env, list_envs
    env = make_env("sokoban", key_mode="state", max_steps=20)

The registry maps each name to ``"module:Class"``; the module is imported only when that environment is
made, so optional heavy dependencies (ALFWorld's TextWorld engine, ...) cost nothing until used.
"""

from __future__ import annotations

import importlib
from typing import Any

from environments.base import EnvError, TextEnv

__all__ = ["EnvError", "TextEnv", "env_class", "env_target", "list_envs", "make_env", "register_env"]

# name -> "module:Class". Extra dependencies needed by an entry are named in its module's ImportError.
_REGISTRY: dict[str, str] = {
    "alfworld": "environments.alfworld.env:AlfWorldEnv",
    "gridnav": "environments.gridnav.env:GridNavEnv",
    "search": "environments.search.env:SearchQAEnv",
    "sokoban": "environments.sokoban.env:SokobanEnv",
    "webshop": "environments.webshop.env:WebShopEnv",
    "webshop_real": "environments.webshop.real:WebShopRealEnv",
}


def register_env(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:ClassName"``) under ``name``; re-registering a name to a different
    target raises ``ValueError``."""
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:ClassName', got {target!r}")
    if name in _REGISTRY and _REGISTRY[name] != target:
        raise ValueError(f"environment {name!r} is already registered to {_REGISTRY[name]!r}")
    _REGISTRY[name] = target


def list_envs() -> list[str]:
    """Names of the registered environments, sorted."""
    return sorted(_REGISTRY)


def make_env(name: str, **config: Any) -> TextEnv:
    """Build the environment registered under ``name`` with constructor keyword arguments ``config``.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
        ImportError: the environment's optional dependency is missing (the message says what to install).
    """
    return env_class(name)(**config)


def env_target(name: str) -> str:
    """The ``"package.module:ClassName"`` registered under ``name`` (to register it again in another process).

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known environments: {', '.join(list_envs())}")
    return _REGISTRY[name]


def env_class(name: str) -> type[TextEnv]:
    """The class registered under ``name``, imported but not instantiated (e.g. to read ``thread_parallel``).

    Raises:
        ValueError: unknown ``name``; ImportError: its module cannot be imported.
    """
    module_name, class_name = env_target(name).split(":")
    return getattr(importlib.import_module(module_name), class_name)
