"""The tiny vision-language model builder: it loads offline as verl loads it, and one forward pass and a short
greedy generation run on a 56x56 image (CPU only, a few seconds)."""

from __future__ import annotations

import json

import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText


def test_tiny_vl_model_builds_and_runs_on_an_image(tiny_vl_model_dir):
    from verl.utils.tokenizer import hf_processor

    out = tiny_vl_model_dir
    info = json.loads((out / "tiny_model_info.json").read_text())
    assert info["family"] == "qwen2_5_vl" and 1e5 < info["parameters"] < 6e5
    processor = hf_processor(str(out), trust_remote_code=True)  # verl binds Qwen2.5-VL's 3-D rope index to it
    assert type(processor).__name__ == "Qwen2_5_VLProcessor" and hasattr(processor, "get_rope_index")
    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which way?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Which way?<|im_end|>")
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == pad).sum()) == 4  # 56x56 = 4x4 patches of 14, merged 2x2
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    with torch.no_grad():
        logits = model(**inputs).logits  # (1, P, V)
        other = model(**{**inputs, "pixel_values": inputs["pixel_values"] + 1.0}).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits).all()
    assert not torch.allclose(logits[0, -1], other[0, -1])  # the image reaches the text model's output
    generated = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 3
