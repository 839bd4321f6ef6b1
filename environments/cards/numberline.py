"""NumberLine: move a marker along a number line onto a target (the reference's gym-cards task).

    env = make_env("numberline", observation="image")

**Task** (from ``self.np_random``): a start and a target drawn uniformly in ``0..max_position`` (default 5); when
they are equal, the target becomes ``(target + 1) % max_position``, as in the reference.

**Actions**: ``+`` (one to the right, none past ``max_position``) and ``-`` (one to the left, none below 0).
Reaching the target gives reward 1 and ends the episode; a move that does not bring the marker closer gives -1;
any other 0. The reference stops an episode after ``2 * max_position`` moves: ``max_steps`` defaults to that.

**Anchor key** (``state``): the task and the marker's position, all the image shows.
"""

from __future__ import annotations

from typing import Any

from environments.base import StepResult
from environments.cards.common import CardGameEnv
from environments.cards.draw import font, new_canvas
from environments.cards.prompt import NUMBERLINE_TASK

__all__ = ["ACTIONS", "NumberLineEnv"]

ACTIONS = ["-", "+"]


class NumberLineEnv(CardGameEnv):
    """NumberLine (module docstring). Args: ``key_mode``, ``max_steps`` (default ``2 * max_position``),
    ``observation``, ``image_size`` (default 300), ``max_position`` (default 5, in [2, 20])."""

    name = "numberline"
    actions = tuple(ACTIONS)

    def __init__(
        self,
        *,
        key_mode: str = "state",
        max_steps: int | None = None,
        observation: str = "text",
        image_size: int = 300,
        max_position: int = 5,
    ) -> None:
        if isinstance(max_position, bool) or not isinstance(max_position, int) or not 2 <= max_position <= 20:
            raise ValueError(f"numberline: max_position must be an int in [2, 20], got {max_position!r}")
        steps = 2 * max_position if max_steps is None else max_steps
        super().__init__(key_mode=key_mode, max_steps=steps, observation=observation, image_size=image_size)
        self.max_position = max_position
        self.task_type = "numberline"
        self.task_description = NUMBERLINE_TASK.format(max_position=max_position)
        self.position = self.target = 0

    def _reset(self, split: str, options: dict[str, Any]) -> str:
        start = int(self.np_random.integers(0, self.max_position + 1))
        target = int(self.np_random.integers(0, self.max_position + 1))
        if start == target:
            target = (target + 1) % self.max_position
        self.position, self.target = start, target
        self.task_id = self._task_id(split, f"start={start} target={target} max={self.max_position}")
        return self._state_observation()

    def _step(self, action: str) -> StepResult:
        before = abs(self.position - self.target)
        if action == "+":
            self.position = min(self.position + 1, self.max_position)
        else:
            self.position = max(self.position - 1, 0)
        after = abs(self.position - self.target)
        won = after == 0
        reward = 1.0 if won else (-1.0 if after >= before else 0.0)
        return StepResult(observation=self._state_observation(), reward=reward, terminated=won, won=won)

    def _state_digest(self) -> str:
        return f"{self.task_id}|target={self.target}|position={self.position}"

    def _describe(self) -> str:
        return f"Target: {self.target}. Current: {self.position}."

    def _image_text(self) -> str:
        return "(The number line, the target and the marker are shown in the image.)"

    def _draw(self) -> Any:
        size = self.image_size
        image, draw = new_canvas(size, (255, 255, 255))
        left, right, y = size * 0.1, size * 0.9, size * 0.55
        draw.line([(left, y), (right, y)], fill=(0, 0, 0), width=max(1, size // 150))
        gap = (right - left) / self.max_position
        label = font(size // 14)
        for n in range(self.max_position + 1):
            x = left + n * gap
            draw.line([(x, y - size * 0.03), (x, y + size * 0.03)], fill=(0, 0, 0), width=max(1, size // 150))
            draw.text((x - size * 0.02, y + size * 0.05), str(n), fill=(0, 0, 0), font=label)
        r = size * 0.04
        tx = left + self.target * gap
        draw.ellipse([tx - r, y - r, tx + r, y + r], outline=(220, 30, 30), width=max(2, size // 75))
        mx = left + self.position * gap
        draw.polygon([(mx, y - size * 0.06), (mx - r, y - size * 0.16), (mx + r, y - size * 0.16)], fill=(30, 90, 220))
        text = font(size // 12)
        draw.text((size * 0.08, size * 0.08), f"Target: {self.target}", fill=(200, 30, 30), font=text)
        draw.text((size * 0.08, size * 0.2), f"Current: {self.position}", fill=(30, 90, 220), font=text)
        return image
