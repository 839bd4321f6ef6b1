"""Vision-language models on both engines: loading one, and the inputs its forward pass takes with images.

    model, processor = load_pretrained(path, trust_remote_code=True)     # processor None for a text model
    vision = image_inputs(processor.image_processor, images)              # pixel_values, image_grid_thw
    positions = rope_positions(model, ids, attention, vision["image_grid_thw"])   # (4, 1, L)

Shared by the ``hf`` CPU rollout backend (:mod:`verl_gigpo.verl_glue.cpu.hf_rollout`), the local engine's
generation server (:mod:`verl_gigpo.local.server`) and its update (:mod:`verl_gigpo.local.update`), so the rollout
and the actor score a step with images the same way. Rationale: docs/vision.md.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from environments.images import pixel_key

__all__ = [
    "aside",
    "image_inputs",
    "is_vision_config",
    "load_model_only",
    "load_pretrained",
    "load_processor",
    "IMAGE_DIR",
    "rope_positions",
    "save_images",
    "vision_token_ids",
]

#: the folder, beside the records that name them, that holds the PNGs of transcripts and credit records
IMAGE_DIR = "images"

#: config attributes of Qwen-VL's vision placeholder ids (image/video pad, vision start/end)
_VISION_ID_NAMES = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def is_vision_config(config: Any) -> bool:
    """True when a model config has a vision tower (``vision_config``): load it with
    ``AutoModelForImageTextToText`` (``AutoModelForCausalLM`` has no Qwen-VL mapping)."""
    return getattr(config, "vision_config", None) is not None


def load_pretrained(path: str, *, trust_remote_code: bool = False, dtype: Any = torch.float32) -> tuple[Any, Any]:
    """``(model, processor)`` of the Hugging Face folder ``path``: a vision-language model (a ``vision_config``)
    through ``AutoModelForImageTextToText`` with its ``AutoProcessor``, else a causal LM and ``None``."""
    model = load_model_only(path, trust_remote_code=trust_remote_code, dtype=dtype)
    if is_vision_config(model.config):
        return model, load_processor(path, trust_remote_code=trust_remote_code)
    return model, None


def load_model_only(path: str, *, trust_remote_code: bool = False, dtype: Any = torch.float32) -> Any:
    """The model of :func:`load_pretrained`, without its processor."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    vision = is_vision_config(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    return auto.from_pretrained(path, trust_remote_code=trust_remote_code, dtype=dtype)


def load_processor(path: str, *, trust_remote_code: bool = False) -> Any:
    """The ``AutoProcessor`` of the model folder ``path``; ValueError naming the key when it needs
    ``trust_remote_code``."""
    from transformers import AutoProcessor

    if trust_remote_code:
        return AutoProcessor.from_pretrained(path, trust_remote_code=True)
    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as exc:  # e.g. the tiny model's processor class is code in its folder
        raise ValueError(
            f"the processor of {path} did not load without remote code ({type(exc).__name__}: {str(exc)[:160]}); "
            "set actor_rollout_ref.model.trust_remote_code=true if you trust the code in that folder"
        ) from exc


def vision_token_ids(config: Any) -> set[int]:
    """The vision placeholder ids of a model config, never drawn in a reply (verl's rope index would read one as an
    image without pixels; a random model draws them); empty for a text model."""
    return {int(i) for i in (getattr(config, name, None) for name in _VISION_ID_NAMES) if i is not None}


def image_inputs(image_processor: Any, images: Sequence[Any]) -> dict[str, torch.Tensor]:
    """``pixel_values`` (patches, C) and ``image_grid_thw`` (n_images, 3) of one prompt's images, as verl's agent
    loop computes its ``multi_modal_inputs``."""
    out = image_processor(images=list(images), return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def rope_positions(model: Any, ids: torch.Tensor, attention: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """(4, B, L) positions of ``ids`` (B, L) as verl's agent loop gives them to the actor: the text positions
    (``cumsum(attention) - 1``), then the model's 3 rope axes (``get_rope_index``). The text row changes how
    transformers' Qwen-VL builds its attention mask, so the rollout must pass it too."""
    image_id = int(model.config.image_token_id)
    token_types = (ids == image_id).to(torch.int)  # (B, L): 1 = image token
    rope, _ = model.model.get_rope_index(
        ids, mm_token_type_ids=token_types, image_grid_thw=grid_thw, attention_mask=attention
    )  # (3, B, L)
    text = (attention.cumsum(-1) - 1).clamp(min=0).to(rope.dtype)[None]  # (1, B, L)
    return torch.cat([text, rope], dim=0)


def aside(path: Path) -> Path:
    """Where ``path`` is written before its rename: a name of this process and thread, so that writers of the same
    drawing (group members in one state, the agent loop's threads, other processes) never share a file."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def save_images(images: Sequence[Any], folder: str | Path) -> list[str]:
    """Store ``images`` as PNG files ``<folder>/images/<sha1 of the pixels>.png`` and return their paths relative to
    ``folder`` (``images/<sha1>.png``), the reference a record keeps. A drawing seen before is written once (the
    name is its :func:`~environments.images.pixel_key`); each file appears whole (written aside, then renamed), so
    several processes may share the folder."""
    from environments.images import to_pil

    out = Path(folder) / IMAGE_DIR
    refs = []
    for image in images:
        pil = to_pil(image)
        name = f"{pixel_key(pil)}.png"
        path = out / name
        if not path.exists():
            out.mkdir(parents=True, exist_ok=True)
            tmp = aside(path)
            pil.save(tmp, format="PNG")
            os.replace(tmp, path)
        refs.append(f"{IMAGE_DIR}/{name}")
    return refs
