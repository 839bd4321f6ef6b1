"""Text-agent environments with anchor-state keys (see :mod:`environments.base` for the contract).

    from environments import make_env, list_envs
    env = make_env("sokoban", key_mode="state", max_steps=20)

The registry maps each name to ``"module:Class"``; the module is imported only when that environment is
made, so optional heavy dependencies (ALFWorld's TextWorld engine, ...) cost nothing until used.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

from environments.base import EnvError, TextEnv

__all__ = [
    "EnvError",
    "TextEnv",
    "env_class",
    "env_target",
    "kwargs_from_json",
    "list_envs",
    "make_env",
    "register_env",
    "register_envs",
    "resolve_env",
]

# name -> "module:Class". Extra dependencies needed by an entry are named in its module's ImportError.
_REGISTRY: dict[str, str] = {
    "alfworld": "environments.alfworld.env:AlfWorldEnv",
    "blackjack": "environments.cards.blackjack:BlackjackEnv",
    "ezpoints": "environments.cards.ezpoints:EZPointsEnv",
    "gridnav": "environments.gridnav.env:GridNavEnv",
    "numberline": "environments.cards.numberline:NumberLineEnv",
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


def register_envs(registry: Mapping[str, str] | None) -> None:
    """Register every ``{name: "package.module:Class"}`` entry of ``registry`` (the ``env.registry`` config key of
    both engines; None or empty: nothing). Registering the same target twice is a no-op.

    verl runs its agent loops in Ray worker processes, where environments registered in the driver are unknown, so
    the config names them and every process registers them; the modules must be importable there (installed, or on
    ``PYTHONPATH``).

    Raises:
        ValueError: ``registry`` is not a mapping, a target is malformed, or a name is already registered to another
            target.
    """
    if not registry:
        return
    if not isinstance(registry, Mapping) and not hasattr(registry, "items"):
        raise ValueError(f"env.registry must map names to 'package.module:Class' targets, got {registry!r}")
    for name, target in registry.items():
        register_env(str(name), str(target))


def resolve_env(name_or_target: str) -> str:
    """The registry name of ``name_or_target``: a registered name as it is, or ``"package.module:Class"`` imported
    and registered under the class's ``name`` attribute (for command-line tools given a user's environment).

    Raises:
        ValueError: an unknown name (listing the known ones), or a class that is no :class:`TextEnv`.
        ImportError: the module cannot be imported.
    """
    if ":" not in name_or_target:
        env_class(name_or_target)  # raises ValueError naming the known environments
        return name_or_target
    module_name, class_name = name_or_target.split(":", 1)
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise ValueError(f"{name_or_target} is not a TextEnv subclass (environments.base.TextEnv)")
    register_env(cls.name, name_or_target)
    return cls.name


def list_envs() -> list[str]:
    """Names of the registered environments, sorted."""
    return sorted(_REGISTRY)


def env_class(name: str) -> type[TextEnv]:
    """The class registered under ``name`` (its module is imported; nothing is built), e.g. to call
    :meth:`TextEnv.setup_problems` before a run.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
        ImportError: the environment's module cannot be imported (the message says what to install).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known environments: {', '.join(list_envs())}")
    module_name, class_name = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


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


def kwargs_from_json(text: str, option: str = "--env-kwargs") -> dict[str, Any]:
    """``text``, an environment's constructor arguments as a JSON object, as a dict.

    Raises:
        ValueError: ``text`` is not JSON, or not a JSON object (naming ``option``).
    """
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option} is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"{option} must be a JSON object of constructor arguments, e.g. '{{\"size\": 7}}'; got {text!r}"
        )
    return kwargs
