"""The tiny vision-language model builder: it loads offline as verl loads it, and one forward pass and a short
greedy generation run on a 56x56 image (CPU only, a few seconds)."""

from __future__ import annotations

import json

import numpy as np
import pytest
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


#: 3x3 gridnav drawn with one 28-pixel cell per merged image token (vision_learning.py's aligned drawing)
DRAWN_GRIDNAV = {"observation": "image", "tile_size": 28, "size": 3, "walls": 0, "min_path": 1}


def test_imitation_of_the_expert_from_images(tiny_vl_model_dir, tmp_path):
    """The imitation fine-tuning on a drawn environment: each example holds the state's drawing (its ids the
    expanded placeholders), the labels at p = 1 are the expert's, and the fine-tuned model puts more weight on the
    expert's action than the random one did."""
    import shutil

    from transformers import AutoProcessor

    from verl_gigpo.dev.imitation import expert_examples, imitate_expert
    from verl_gigpo.rollout.vision import image_inputs, rope_positions

    out = tmp_path / "vl"
    shutil.copytree(tiny_vl_model_dir, out)
    processor = AutoProcessor.from_pretrained(out, trust_remote_code=True)
    tok = processor.tokenizer
    examples = expert_examples(
        "gridnav", tok, np.random.default_rng(0), env_kwargs=DRAWN_GRIDNAV, p_expert=1.0, tasks=8, processor=processor
    )
    assert examples and all(flag and len(images) == 1 for _, _, flag, images in examples)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert all(prompt.count(pad) == 9 for prompt, *_ in examples)  # 84x84: 3x3 merged tokens, one a cell
    assert np.asarray(examples[0][3][0]).shape == (84, 84, 3)
    with pytest.raises(ValueError, match="processor"):  # a drawn observation and a text model
        expert_examples("gridnav", tok, np.random.default_rng(0), env_kwargs=DRAWN_GRIDNAV, tasks=1)

    def expert_prob(model):
        """Mean probability of the expert's first token over the examples, forwarded as the engines forward them."""
        total = 0.0
        for prompt, target, _, images in examples:
            ids = torch.tensor([prompt])  # (1, P)
            vision = image_inputs(processor.image_processor, images)
            positions = rope_positions(model, ids, torch.ones_like(ids), vision["image_grid_thw"])  # (4, 1, P)
            with torch.no_grad():
                probs = model(input_ids=ids, position_ids=positions, **vision).logits[0, -1].softmax(-1)  # (V,)
            total += float(probs[target[0]])
        return total / len(examples)

    before = expert_prob(AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32))
    imitate_expert(out, env_kwargs=DRAWN_GRIDNAV, p_expert=1.0, steps=40, tasks=40, max_steps=4, seed=0)
    after = expert_prob(AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32))
    assert after > before + 0.2, (before, after)
    info = json.loads((out / "tiny_model_info.json").read_text())
    assert info["imitate"]["env_kwargs"] == DRAWN_GRIDNAV and info["family"] == "qwen2_5_vl"
    assert type(AutoProcessor.from_pretrained(out, trust_remote_code=True)).__name__ == "Qwen2_5_VLProcessor"
