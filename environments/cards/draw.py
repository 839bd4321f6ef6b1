"""Playing cards and tables drawn with Pillow by this project's own code (no card images, no font files).

A card is a white rounded rectangle with its rank in the corner and a suit shape (drawn from polygons and ellipses)
in the middle; hearts and diamonds are red, clubs and spades black. The text uses Pillow's built-in font
(``ImageFont.load_default``). Every drawing is a pure function of its arguments: the same state gives the same
pixels (tests/test_cards.py).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["FELT", "SUITS", "check_image_size", "draw_card", "draw_card_back", "font", "new_canvas"]

#: suit letter -> name; the letters are the ones the task ids and state keys use
SUITS = {"H": "hearts", "D": "diamonds", "C": "clubs", "S": "spades"}
#: the table's green
FELT = (30, 100, 70)
_RED, _BLACK = (200, 30, 30), (20, 20, 20)


def check_image_size(size: object, name: str) -> int:
    """``size`` when it is an int in [96, 512] (pixels per side), else a ValueError naming ``image_size``."""
    if isinstance(size, bool) or not isinstance(size, int) or not 96 <= size <= 512:
        raise ValueError(f"{name}: image_size must be an int in [96, 512] (pixels per side), got {size!r}")
    return size


@lru_cache(maxsize=32)
def font(size: int) -> Any:
    """Pillow's built-in font at ``size`` pixels."""
    from PIL import ImageFont

    return ImageFont.load_default(size=max(8, int(size)))


def new_canvas(size: int, color: tuple[int, int, int] = FELT) -> tuple[Any, Any]:
    """A ``size`` x ``size`` RGB image of ``color`` and its ``ImageDraw``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), color)
    return image, ImageDraw.Draw(image)


def _suit_shape(draw: Any, suit: str, cx: float, cy: float, r: float) -> None:
    """The suit's shape centred at (cx, cy), about 2r wide."""
    color = _RED if suit in "HD" else _BLACK
    if suit == "D":
        draw.polygon([(cx, cy - r), (cx + 0.75 * r, cy), (cx, cy + r), (cx - 0.75 * r, cy)], fill=color)
        return
    lobe = 0.5 * r
    if suit == "H":
        for dx in (-lobe, lobe):
            draw.ellipse([cx + dx - lobe, cy - r, cx + dx + lobe, cy - r + 2 * lobe], fill=color)
        draw.polygon([(cx - 2 * lobe, cy - r + lobe), (cx + 2 * lobe, cy - r + lobe), (cx, cy + r)], fill=color)
    elif suit == "S":
        for dx in (-lobe, lobe):
            draw.ellipse([cx + dx - lobe, cy - 0.1 * r, cx + dx + lobe, cy - 0.1 * r + 2 * lobe], fill=color)
        draw.polygon([(cx - 2 * lobe, cy + 0.4 * r), (cx + 2 * lobe, cy + 0.4 * r), (cx, cy - r)], fill=color)
        draw.polygon([(cx, cy + 0.4 * r), (cx - 0.4 * r, cy + r), (cx + 0.4 * r, cy + r)], fill=color)
    else:  # clubs
        for dx, dy in ((0, -0.5 * r), (-0.5 * r, 0.15 * r), (0.5 * r, 0.15 * r)):
            draw.ellipse([cx + dx - lobe, cy + dy - lobe, cx + dx + lobe, cy + dy + lobe], fill=color)
        draw.polygon([(cx, cy), (cx - 0.4 * r, cy + r), (cx + 0.4 * r, cy + r)], fill=color)


def draw_card(draw: Any, box: tuple[int, int, int, int], rank: str, suit: str) -> None:
    """A face-up card of ``rank`` ("A", "2".."10", "J", "Q", "K") and ``suit`` (a key of :data:`SUITS`) in
    ``box`` = (left, top, right, bottom)."""
    left, top, right, bottom = box
    width, height = right - left, bottom - top
    draw.rounded_rectangle(box, radius=max(2, width // 10), fill=(250, 250, 245), outline=(90, 90, 90), width=1)
    color = _RED if suit in "HD" else _BLACK
    size = max(8, int(height * 0.24))
    draw.text((left + width * 0.08, top + height * 0.04), rank, fill=color, font=font(size))
    _suit_shape(draw, suit, left + width / 2, top + height * 0.62, min(width, height) * 0.26)


def draw_card_back(draw: Any, box: tuple[int, int, int, int]) -> None:
    """A face-down card in ``box``: blue with a lattice."""
    left, top, right, bottom = box
    draw.rounded_rectangle(box, radius=max(2, (right - left) // 10), fill=(40, 70, 160), outline=(230, 230, 230))
    step = max(4, (right - left) // 5)
    for x in range(left + step, right - 2, step):
        draw.line([(x, top + 3), (x, bottom - 3)], fill=(90, 120, 210), width=1)
    for y in range(top + step, bottom - 2, step):
        draw.line([(left + 3, y), (right - 3, y)], fill=(90, 120, 210), width=1)
