"""Sokoban rooms drawn as RGB images, by this project's own code, from the room state (no sprites, no font).

Each cell is a ``tile`` x ``tile`` square: walls brick red, floor dark grey, targets a red outlined square on the
floor, boxes an amber square (green when on a target), the player a blue disc. The drawing is a pure function of
the room and the tile size, and one-to-one: different rooms give different pixels (tests/test_vision_env.py
checks it on rendered episodes), so pixel keys and state keys make the same anchor groups.
"""

from __future__ import annotations

import numpy as np

from environments.images import check_tile_size
from environments.sokoban.room import Room

__all__ = ["COLORS", "IMAGE_LEGEND", "render_room_image"]

#: RGB colour of each thing drawn.
COLORS: dict[str, tuple[int, int, int]] = {
    "wall": (160, 60, 40),
    "floor": (40, 40, 40),
    "target": (230, 40, 40),
    "box": (220, 160, 30),
    "box_on_target": (40, 200, 80),
    "player": (60, 120, 240),
}


#: What the drawing shows, for the task description of the image observation.
IMAGE_LEGEND = (
    "in the image, brick-red squares are walls, dark grey squares floor, a red outline a target, an amber square a "
    "box (green when on a target), the blue disc you"
)


def render_room_image(room: Room, tile: int = 8) -> np.ndarray:
    """The room as a uint8 RGB array of shape (height * tile, width * tile, 3); ``tile``: pixels per cell."""
    check_tile_size(tile, "sokoban")
    img = np.empty((room.height * tile, room.width * tile, 3), dtype=np.uint8)  # (H*t, W*t, 3)
    yy, xx = np.mgrid[0:tile, 0:tile]  # (t, t) each
    centre = (tile - 1) / 2
    disc = (yy - centre) ** 2 + (xx - centre) ** 2 <= (0.35 * tile) ** 2  # (t, t)
    edge = max(1, tile // 8)
    ring = np.zeros((tile, tile), dtype=bool)
    ring[edge : tile - edge, edge : tile - edge] = True
    ring[2 * edge : tile - 2 * edge, 2 * edge : tile - 2 * edge] = False
    inner = np.zeros((tile, tile), dtype=bool)
    inner[edge : tile - edge, edge : tile - edge] = True
    for r in range(room.height):
        for c in range(room.width):
            cell = img[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
            pos = (r, c)
            if pos not in room.floor:
                cell[:] = COLORS["wall"]
                continue
            cell[:] = COLORS["floor"]
            on_target = pos in room.targets
            if on_target:
                cell[ring] = COLORS["target"]
            if pos in room.boxes:
                cell[inner] = COLORS["box_on_target" if on_target else "box"]
            elif pos == room.player:
                cell[disc] = COLORS["player"]
    return img
