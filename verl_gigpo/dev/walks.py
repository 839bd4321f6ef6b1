"""One episode of an environment walked by the caller's choice of action: the loop the dev tools' example and corpus
builders (:mod:`verl_gigpo.dev.tiny_model`, :mod:`verl_gigpo.dev.imitation`) share."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from environments import TextEnv

__all__ = ["walk"]

#: ``choose(obs, info, history)``: the action to take in this state, or None to end the walk
Choose = Callable[[str, dict[str, Any], list[tuple[str, str]]], "str | None"]


def walk(env: TextEnv, seed: int, choose: Choose, *, steps: int | None = None, options: dict | None = None) -> None:
    """Play one episode of ``env`` from ``reset(seed=seed, options=options)``, at most ``steps`` actions (None: until
    it ends); ``history`` holds the past ``(observation, action)`` pairs."""
    obs, info = env.reset(seed=seed, options=options)
    history: list[tuple[str, str]] = []
    for _ in itertools.count() if steps is None else range(steps):
        action = choose(obs, info, history)
        if action is None:
            return
        history.append((obs, action))
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return
