"""The anchor-key modes the probe compares, as written on its command line (``--keys``): ``observation``,
``state``, ``history:K`` (``algorithm.gigpo.key_mode`` of that name) and ``similarity:T`` (``key_mode=similarity``
with ``similarity_threshold=T``, over the ``observation`` keys; ``similarity`` alone: T = 0.9). docs/probe.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from environments.base import parse_key_mode
from verl_gigpo.advantage.anchors import check_similarity_threshold
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.rules import DEFAULT_GAMMA

__all__ = ["DEFAULT_KEYS", "KeySpec", "parse_keys"]

#: the modes probed when ``--keys`` is not given
DEFAULT_KEYS = "state,observation,history:1,history:2,similarity:0.95,similarity:0.9,similarity:0.8"


@dataclass(frozen=True)
class KeySpec:
    """One anchor-key mode: ``name`` as written (the table's row label), ``env_mode`` the environment key mode it groups
    (``"observation"`` for similarity), ``similarity_threshold`` (None: exact keys)."""

    name: str
    env_mode: str
    similarity_threshold: float | None = None

    @property
    def kind(self) -> str:
        """``"state"``, ``"observation"``, ``"history"`` or ``"similarity"``."""
        return "similarity" if self.similarity_threshold is not None else parse_key_mode(self.env_mode)[0]

    def gigpo_config(self, *, method: str = "gigpo", gamma: float = DEFAULT_GAMMA) -> GiGPOConfig:
        """This mode's estimator settings (the rest at ``GiGPOConfig``'s defaults); ValueError: bad method or gamma."""
        if self.similarity_threshold is None:
            return GiGPOConfig(method=method, gamma=gamma, key_mode=self.env_mode)
        return GiGPOConfig(
            method=method, gamma=gamma, key_mode="similarity", similarity_threshold=self.similarity_threshold
        )


def parse_keys(text: str | Sequence[str]) -> list[KeySpec]:
    """The key modes of a comma-separated list (or a sequence of names), in order.

    Raises:
        ValueError: an empty list, an unknown mode, a bad threshold or a mode named twice (naming ``--keys``).
    """
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else [str(t).strip() for t in text]
    if not items or not all(items):
        raise ValueError(f"--keys {text!r}: give a comma-separated list of key modes, e.g. {DEFAULT_KEYS}")
    specs: list[KeySpec] = []
    for item in items:
        spec = _parse_one(item)
        if any(s.name == spec.name for s in specs):
            raise ValueError(f"--keys: {spec.name!r} is named twice")
        specs.append(spec)
    return specs


def _parse_one(item: str) -> KeySpec:
    if item == "similarity" or item.startswith("similarity:"):
        _, _, value = item.partition(":")
        if not value:
            threshold = GiGPOConfig.similarity_threshold
        else:
            try:
                threshold = float(value)
            except ValueError:
                raise ValueError(
                    f"--keys: {item!r}: the threshold {value!r} is not a number (similarity:T with T in (0, 1])"
                ) from None
        try:
            threshold = check_similarity_threshold(threshold)
        except ValueError as exc:
            raise ValueError(f"--keys: {item!r}: {exc}") from None
        return KeySpec(name=f"similarity:{threshold:g}", env_mode="observation", similarity_threshold=threshold)
    try:
        parse_key_mode(item)
    except ValueError as exc:
        raise ValueError(f"--keys: {exc}, or 'similarity:T' (observation texts grouped at similarity T)") from None
    return KeySpec(name=item, env_mode=item)
