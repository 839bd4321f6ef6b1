"""Shortest-plan Sokoban solver: breadth-first search over ``(player cell, box cells)`` states.

Every action costs one move (pushes and walks alike), so BFS returns a plan with the fewest moves. Blocked moves
are self-loops and never part of a shortest plan.

Pruning: a box pushed onto a *dead* cell — a non-target cell from which no push sequence can bring a box to
any target, even with every other box gone (e.g. a non-target corner) — can never be solved, so that successor is
dropped. This keeps every shortest plan (a shortest plan never visits an unsolvable state).

Cost: at most ``|floor| * C(|floor|, n_boxes)`` states; a 6x6 room with one box has <= 16 * 16 = 256 states and
a 7x7 room with two boxes <= 25 * 300 = 7,500, each solved in milliseconds.
"""

from __future__ import annotations

from collections import deque

from environments.sokoban.room import ACTIONS, DIRECTIONS, Room

__all__ = ["SolverLimitError", "solve"]


class SolverLimitError(RuntimeError):
    """The search visited more than ``max_states`` states without finishing."""


def _live_cells(room: Room, index: dict[tuple[int, int], int]) -> set[int]:
    """Cells from which a lone box can be pushed onto some target (backward search from the targets).

    A box at ``y`` can be pushed to ``y + d`` when ``y - d`` (the player's cell) and ``y + d`` are floor; so
    ``y`` is live when some ``y + d`` is live and ``y - d`` is floor.
    """
    live = {index[t] for t in room.targets}
    frontier = list(room.targets)
    while frontier:
        r, c = frontier.pop()
        for dr, dc in DIRECTIONS.values():
            box_from = (r - dr, c - dc)  # the box came from here, pushed in direction (dr, dc)
            player_from = (r - 2 * dr, c - 2 * dc)
            if box_from in index and player_from in index and index[box_from] not in live:
                live.add(index[box_from])
                frontier.append(box_from)
    return live


def solve(room: Room, max_states: int = 2_000_000) -> list[str] | None:
    """A shortest action list that puts every box of ``room`` on a target.

    Args:
        room: the start state.
        max_states: search budget (distinct states stored).

    Returns:
        The plan (``[]`` when already solved), or ``None`` when the room is unsolvable.

    Raises:
        SolverLimitError: more than ``max_states`` states were needed (room too large for exhaustive search).
    """
    if room.solved:
        return []
    cells = sorted(room.floor)
    index = {cell: i for i, cell in enumerate(cells)}
    # neighbour[i][a] = index of the cell next to cell i in direction ACTIONS[a], or -1 for a wall
    neighbour = [[index.get((r + DIRECTIONS[a][0], c + DIRECTIONS[a][1]), -1) for a in ACTIONS] for r, c in cells]
    targets = frozenset(index[t] for t in room.targets)
    live = _live_cells(room, index)
    start = (index[room.player], tuple(sorted(index[b] for b in room.boxes)))
    parent: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        for a in range(4):
            nxt = neighbour[player][a]
            if nxt < 0:
                continue
            if nxt in boxes:
                beyond = neighbour[nxt][a]
                if beyond < 0 or beyond in boxes or beyond not in live:
                    continue
                new_boxes = tuple(sorted(beyond if b == nxt else b for b in boxes))
            else:
                new_boxes = boxes
            child = (nxt, new_boxes)
            if child in parent:
                continue
            parent[child] = (state, a)
            if new_boxes is not boxes and targets.issuperset(new_boxes):
                plan = []
                node: tuple[int, tuple[int, ...]] | None = child
                while parent[node] is not None:
                    node, action = parent[node]
                    plan.append(ACTIONS[action])
                return plan[::-1]
            if len(parent) > max_states:
                raise SolverLimitError(
                    f"solve: more than max_states={max_states} states for a {room.height}x{room.width} room with "
                    f"{len(room.boxes)} boxes; raise max_states or use a smaller room"
                )
            queue.append(child)
    return None
