"""EZPoints: make 12 from two cards with ``+`` and ``*``, one symbol per move (the reference's gym-cards task).

    env = make_env("ezpoints", observation="image")      # the recipe's; "text" (default) shows the cards as text

**Deal** (from ``self.np_random``): a first card of rank 2..K; its value (J, Q, K count 10) is ``v``. When ``v``
divides 12 (2, 3, 4, 6), with probability 1/2 the second card's value is ``12 // v``, else ``12 - v``; so a formula
of 12 always exists. The two cards come in random order, with random suits.

**Actions** (all always admissible): ``1`` .. ``10``, ``+``, ``*``, ``=``.

- A number that no unused card shows changes nothing (a valid no-op, reward 0).
- Once the formula holds :data:`FORMULA_LIMIT` symbols, every move changes nothing, ``=`` included.
- ``=`` scores the formula and ends the episode: ``reward`` (default 10) when it uses both cards and its value
  (Python's arithmetic over digits, ``+`` and ``*``: numbers written side by side join, ``**`` is a power) is the
  target, else 0.

**Anchor key** (``state``): the deal and the formula. The image shows the cards and the formula, so pixel keys give
the same groups (tests/test_cards.py). Rules, rewards and limits follow the reference's EZPoints (docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from environments.base import PromptStyle, StepResult
from environments.cards.common import CardGameEnv, rank_name
from environments.cards.draw import SUITS, draw_card, font, new_canvas
from environments.cards.prompt import EZPOINTS_TASK

__all__ = ["ACTIONS", "FORMULA_LIMIT", "EZPointsEnv", "evaluate_formula"]

ACTIONS = [*(str(n) for n in range(1, 11)), "+", "*", "="]
#: symbols the formula holds at most (the reference stops growing it past 5)
FORMULA_LIMIT = 6
_SUIT_LETTERS = tuple(SUITS)


def evaluate_formula(text: str) -> int | None:
    """The value of ``text`` (digits, ``+``, ``*``) under Python's grammar (unary ``+``, ``**`` a right-binding
    power); None when it is not a well-formed expression."""
    tokens: list[str] = []
    i = 0
    while i < len(text):
        if text[i].isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            tokens.append(text[i:j])
            i = j
        elif text.startswith("**", i):
            tokens.append("**")
            i += 2
        elif text[i] in "+*":
            tokens.append(text[i])
            i += 1
        else:
            return None
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def factor() -> int | None:  # factor := '+' factor | power
        if peek() == "+":
            take()
            return factor()
        return power()

    def power() -> int | None:  # power := NUMBER ['**' factor]
        tok = peek()
        if tok is None or not tok.isdigit():
            return None
        base = int(take())
        if peek() != "**":
            return base
        take()
        exponent = factor()
        if exponent is None or exponent > 10_000:
            return None
        return base**exponent

    def term() -> int | None:  # term := factor ('*' factor)*
        value = factor()
        while value is not None and peek() == "*":
            take()
            right = factor()
            value = None if right is None else value * right
        return value

    value = term()  # expr := term ('+' term)*
    while value is not None and peek() == "+":
        take()
        right = term()
        value = None if right is None else value + right
    return value if pos == len(tokens) else None


class EZPointsEnv(CardGameEnv):
    """EZPoints (module docstring). Args: ``key_mode``, ``max_steps`` (default 8, the reference's recipe),
    ``observation`` (``text`` | ``image`` | ``both``), ``image_size`` (pixels a side, default 300), ``target``
    (12), ``reward`` (10)."""

    name = "ezpoints"
    actions = tuple(ACTIONS)

    def __init__(
        self,
        *,
        key_mode: str = "state",
        max_steps: int = 8,
        observation: str = "text",
        image_size: int = 300,
        target: int = 12,
        reward: float = 10.0,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps, observation=observation, image_size=image_size)
        if target != 12:
            raise ValueError(f"ezpoints: target must be 12 (the deal guarantees a formula of 12), got {target!r}")
        if isinstance(reward, bool) or not isinstance(reward, int | float) or reward <= 0:
            raise ValueError(f"ezpoints: reward must be a number > 0 (the reference's is 10), got {reward!r}")
        self.target, self.reward = target, float(reward)
        self.task_type = "ezpoints"
        self.task_description = EZPOINTS_TASK.format(target=target, reward=self.reward)
        self.cards: list[tuple[int, str]] = []  # (rank, suit)
        self.formula: list[str] = []

    @property
    def values(self) -> list[int]:
        """The cards' values (J, Q, K count 10)."""
        return [min(rank, 10) for rank, _ in self.cards]

    def _used(self) -> list[int]:
        return [int(sym) for sym in self.formula if sym.isdigit()]

    def _reset(self, split: str, options: dict[str, Any]) -> str:
        rng = self.np_random
        first = int(rng.integers(2, 14))
        value = min(first, 10)
        draw_product = value in (2, 3, 4, 6) and rng.random() <= 0.5
        second = 12 // value if draw_product else 12 - value
        suits = [str(rng.choice(_SUIT_LETTERS)), str(rng.choice(_SUIT_LETTERS))]
        self.cards = [(first, suits[0]), (second, suits[1])]
        if rng.random() <= 0.5:
            self.cards.reverse()
        self.formula = []
        self.task_id = self._task_id(split, self._deal())
        return self._state_observation()

    def _deal(self) -> str:
        return " ".join(f"{rank_name(rank)}{suit}" for rank, suit in self.cards)

    def _step(self, action: str) -> StepResult:
        if len(self.formula) >= FORMULA_LIMIT:
            return StepResult(observation=self._state_observation())
        if action.isdigit():
            used = [*self._used(), int(action)]
            if used.count(int(action)) > self.values.count(int(action)):
                return StepResult(observation=self._state_observation())
        if action == "=":
            value = evaluate_formula("".join(self.formula))
            won = value == self.target and len(self._used()) == len(self.cards)
            return StepResult(
                observation=self._state_observation(), reward=self.reward if won else 0.0, terminated=True, won=won
            )
        self.formula.append(action)
        return StepResult(observation=self._state_observation())

    def _state_digest(self) -> str:
        return f"{self.task_id}|cards={self._deal()}|formula={' '.join(self.formula)}"

    def prompt_fields(
        self,
        observation: str,
        info: dict[str, Any],
        history: Sequence[tuple[str, str]] = (),
        style: PromptStyle | None = None,
    ) -> dict[str, Any]:
        """TextEnv's fields plus ``formula``: the formula built so far, e.g. ``"3*4"`` (a template's ``{formula}``)."""
        return {**super().prompt_fields(observation, info, history, style), "formula": "".join(self.formula)}

    def _formula_text(self) -> str:
        return f"Formula: {''.join(self.formula) or '(empty)'}"

    def _describe(self) -> str:
        cards = ", ".join(f"{rank_name(rank)} of {SUITS[suit]}" for rank, suit in self.cards)
        return f"Cards: {cards}. {self._formula_text()}"

    def _image_text(self) -> str:
        return f"(The cards are shown in the image.) {self._formula_text()}"

    def _draw(self) -> Any:
        size = self.image_size
        image, draw = new_canvas(size)
        width = int(size * 0.38)
        height = int(width * 1.4)
        top = int(size * 0.12)
        for i, (rank, suit) in enumerate(self.cards):
            left = int(size * 0.06) + i * int(size * 0.5)
            draw_card(draw, (left, top, left + width, top + height), rank_name(rank), suit)
        formula = " ".join(self.formula)
        draw.text((size * 0.05, size * 0.84), f"Formula: {formula}", fill=(255, 255, 255), font=font(size // 15))
        return image

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Besides the default pair: a number no card shows (a no-op) vs nothing."""
        pairs = super().checker_paths()
        missing = next((str(n) for n in range(1, 11) if n not in self.values), None)
        if missing is not None and len(self.formula) < FORMULA_LIMIT:
            pairs.append(([missing], []))
        return pairs
