"""What the three card games share: the observation modes (text, image or both) and the image hook."""

from __future__ import annotations

import abc
import hashlib
from typing import Any

from environments.base import TextEnv
from environments.cards.draw import check_image_size

__all__ = ["OBSERVATION_MODES", "CardGameEnv", "rank_name"]

#: ``observation=``: the state as text (default, for text models and tests), drawn as an image, or both
OBSERVATION_MODES = ("text", "image", "both")
_RANKS = {1: "A", 11: "J", 12: "Q", 13: "K"}


def rank_name(rank: int) -> str:
    """The rank's label: 1 -> "A", 2..10 -> the number, 11/12/13 -> "J"/"Q"/"K"."""
    return _RANKS.get(rank, str(rank))


class CardGameEnv(TextEnv):
    """Base of the card games: ``observation`` = ``text`` | ``image`` | ``both`` and ``image_size`` pixels a side.

    A subclass implements ``_describe()`` (the whole state as text), ``_image_text()`` (what the text says when the
    image shows the state) and ``_draw()`` (the RGB PIL image). The anchor key is the state digest in every mode.
    """

    splits = ("train", "test")
    #: the game's action words (each subclass sets its own)
    actions: tuple[str, ...] = ()

    def __init__(self, *, key_mode: str, max_steps: int, observation: str, image_size: int) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        if observation not in OBSERVATION_MODES:
            raise ValueError(f"{self.name}: observation must be one of {OBSERVATION_MODES}, got {observation!r}")
        if observation == "image" and self.key_kind == "observation":
            raise ValueError(
                f"{self.name}: key_mode='observation' keys by the text, which observation='image' does not show in "
                "full; use key_mode='state' (the same groups: the drawing is one-to-one)"
            )
        self.observation = observation
        self.images_per_step = 0 if observation == "text" else 1
        self.image_size = check_image_size(image_size, self.name)

    def task_type_of(self, seed: int, split: str) -> str:
        """The game's name: every task of a game has the same type.

        Raises:
            ValueError: unknown split.
        """
        self._check_split(split)
        return self.name

    def _task_id(self, split: str, deal: str) -> str:
        return f"{split}-{hashlib.sha1(deal.encode()).hexdigest()[:12]}"

    def _state_observation(self) -> str:
        if self.observation == "image":
            return self._image_text()
        return self._describe()

    def _observation_images(self) -> list[Any]:
        return [self._draw()]

    @abc.abstractmethod
    def _describe(self) -> str: ...

    @abc.abstractmethod
    def _image_text(self) -> str: ...

    @abc.abstractmethod
    def _draw(self) -> Any: ...

    def _match_action(self, candidate: str) -> str | None:
        word = candidate.strip().strip("'\"`").strip()
        return word if word in self.actions else None

    def _admissible_actions(self) -> list[str]:
        return list(self.actions)
