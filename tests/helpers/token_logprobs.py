"""One fixed gridnav prompt with a reply, and a model's log-probabilities of its tokens (export and LoRA tests)."""

from __future__ import annotations

import torch

from environments import make_env
from verl_gigpo.rollout import ChatPromptEncoder


def gridnav_prompt_with_reply(tokenizer, reply: str = "up") -> torch.Tensor:
    """The prompt of gridnav task 0's first step as the agent loop encodes it (chat template, state key), then
    ``reply`` and EOS: ids ``(1, L)``."""
    env = make_env("gridnav", max_steps=6, key_mode="state")
    obs, info = env.reset(seed=0)
    prompt = ChatPromptEncoder(tokenizer)(env.render_prompt(obs, info, []))
    return torch.tensor([prompt + tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]])


@torch.no_grad()
def token_log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """``log p(ids[t] | ids[:t])`` under ``model`` for t = 1 .. L-1, in float32: ``(L - 1,)``."""
    logits = model(ids).logits.float()[0, :-1]  # (L - 1, vocab)
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
