"""Blackjack: one hand against the dealer, from an infinite deck (the reference's gym-cards task).

    env = make_env("blackjack", observation="image")

**Deal** (from ``self.np_random``): two cards each, drawn with replacement (every rank A..K equally likely, a
random suit). The dealer shows the first and keeps the second face down.

**Actions**: ``hit`` (take a card; over 21 ends the episode with reward 0) and ``stand`` (the dealer draws until
17 or more; reward 1 when the player's total beats the dealer's, a dealer over 21 counting 0; a loss or a tie gives
0). Aces count 11 unless that takes the hand over 21. ``natural=True`` pays 1.5 for a win with an ace and a
ten-card dealt. These are the reference's rules, losses scored 0 as it does.

**Anchor key** (``state``): the dealer's face-up card, the player's cards in order, and at the end the dealer's
whole hand: what the image shows.
"""

from __future__ import annotations

from typing import Any

from environments.base import StepResult
from environments.cards.common import CardGameEnv, rank_name
from environments.cards.draw import SUITS, draw_card, draw_card_back, font, new_canvas
from environments.cards.prompt import BLACKJACK_TASK

__all__ = ["ACTIONS", "BlackjackEnv", "hand_total"]

ACTIONS = ["hit", "stand"]
_SUIT_LETTERS = tuple(SUITS)
Card = tuple[int, str]  # (rank 1..13, suit letter)


def hand_total(cards: list[Card]) -> int:
    """The hand's total: ranks 2..10 their number, J/Q/K 10, aces 1, plus 10 for one ace when that stays <= 21."""
    total = sum(min(rank, 10) for rank, _ in cards)
    return total + 10 if any(rank == 1 for rank, _ in cards) and total + 10 <= 21 else total


class BlackjackEnv(CardGameEnv):
    """Blackjack (module docstring). Args: ``key_mode``, ``max_steps`` (default 15, the reference's recipe),
    ``observation``, ``image_size`` (default 300), ``natural`` (False)."""

    name = "blackjack"
    actions = tuple(ACTIONS)

    def __init__(
        self,
        *,
        key_mode: str = "state",
        max_steps: int = 15,
        observation: str = "text",
        image_size: int = 300,
        natural: bool = False,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps, observation=observation, image_size=image_size)
        if not isinstance(natural, bool):
            raise ValueError(f"blackjack: natural must be true or false, got {natural!r}")
        self.natural = natural
        self.task_type = "blackjack"
        self.task_description = BLACKJACK_TASK
        self.dealer: list[Card] = []
        self.player: list[Card] = []
        self.stood = False

    def _card(self) -> Card:
        return int(self.np_random.integers(1, 14)), str(self.np_random.choice(_SUIT_LETTERS))

    def _reset(self, split: str, options: dict[str, Any]) -> str:
        self.dealer = [self._card(), self._card()]
        self.player = [self._card(), self._card()]
        self.stood = False
        self.task_id = self._task_id(split, f"{self._cards(self.dealer)}|{self._cards(self.player)}")
        return self._state_observation()

    def _step(self, action: str) -> StepResult:
        if action == "hit":
            self.player.append(self._card())
            bust = hand_total(self.player) > 21
            return StepResult(observation=self._state_observation(), terminated=bust)
        while hand_total(self.dealer) < 17:
            self.dealer.append(self._card())
        self.stood = True
        mine = hand_total(self.player)
        theirs = hand_total(self.dealer) if hand_total(self.dealer) <= 21 else 0
        reward = 1.0 if mine > theirs else 0.0
        if reward and self.natural and sorted(min(r, 10) for r, _ in self.player) == [1, 10]:
            reward = 1.5
        return StepResult(observation=self._state_observation(), reward=reward, terminated=True, won=reward > 0)

    @staticmethod
    def _cards(cards: list[Card]) -> str:
        return " ".join(f"{rank_name(rank)}{suit}" for rank, suit in cards)

    def _state_digest(self) -> str:
        shown = self._cards(self.dealer if self.stood else self.dealer[:1])
        return f"{self.task_id}|dealer={shown}|player={self._cards(self.player)}"

    def _describe(self) -> str:
        def named(cards: list[Card]) -> str:
            return ", ".join(f"{rank_name(rank)} of {SUITS[suit]}" for rank, suit in cards)

        if self.stood:
            dealer = f"Dealer's cards: {named(self.dealer)} (total {hand_total(self.dealer)})."
        else:
            dealer = f"Dealer shows: {named(self.dealer[:1])}, and one card face down."
        return f"{dealer} Your cards: {named(self.player)} (total {hand_total(self.player)})."

    def _image_text(self) -> str:
        return "(The table is shown in the image: the dealer's cards on top, yours below.)"

    def _draw(self) -> Any:
        size = self.image_size
        image, draw = new_canvas(size)
        label = font(size // 18)
        draw.text((size * 0.02, size * 0.01), "Dealer", fill=(255, 255, 255), font=label)
        width, height = int(size * 0.16), int(size * 0.224)
        reveal = self.stood
        self._row(draw, self.dealer if reveal else self.dealer[:1], int(size * 0.08), width, height, back=not reveal)
        draw.text((size * 0.02, size * 0.42), "Player", fill=(255, 255, 255), font=label)
        rows = max(1, -(-len(self.player) // 5))
        room = size * 0.98 - size * 0.49
        row_h = min(height, int((room - (rows - 1) * 4) / rows))
        row_w = int(row_h / 1.4)
        for r in range(rows):
            top = int(size * 0.49) + r * (row_h + 4)
            self._row(draw, self.player[5 * r : 5 * r + 5], top, row_w, row_h, back=False)
        return image

    def _row(self, draw: Any, cards: list[Card], top: int, width: int, height: int, *, back: bool) -> None:
        gap = max(2, width // 12)
        left = int(self.image_size * 0.02)
        for rank, suit in cards:
            draw_card(draw, (left, top, left + width, top + height), rank_name(rank), suit)
            left += width + gap
        if back:
            draw_card_back(draw, (left, top, left + width, top + height))

    def _match_action(self, candidate: str) -> str | None:
        word = candidate.strip().strip("'\"`.").strip().lower()
        return word if word in self.actions else None
