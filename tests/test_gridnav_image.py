"""Gridnav drawn as an image (``observation=image|both``, CPU only, milliseconds): the drawing shows the state the
text then hides, pixel keys group steps as state keys do, and bad settings fail by name."""

from __future__ import annotations

import numpy as np
import pytest

from environments import make_env
from environments.gridnav.render import COLORS, IMAGE_ONLY_TEXT
from environments.images import IMAGE_INFO_KEY, anchor_groups


def test_the_image_shows_the_state_and_the_text_hides_it():
    env = make_env("gridnav", observation="image", tile_size=16, size=3, walls=0, min_path=1)
    obs, info = env.reset(seed=4)
    assert obs == IMAGE_ONLY_TEXT and IMAGE_INFO_KEY in info
    image = np.asarray(info[IMAGE_INFO_KEY][0])
    assert image.shape == (48, 48, 3)
    r, c = env.agent
    assert tuple(image[r * 16 + 8, c * 16 + 8]) == COLORS["agent"]  # the agent's disc at its cell's centre
    gr, gc = env.task.goal
    assert tuple(image[gr * 16 + 8, gc * 16 + 8]) == COLORS["goal"]
    both, info_both = make_env("gridnav", observation="both", size=3, walls=0, min_path=1).reset(seed=4)
    assert "goal:" in both and np.array_equal(np.asarray(info_both[IMAGE_INFO_KEY][0]), image)


def test_pixel_keys_give_the_same_groups_as_state_keys():
    env = make_env("gridnav", observation="image", tile_size=4, size=4, walls=2, max_steps=8)
    moves = ["up", "down", "left", "right"]
    by_state, by_pixels = anchor_groups(env, (0, 1, 2), 6, moves, np.random.default_rng(0))
    assert by_state == by_pixels
    assert any(len(g) > 1 for g in by_state) and len(by_state) > 10  # real grouping, not all-one or singletons


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"observation": "picture"}, "observation must be"),
        ({"observation": "image", "key_mode": "observation"}, "key_mode='observation'"),
        ({"observation": "image", "tile_size": 2}, "tile_size"),
    ],
)
def test_bad_image_settings_fail_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_env("gridnav", **kwargs)
