"""Image observations (CPU only, seconds): the environment contract's image part and its checks, Sokoban drawn from
its state, and pixel keys grouping as state keys do on rendered episodes."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from environments import make_env
from environments.checker import check_env
from environments.images import IMAGE_INFO_KEY, anchor_groups, check_images, to_pil
from environments.sokoban.render import COLORS, render_room_image
from environments.sokoban.room import parse_room

CORRIDOR = "# # # # # # #\n# P _ X _ O #\n# # # # # # #"


@pytest.mark.parametrize("mode", ["image", "both"])
def test_sokoban_image_modes_pass_the_checker(mode):
    env = make_env("sokoban", observation=mode, tile_size=6)
    check_env(env, seeds=(0, 1), n_steps=6)  # raises EnvCheckError listing every failure
    obs, info = env.reset(seed=0)
    (image,) = info[IMAGE_INFO_KEY]
    assert image.mode == "RGB" and image.size == (6 * 6, 6 * 6)  # 6x6 room, 6 pixels per cell
    assert ("# # #" in obs) == (mode == "both")
    assert "blue disc" in info["task"] and ("# wall" in info["task"]) == (mode == "both")  # the legend of what it sees


def test_text_mode_has_no_images_and_keys_do_not_depend_on_the_mode():
    text, image = make_env("sokoban"), make_env("sokoban", observation="image")
    obs_t, info_t = text.reset(seed=5)
    _, info_i = image.reset(seed=5)
    assert IMAGE_INFO_KEY not in info_t and "# # #" in obs_t
    for action in ("up", "left", "down", "right", "right"):
        _, _, _, _, info_t = text.step(action)
        _, _, _, _, info_i = image.step(action)
        assert info_t["anchor_key"] == info_i["anchor_key"]


def test_drawing_shows_each_cell_kind():
    room = parse_room(CORRIDOR)
    img = render_room_image(room, tile=8)  # (3*8, 7*8, 3)
    assert img.shape == (24, 56, 3) and img.dtype == np.uint8
    assert tuple(img[0, 0]) == COLORS["wall"]
    assert tuple(img[8 + 4, 8 + 4]) == COLORS["player"]  # centre of the player's cell
    assert tuple(img[8 + 4, 3 * 8 + 4]) == COLORS["box"]
    assert tuple(img[8 + 1, 5 * 8 + 1]) == COLORS["target"]  # the target's outline
    assert tuple(img[8 + 4, 2 * 8 + 4]) == COLORS["floor"]
    assert render_room_image(room, tile=4).shape == (12, 28, 3)
    with pytest.raises(ValueError, match="tile_size"):
        render_room_image(room, tile=2)
    with pytest.raises(ValueError, match="tile_size"):
        make_env("sokoban", observation="image", tile_size=3)


def test_bad_settings_and_images_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match="observation must be one of"):
        make_env("sokoban", observation="pixels")
    with pytest.raises(ValueError, match="key_mode='state'"):
        make_env("sokoban", observation="image", key_mode="observation")
    rgb = np.zeros((8, 8, 3), dtype=np.uint8)
    assert check_images([rgb], count=1)[0].size == (8, 8)
    assert to_pil(Image.new("L", (4, 4))).mode == "RGB"
    with pytest.raises(ValueError, match="images_per_step=1"):
        check_images([rgb, rgb], count=1)
    with pytest.raises(ValueError, match="max_image_pixels"):
        check_images([np.zeros((100, 100, 3), dtype=np.uint8)], count=1, max_pixels=64 * 64)
    with pytest.raises(ValueError, match="uint8"):
        check_images([np.zeros((8, 8, 3), dtype=np.float32)], count=1)
    with pytest.raises(ValueError, match="PIL image or a numpy array"):
        check_images(["not an image"], count=1)


def test_pixel_keys_give_the_same_groups_as_state_keys():
    """Rendered episodes of one task group: grouping steps by the pixels' hash equals grouping by the state key."""
    env = make_env("sokoban", observation="image", tile_size=4, max_steps=10)
    moves = ["up", "down", "left", "right"]
    by_state, by_pixels = anchor_groups(env, (0, 1, 2), 6, moves, np.random.default_rng(0))
    assert by_state == by_pixels
    assert any(len(g) > 1 for g in by_state) and len(by_state) > 10  # real grouping, not all-one or singletons
