"""Grid navigation with walls (and optionally a key): the demo task a tiny model learns from scratch on a CPU.

The agent walks on a ``size x size`` grid with a few walls; start, goal (and key) are random per task seed.
The observation gives the blocked sides of the agent's cell (compass words) and the *offset* to the goal in
words (rows grow downwards), e.g.::

    walls: north, east. goal: down 2, left 1.

because a model trained from scratch with sparse reward finds that feature, and not, for instance, a raw text
picture of the grid (flat for 780 iterations in a measurement; see "Why this task" in docs/local-engine.md). The
offset comes last, next to where the reply starts, and the walls use words that are not actions, so the only action
words in the observation point at the target. Actions: ``up``, ``down``, ``left``, ``right`` (bare words or
``<action>...</action>``). Moving into a wall or off the grid is a valid no-op (the step still counts); so is,
under the ``format`` invalid-action rule (the default one of :mod:`environments.base`: an action block and think
tags), a well-formed reply naming another word: the step counts, nothing moves, no penalty. Reward 1 on
reaching the goal (terminated, won); 0 otherwise. The prompt (``prompt.py``) is just the recent history and this
observation: short prompts keep CPU training fast.

Variants (constructor arguments; defaults = the demo task):

* ``size`` (5), ``walls`` (``(3, 6)``: a number or an inclusive range), ``min_path`` (3, shortest solution
  length), ``max_steps`` (10): bigger grids and more steps give longer horizons.
* ``key=True``: a key lies somewhere; the goal is a locked door (a wall) until the agent steps on the key
  (which picks it up). The decision to fetch the key pays off only later, at the door — a task where
  step-level credit should matter. ``min_path`` then counts the whole way start -> key -> goal.
* ``observe``: what the observation shows in the key variant: ``"all"`` (default; the key's offset, or
  ``key: held``, and the goal's offset — the agent must learn to go for the key first) or ``"target"`` (only
  the offset of the current target: the key until it is held, then the goal).
* ``show_blocked`` (True): name the blocked sides (``walls: ...``) in the observation.
* ``key_reward`` (0.0): reward for picking up the key (0 keeps the reward sparse).
* ``observation`` (``"text"``): ``"image"`` draws the grid (``render.py``, ``tile_size`` pixels per cell, default
  16) and the text says only that it is in the image; ``"both"`` shows the text and the drawing. For a
  vision-language model (docs/vision.md).

Anchor keys: ``state`` = task id + agent position (+ key status); ``observation`` = the observation text (it
identifies the position too, since the offset to a fixed target does).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from environments.base import StepResult, TextEnv
from environments.gridnav.prompt import HISTORY_ITEM_TEMPLATE, PROMPT_TEMPLATE
from environments.gridnav.render import IMAGE_ONLY_TEXT, render_grid_image
from environments.images import check_tile_size

__all__ = ["ACTIONS", "GridNavEnv", "GridTask", "generate_task", "shortest_path"]

Cell = tuple[int, int]

#: action -> (row delta, column delta); rows grow downwards.
ACTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
#: Blocked sides are named with compass words, so that the action words in an observation only ever point to
#: the target (a model trained from scratch first learns "the direction word in the observation is the move").
_COMPASS = {"up": "north", "down": "south", "left": "west", "right": "east"}
_MAX_TRIES = 10_000
#: Largest grid side accepted (layouts are drawn and solved by BFS at every reset).
MAX_SIZE = 64


@dataclass(frozen=True)
class GridTask:
    """One layout. Cells are ``(row, column)``, row 0 at the top.

    size: grid side; walls: wall cells; start, goal: cells; key: the key's cell, or None (no key variant).
    """

    size: int
    walls: frozenset[Cell]
    start: Cell
    goal: Cell
    key: Cell | None = None

    def blocked(self, cell: Cell, has_key: bool) -> bool:
        """Whether ``cell`` cannot be entered: off the grid, a wall, or the goal while it is locked."""
        r, c = cell
        if not (0 <= r < self.size and 0 <= c < self.size) or cell in self.walls:
            return True
        return self.key is not None and not has_key and cell == self.goal

    def move(self, cell: Cell, action: str, has_key: bool) -> Cell:
        """The cell reached from ``cell`` by ``action`` (the same cell when the move is blocked)."""
        dr, dc = ACTIONS[action]
        nxt = (cell[0] + dr, cell[1] + dc)
        return cell if self.blocked(nxt, has_key) else nxt

    def render(self, agent: Cell | None = None, has_key: bool = False) -> str:
        """ASCII picture for humans: ``#`` wall, ``A`` agent, ``G`` goal, ``K`` key (not yet taken), ``.`` free."""
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                cell = (r, c)
                if cell == agent:
                    row.append("A")
                elif cell in self.walls:
                    row.append("#")
                elif cell == self.goal:
                    row.append("G")
                elif cell == self.key and not has_key:
                    row.append("K")
                else:
                    row.append(".")
            rows.append("".join(row))
        return "\n".join(rows)


def shortest_path(task: GridTask, start: Cell, target: Cell, has_key: bool) -> list[str] | None:
    """Breadth-first search: the shortest action list from ``start`` to ``target`` (None when unreachable).

    Ties are broken in the fixed order up, down, left, right, so the result is deterministic.
    """
    if start == target:
        return []
    parent: dict[Cell, tuple[Cell, str]] = {}
    seen = {start}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for action in ACTIONS:
            nxt = task.move(cell, action, has_key)
            if nxt in seen:
                continue
            seen.add(nxt)
            parent[nxt] = (cell, action)
            if nxt == target:
                path = []
                while nxt != start:
                    nxt, act = parent[nxt]
                    path.append(act)
                return path[::-1]
            queue.append(nxt)
    return None


def _solution(task: GridTask) -> list[str] | None:
    """Shortest full solution of ``task`` (through the key in the key variant), or None."""
    if task.key is None:
        return shortest_path(task, task.start, task.goal, has_key=False)
    to_key = shortest_path(task, task.start, task.key, has_key=False)
    if to_key is None:
        return None
    to_goal = shortest_path(task, task.key, task.goal, has_key=True)
    return None if to_goal is None else to_key + to_goal


def generate_task(rng: np.random.Generator, *, size: int, walls: tuple[int, int], min_path: int, key: bool) -> GridTask:
    """Draw a solvable layout from ``rng``: ``walls[0]..walls[1]`` walls, start/goal(/key) on free cells, and a
    shortest solution of at least ``min_path`` steps.

    Raises:
        ValueError: when no such layout turns up in 10,000 draws (lower ``min_path`` or the wall count).
    """
    n_cells = size * size
    n_items = 3 if key else 2
    for _ in range(_MAX_TRIES):
        n_walls = int(rng.integers(walls[0], walls[1] + 1))
        cells = rng.choice(n_cells, size=n_walls + n_items, replace=False)
        as_cells = [(int(i) // size, int(i) % size) for i in cells]
        task = GridTask(
            size=size,
            walls=frozenset(as_cells[:n_walls]),
            start=as_cells[n_walls],
            goal=as_cells[n_walls + 1],
            key=as_cells[n_walls + 2] if key else None,
        )
        path = _solution(task)
        if path is not None and len(path) >= min_path:
            return task
    raise ValueError(
        f"gridnav: no solvable {size}x{size} layout with walls={walls} and min_path={min_path} in {_MAX_TRIES} "
        "draws; lower min_path or the number of walls"
    )


def _offset_words(frm: Cell, to: Cell) -> str:
    dr, dc = to[0] - frm[0], to[1] - frm[1]
    parts = []
    if dr:
        parts.append(f"{'down' if dr > 0 else 'up'} {abs(dr)}")
    if dc:
        parts.append(f"{'right' if dc > 0 else 'left'} {abs(dc)}")
    return ", ".join(parts) if parts else "here"


class GridNavEnv(TextEnv):
    """Grid navigation (see the module docstring for the task, the observation and the variants).

    Args:
        key_mode, max_steps: see :class:`environments.base.TextEnv` (``max_steps`` default 10).
        size: grid side, in [3, :data:`MAX_SIZE`].
        walls: number of walls, or an inclusive ``(low, high)`` range drawn per task.
        min_path: minimum length of the shortest solution.
        key: add a key that unlocks the goal.
        observe: ``"all"`` or ``"target"`` (key variant only; see the module docstring).
        show_blocked: name the blocked sides of the agent's cell in the observation.
        key_reward: reward for picking up the key.
        observation: ``"text"``, ``"image"`` or ``"both"``; tile_size: pixels per cell of the drawing.
    """

    name = "gridnav"
    splits = ("train", "test")
    prompt_template = PROMPT_TEMPLATE
    history_item_template = HISTORY_ITEM_TEMPLATE

    def __init__(
        self,
        *,
        key_mode: str = "state",
        max_steps: int = 10,
        size: int = 5,
        walls: int | tuple[int, int] | list[int] = (3, 6),
        min_path: int = 3,
        key: bool = False,
        observe: str = "all",
        show_blocked: bool = True,
        key_reward: float = 0.0,
        observation: str = "text",
        tile_size: int = 16,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        if observation not in ("text", "image", "both"):
            raise ValueError(f"gridnav: observation must be 'text', 'image' or 'both', got {observation!r}")
        if observation == "image" and self.key_kind == "observation":
            raise ValueError(
                "gridnav: key_mode='observation' keys by the observation text, which observation='image' does not "
                "show; use key_mode='state' (the same groups: the drawing is one-to-one)"
            )
        self.observation = observation
        self.images_per_step = 0 if observation == "text" else 1
        self.tile_size = check_tile_size(tile_size, "gridnav")
        if isinstance(size, bool) or not isinstance(size, int) or not 3 <= size <= MAX_SIZE:
            raise ValueError(
                f"gridnav: size must be an int in [3, {MAX_SIZE}], got {size!r} (layouts are drawn and solved by "
                "breadth-first search at every reset; the demo uses 5)"
            )
        lo, hi = (walls, walls) if isinstance(walls, int) else tuple(walls)
        if not (0 <= lo <= hi) or hi > size * size - 3:
            raise ValueError(
                f"gridnav: walls must be a count or (low, high) with 0 <= low <= high < size^2-2, got {walls!r}"
            )
        if isinstance(min_path, bool) or not isinstance(min_path, int) or not 1 <= min_path < size * size:
            raise ValueError(
                f"gridnav: min_path must be an int in [1, size^2 - 1] = [1, {size * size - 1}] (no path is longer "
                f"than the cells of the grid), got {min_path!r}"
            )
        if observe not in ("all", "target"):
            raise ValueError(f"gridnav: observe must be 'all' (key and goal offsets) or 'target', got {observe!r}")
        self.size = size
        self.walls_range = (int(lo), int(hi))
        self.min_path = min_path
        self.with_key = bool(key)
        self.observe = observe
        self.show_blocked = bool(show_blocked)
        self.key_reward = float(key_reward)
        self.task: GridTask | None = None
        self.agent: Cell = (0, 0)
        self.has_key = False

    def task_type_of(self, seed: int, split: str) -> str:
        """``"key"`` in the key variant, else ``"goal"`` (every task of a variant has the same type).

        Raises:
            ValueError: unknown split.
        """
        self._check_split(split)
        return "key" if self.with_key else "goal"

    # ------------------------------------------------------------------ hooks
    def _reset(self, split: str, options: dict[str, Any]) -> str:
        self.task = generate_task(
            self.np_random, size=self.size, walls=self.walls_range, min_path=self.min_path, key=self.with_key
        )
        self.agent = self.task.start
        self.has_key = False
        layout = self.task.render()
        if self.with_key:
            layout += f"\nkey={self.task.key}"
        self.task_id = f"{split}-{hashlib.sha1(layout.encode()).hexdigest()[:12]}"
        self.task_type = "key" if self.with_key else "goal"
        self.task_description = "Get the key, then reach the goal." if self.with_key else "Reach the goal."
        return self._state_observation()

    def _step(self, action: str) -> StepResult:
        assert self.task is not None
        self.agent = self.task.move(self.agent, action, self.has_key)
        reward = 0.0
        extra: dict[str, Any] = {"agent": self.agent}
        if self.with_key and not self.has_key and self.agent == self.task.key:
            self.has_key = True
            reward += self.key_reward
            extra["picked_key"] = True
        won = self.agent == self.task.goal  # the locked goal cannot be entered, so reaching it means it is open
        if won:
            reward += 1.0
        return StepResult(observation=self._state_observation(), reward=reward, terminated=won, won=won, extra=extra)

    def _state_digest(self) -> str:
        digest = f"{self.task_id}|agent={self.agent[0]},{self.agent[1]}"
        return digest + (f"|key={'held' if self.has_key else 'no'}" if self.with_key else "")

    def _observation_images(self) -> list[np.ndarray]:
        assert self.task is not None
        return [render_grid_image(self.task, self.agent, self.has_key, self.tile_size)]

    def _state_observation(self) -> str:
        task = self.task
        assert task is not None
        if self.observation == "image":
            return IMAGE_ONLY_TEXT
        parts = []
        if self.with_key and not (self.observe == "target" and self.has_key):
            parts.append("key: held" if self.has_key else f"key: {_offset_words(self.agent, task.key)}")
        if not (self.with_key and self.observe == "target" and not self.has_key):
            parts.append(f"goal: {_offset_words(self.agent, task.goal)}")
        text = ". ".join(parts) + "."
        if self.show_blocked:
            blocked = [_COMPASS[a] for a in ACTIONS if task.move(self.agent, a, self.has_key) == self.agent]
            text = f"walls: {', '.join(blocked) if blocked else 'none'}. {text}"
        return text

    def _match_action(self, candidate: str) -> str | None:
        word = candidate.strip().strip(".!").strip().lower()
        return word if word in ACTIONS else None

    def _admissible_actions(self) -> list[str] | None:
        return list(ACTIONS)

    # ------------------------------------------------------------------ helpers
    def oracle_action(self) -> str:
        """A shortest-path action from the current state (through the key first when it is needed)."""
        task = self.task
        if task is None:
            raise RuntimeError("gridnav: call reset() before oracle_action()")
        target = task.key if self.with_key and not self.has_key else task.goal
        path = shortest_path(task, self.agent, target, self.has_key)
        if not path:
            raise RuntimeError(f"gridnav: no path from {self.agent} to {target} (task {self.task_id})")
        return path[0]

    def render_grid(self) -> str:
        """ASCII picture of the current state (see :meth:`GridTask.render`)."""
        if self.task is None:
            raise RuntimeError("gridnav: call reset() before render_grid()")
        return self.task.render(self.agent, self.has_key)

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Besides the default pair: a bump into a blocked side vs nothing, and a round trip vs nothing."""
        pairs = super().checker_paths()
        task = self.task
        if task is None:
            return pairs
        for action, back in _OPPOSITE.items():
            nxt = task.move(self.agent, action, self.has_key)
            if nxt == self.agent:
                pairs.append(([action], []))
            elif nxt not in (task.goal, task.key):
                pairs.append(([action, back], [None]))
        return pairs
