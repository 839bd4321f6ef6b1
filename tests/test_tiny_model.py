"""The tiny-model builder: files load offline, the chat template renders, action words are single tokens,
generation runs, and the build is deterministic (CPU-only)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_gigpo.dev.tiny_model import EOS_TOKEN, build_tiny_model, main


def test_tiny_model_loads_renders_and_generates(tiny_model_dir):
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


def test_tiny_model_build_is_deterministic_and_seeded(tmp_path, tiny_model_dir):
    sizes = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, envs=("gridnav",))
    again = build_tiny_model(tmp_path / "again", seed=0, **sizes)
    other = build_tiny_model(tmp_path / "other", seed=1, **sizes)
    assert (again / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    c = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_tiny_model_cli_sizes_and_bad_sizes(tmp_path, capsys):
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


# ------------------------------------------------------------------ --imitate: a start model that reads its input
KEY_TASK = {"key": True, "observe": "target", "size": 5, "walls": [2, 4], "min_path": 5}


def _replay_expert(seeds, *, max_steps=15):
    """The shortest-path expert's action at every state of its own walk through each training task."""
    from environments import make_env

    env = make_env("gridnav", max_steps=max_steps, **KEY_TASK)
    actions = []
    for seed in seeds:
        env.reset(seed=seed, options={"split": "train"})
        done = False
        while not done:
            action = env.oracle_action()
            actions.append(action)
            *_, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return actions


def test_imitation_labels_are_the_experts_at_p1(tiny_model_dir):
    """p_expert = 1 and follow = 1: the walk is the expert's own, every label is its action, every walk wins."""
    import numpy as np

    from verl_gigpo.dev.tiny_model import expert_examples

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = expert_examples(
        "gridnav", tok, np.random.default_rng(0), env_kwargs=KEY_TASK, p_expert=1.0, follow=1.0, tasks=12
    )
    labels = [tok.decode(target[:-1]) for _, target, _ in examples]
    assert labels == _replay_expert(range(12))
    assert all(flag for *_, flag in examples)
    assert all(target[-1] == tok.eos_token_id for _, target, _ in examples)
    # the prompt is what the engines send: the chat-templated observation (history_length 0)
    first = tok.decode(examples[0][0])
    assert first.startswith("<|im_start|>user\nwalls: ") and first.endswith("<|im_start|>assistant\n")


def test_imitation_respects_p_within_tolerance(tiny_model_dir):
    """The share of expert labels is P (binomial: 3 standard deviations over ~2,000 labels); the others are drawn
    uniformly from the four actions."""
    import numpy as np

    from verl_gigpo.dev.tiny_model import expert_examples

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for p in (0.3, 0.7):
        examples = expert_examples("gridnav", tok, np.random.default_rng(1), env_kwargs=KEY_TASK, p_expert=p, tasks=200)
        n = len(examples)
        share = np.mean([flag for *_, flag in examples])
        assert n > 1500 and abs(share - p) < 3 * np.sqrt(p * (1 - p) / n), (p, n, share)
        random_labels = [tok.decode(target[:-1]) for _, target, flag in examples if not flag]
        counts = np.array([random_labels.count(a) for a in ("up", "down", "left", "right")])
        assert counts.sum() == len(random_labels) and counts.min() > 0.2 * len(random_labels)


def test_imitation_build_is_deterministic_and_conditions_on_the_observation(tmp_path, tiny_model_dir):
    """Two builds with the same options give byte-identical weights; the fine-tuned model's action distribution
    differs between observations."""
    import shutil

    from verl_gigpo.dev.tiny_model import action_probabilities, imitate_expert

    built = []
    for name in ("a", "b"):
        out = tmp_path / name
        shutil.copytree(tiny_model_dir, out)
        imitate_expert(out, env_kwargs=KEY_TASK, p_expert=1.0, steps=60, tasks=60, seed=0)
        built.append(out)
    assert (built[0] / "model.safetensors").read_bytes() == (built[1] / "model.safetensors").read_bytes()
    info = json.loads((built[0] / "tiny_model_info.json").read_text())
    assert info["imitate"]["p_expert"] == 1.0 and info["imitate"]["env_kwargs"] == KEY_TASK

    rows = action_probabilities(built[0], env_kwargs=KEY_TASK, seeds=range(8))
    assert all(abs(sum(r["probs"].values()) + r["other"] - 1.0) < 1e-4 for r in rows)
    # the distribution moves with the observation: its most likely action is not the same everywhere
    assert len({max(r["probs"], key=r["probs"].get) for r in rows}) >= 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--imitate", "gridnav:1.5"], "in \\[0, 1\\]"),
        (["--imitate", "gridnav:abc"], "must be a number"),
        (["--imitate", ":0.5"], "ENV\\[:P\\]"),
        (["--imitate", "gridnav", "--imitate-kwargs", "[1]"], "JSON object"),
        (["--imitate", "gridnav", "--imitate-steps", "0"], "--imitate-steps must be >= 1"),
    ],
)
def test_imitation_cli_refuses_bad_options(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "m"), *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "m").exists()  # refused before anything was built
