"""The tiny-model builder: files load offline, the chat template renders, action words are single tokens,
generation runs, and the build is deterministic (CPU-only)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_gigpo.local.tiny_model import EOS_TOKEN, build_tiny_model, main


def test_tiny_model_loads_renders_and_generates_cpu(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.tie_word_embeddings and model.config.hidden_size == 64
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert tok.eos_token == EOS_TOKEN and tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id

    text = tok.apply_chat_template(
        [{"role": "user", "content": "Now: goal: down 2, left 1. blocked: up."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == "<|im_start|>user\nNow: goal: down 2, left 1. blocked: up.<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # byte-level BPE is lossless
    # each gridnav action word is one token, at the start of a reply and after a space
    for word in ("up", "down", "left", "right"):
        assert len(tok.encode(word, add_special_tokens=False)) == 1
        assert len(tok.encode(" " + word, add_special_tokens=False)) == 1
    info = json.loads((tiny_model_dir / "tiny_model_info.json").read_text())
    assert info["single_token_actions"] == ["down", "left", "right", "up"]

    prompt = torch.tensor([ids])
    out = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 1 and 1 <= out.shape[1] - prompt.shape[1] <= 5


def test_tiny_model_build_is_deterministic_and_seeded_cpu(tmp_path, tiny_model_dir):
    sizes = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, envs=("gridnav",))
    again = build_tiny_model(tmp_path / "again", seed=0, **sizes)
    other = build_tiny_model(tmp_path / "other", seed=1, **sizes)
    assert (again / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    c = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_tiny_model_cli_sizes_and_bad_sizes_cpu(tmp_path, capsys):
    assert (
        main(
            [
                "--out",
                str(tmp_path / "m"),
                "--hidden-size",
                "32",
                "--layers",
                "1",
                "--heads",
                "2",
                "--intermediate-size",
                "64",
                "--envs",
                "gridnav",
            ]
        )
        == 0
    )
    assert "written to" in capsys.readouterr().out
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (32, 1, 2)
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "bad", hidden_size=30, num_heads=4, envs=("gridnav",))
