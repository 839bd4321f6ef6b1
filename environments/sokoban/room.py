"""Sokoban room state, the move rule and the text rendering shared by the generator, the solver and the env.

A :class:`Room` is immutable and hashable: ``height`` x ``width`` cells (the outer wall included), the set of
non-wall cells (``floor``, targets included), the targets, the boxes and the player. Cells are ``(row, col)``
tuples, row 0 at the top.

Rendering (one symbol per cell, cells separated by one space, rows by ``\\n``)::

    #  wall            _  floor
    O  target          X  box
    *  box on target   P  player
    S  player on target

The move rule (:func:`apply_move`) is the classic one: the player moves one cell; moving into a box pushes it
one cell further if that cell is floor without a box; a move into a wall, or a push into a wall or another box,
leaves the room as it was (the action is still a valid, spent move).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

__all__ = [
    "ACTIONS",
    "DIRECTIONS",
    "LEGEND",
    "SYMBOLS",
    "MoveOutcome",
    "Pos",
    "Room",
    "apply_move",
    "parse_room",
    "render_room",
]

Pos = tuple[int, int]

#: The four actions, in the order the environment lists them.
ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")

#: Action -> (row delta, column delta).
DIRECTIONS: dict[str, Pos] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

#: Cell kind -> symbol of the text rendering.
SYMBOLS: dict[str, str] = {
    "wall": "#",
    "floor": "_",
    "target": "O",
    "box": "X",
    "box_on_target": "*",
    "player": "P",
    "player_on_target": "S",
}

#: One-line legend of the rendering, shown to the agent in the task description.
LEGEND = "# wall, _ floor, O target, X box, * box on a target, P player, S player standing on a target"


@dataclass(frozen=True)
class Room:
    """One Sokoban state.

    Attributes:
        height, width: room size in cells, the outer wall included.
        floor: every non-wall cell (targets included); every other cell is a wall.
        targets: target cells (as many as boxes).
        boxes: cells holding a box.
        player: the player's cell.
    """

    height: int
    width: int
    floor: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos

    @property
    def solved(self) -> bool:
        """Whether every box stands on a target."""
        return self.boxes <= self.targets

    @property
    def boxes_on_targets(self) -> int:
        """Number of boxes standing on a target."""
        return len(self.boxes & self.targets)


class MoveOutcome(enum.Enum):
    """What one move did."""

    MOVED = "moved"  # the player walked one cell
    PUSHED = "pushed"  # the player walked one cell and pushed a box one cell
    BLOCKED_WALL = "blocked_wall"  # a wall is in the way: nothing changed
    BLOCKED_BOX = "blocked_box"  # the box in the way cannot move (wall or box behind it): nothing changed


def apply_move(room: Room, action: str) -> tuple[Room, MoveOutcome]:
    """Apply one canonical action (``"up"``, ``"down"``, ``"left"``, ``"right"``) to ``room``.

    Returns ``(new_room, outcome)``; when blocked, ``new_room is room``.

    Raises:
        KeyError: ``action`` is not one of :data:`ACTIONS`.
    """
    dr, dc = DIRECTIONS[action]
    pr, pc = room.player
    nxt = (pr + dr, pc + dc)
    if nxt not in room.floor:
        return room, MoveOutcome.BLOCKED_WALL
    if nxt not in room.boxes:
        return replace(room, player=nxt), MoveOutcome.MOVED
    beyond = (nxt[0] + dr, nxt[1] + dc)
    if beyond not in room.floor or beyond in room.boxes:
        return room, MoveOutcome.BLOCKED_BOX
    boxes = (room.boxes - {nxt}) | {beyond}
    return replace(room, boxes=frozenset(boxes), player=nxt), MoveOutcome.PUSHED


def render_room(room: Room) -> str:
    """The canonical text grid of ``room`` (see the module docstring); equal rooms give equal text."""
    rows = []
    for r in range(room.height):
        cells = []
        for c in range(room.width):
            pos = (r, c)
            on_target = pos in room.targets
            if pos not in room.floor:
                cells.append(SYMBOLS["wall"])
            elif pos in room.boxes:
                cells.append(SYMBOLS["box_on_target" if on_target else "box"])
            elif pos == room.player:
                cells.append(SYMBOLS["player_on_target" if on_target else "player"])
            else:
                cells.append(SYMBOLS["target" if on_target else "floor"])
        rows.append(" ".join(cells))
    return "\n".join(rows)


_PARSE = {
    "#": (False, False, False, False),  # (floor, target, box, player)
    "_": (True, False, False, False),
    "O": (True, True, False, False),
    "X": (True, False, True, False),
    "*": (True, True, True, False),
    "P": (True, False, False, True),
    "S": (True, True, False, True),
}


def parse_room(text: str) -> Room:
    """Build a :class:`Room` from its rendering (cells may or may not be separated by spaces).

    The inverse of :func:`render_room`; handy to write rooms by hand in tests and examples.

    Raises:
        ValueError: ragged rows, unknown symbols, no player or several players, box and target counts differ,
            or a floor cell on the border (the outer wall must be closed).
    """
    lines = [line.replace(" ", "") for line in text.strip("\n").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise ValueError("parse_room: empty room text")
    width = len(lines[0])
    if any(len(line) != width for line in lines):
        raise ValueError(f"parse_room: rows have different lengths {[len(line) for line in lines]}")
    floor, targets, boxes, players = set(), set(), set(), []
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            if ch not in _PARSE:
                raise ValueError(f"parse_room: unknown symbol {ch!r} at row {r}, col {c}; known: {''.join(_PARSE)}")
            is_floor, is_target, is_box, is_player = _PARSE[ch]
            if is_floor:
                if r in (0, len(lines) - 1) or c in (0, width - 1):
                    raise ValueError(f"parse_room: floor cell on the border at row {r}, col {c}; close the outer wall")
                floor.add((r, c))
            if is_target:
                targets.add((r, c))
            if is_box:
                boxes.add((r, c))
            if is_player:
                players.append((r, c))
    if len(players) != 1:
        raise ValueError(f"parse_room: expected exactly one player (P or S), found {len(players)}")
    if len(boxes) != len(targets) or not boxes:
        raise ValueError(
            f"parse_room: need as many boxes as targets (at least one), got {len(boxes)} and {len(targets)}"
        )
    return Room(len(lines), width, frozenset(floor), frozenset(targets), frozenset(boxes), players[0])
