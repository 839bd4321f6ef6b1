"""Gridnav layouts drawn as RGB images, by this project's own code, from the state (numpy, no sprites, no font).

Each cell is a ``tile`` x ``tile`` square: free cells light grey, walls black, the goal a green square (a red one
while it is locked in the key variant), the key a yellow square until it is taken, the agent a blue disc. The
drawing is a pure function of (layout, agent, key held) and one-to-one on the states of a layout, so pixel keys and
state keys give the same anchor groups.
"""

from __future__ import annotations

import numpy as np

from environments.images import check_tile_size

__all__ = ["COLORS", "IMAGE_ONLY_TEXT", "render_grid_image"]

#: RGB colour of each thing drawn.
COLORS: dict[str, tuple[int, int, int]] = {
    "free": (200, 200, 200),
    "wall": (20, 20, 20),
    "goal": (40, 180, 60),
    "locked": (200, 50, 50),
    "key": (230, 200, 30),
    "agent": (50, 90, 230),
}

#: The text observation with ``observation='image'``: the state is in the image only.
IMAGE_ONLY_TEXT = "(The grid is shown in the image.)"


def render_grid_image(task: object, agent: tuple[int, int], has_key: bool, tile: int = 16) -> np.ndarray:
    """The grid as a uint8 RGB array (size * tile, size * tile, 3); ``task`` a gridnav ``GridTask``, ``agent`` the
    agent's cell, ``has_key`` whether the key is taken."""
    check_tile_size(tile, "gridnav")
    size = task.size
    img = np.empty((size * tile, size * tile, 3), dtype=np.uint8)  # (H, W, 3)
    yy, xx = np.mgrid[0:tile, 0:tile]  # (t, t) each
    centre = (tile - 1) / 2
    disc = (yy - centre) ** 2 + (xx - centre) ** 2 <= (0.4 * tile) ** 2  # (t, t)
    edge = max(1, tile // 8)
    inner = np.zeros((tile, tile), dtype=bool)
    inner[edge : tile - edge, edge : tile - edge] = True
    for r in range(size):
        for c in range(size):
            cell = img[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
            pos = (r, c)
            cell[:] = COLORS["wall" if pos in task.walls else "free"]
            if pos == task.goal:
                cell[inner] = COLORS["locked" if task.key is not None and not has_key else "goal"]
            elif pos == task.key and not has_key:
                cell[inner] = COLORS["key"]
            if pos == agent:
                cell[disc] = COLORS["agent"]
    return img
