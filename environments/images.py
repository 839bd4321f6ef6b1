"""Image observations: the optional image part of an environment's observation, and its checks.

An environment that shows images declares how many it returns with each observation (``TextEnv.images_per_step``,
0 = text only) and draws them in the ``_observation_images`` hook. :meth:`TextEnv._info` then puts them, checked by
:func:`check_images`, under ``info["images"]`` after every reset and step. The anchor key stays the environment's
state: images never enter it. Rationale and the pipeline: docs/vision.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "IMAGE_INFO_KEY",
    "MAX_IMAGE_PIXELS",
    "anchor_groups",
    "check_images",
    "check_tile_size",
    "pixel_key",
    "to_pil",
]

#: ``info`` key of the observation's images (a list of RGB ``PIL.Image``).
IMAGE_INFO_KEY = "images"

#: Default cap on the pixels of one image (width x height): 512 x 512.
MAX_IMAGE_PIXELS = 512 * 512


def to_pil(image: Any, *, name: str = "env") -> Any:
    """An RGB ``PIL.Image`` of ``image``: a PIL image (any mode Pillow converts) or a uint8 array (H, W, 3) / (H, W).

    Raises:
        ValueError: another type, dtype or shape.
    """
    from PIL import Image

    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
            raise ValueError(
                f"{name}: an image array must be uint8 of shape (H, W, 3) or (H, W), got {image.dtype} {image.shape}"
            )
        return Image.fromarray(image).convert("RGB")
    raise ValueError(f"{name}: an observation image must be a PIL image or a numpy array, got {type(image).__name__}")


def check_images(
    images: Sequence[Any], *, count: int, max_pixels: int = MAX_IMAGE_PIXELS, name: str = "env"
) -> list[Any]:
    """The ``count`` images of one observation as RGB ``PIL.Image``s, each checked.

    Raises:
        ValueError: not exactly ``count`` images, an image with no pixels or more than ``max_pixels`` (W x H), or a
            type :func:`to_pil` refuses.
    """
    if isinstance(images, str | bytes) or not isinstance(images, Sequence):
        raise ValueError(f"{name}: _observation_images() must return a list of images, got {type(images).__name__}")
    if len(images) != count:
        raise ValueError(
            f"{name}: the observation has {len(images)} image(s), but the environment declares images_per_step={count}"
        )
    out = [to_pil(image, name=name) for image in images]
    for image in out:
        width, height = image.size
        if width * height == 0 or width * height > max_pixels:
            raise ValueError(
                f"{name}: an observation image of {width}x{height} = {width * height} pixels is outside "
                f"(0, {max_pixels}] (max_image_pixels); draw it smaller (e.g. a smaller tile size) or raise the cap"
            )
    return out


def pixel_key(image: Any) -> str:
    """The sha1 of an image's size and RGB pixels: the reference's way of keying image states (docs/vision.md)."""
    import hashlib

    pil = to_pil(image)
    return hashlib.sha1(f"{pil.size}".encode() + pil.tobytes()).hexdigest()


def check_tile_size(tile: object, env: str) -> int:
    """``tile`` when it is an int in [4, 64] (pixels per cell), else a ValueError naming ``env``'s ``tile_size``."""
    if isinstance(tile, bool) or not isinstance(tile, int) or not 4 <= tile <= 64:
        raise ValueError(f"{env}: tile_size must be an int in [4, 64] (pixels per cell), got {tile!r}")
    return tile


def anchor_groups(
    env: Any, seeds: Sequence[int], members: int, actions: Sequence[str], rng: np.random.Generator, max_steps: int = 50
) -> tuple[list[list[int]], list[list[int]]]:
    """Play ``members`` random episodes from each seed (one episode group per seed) and group their steps twice: by
    the state's anchor key and by the hash of the step's first image (:func:`pixel_key`), within each seed. Returns
    both groupings as sorted lists of step indices; equal when the drawing is one-to-one on the states."""
    by_state: dict[str, list[int]] = {}
    by_pixels: dict[str, list[int]] = {}
    row = 0
    for seed in seeds:
        for _ in range(members):
            _, info = env.reset(seed=seed)
            for _ in range(max_steps):
                by_state.setdefault(f"{seed}/{info['anchor_key']}", []).append(row)
                by_pixels.setdefault(f"{seed}/{pixel_key(info[IMAGE_INFO_KEY][0])}", []).append(row)
                row += 1
                _, _, terminated, truncated, info = env.step(str(rng.choice(list(actions))))
                if terminated or truncated:
                    break
    return sorted(by_state.values()), sorted(by_pixels.values())
