"""Sampling for the local generation server: the request parameters it accepts (vLLM names) and how it draws each
token. Log-probs are ``log softmax(logits / T)`` before top-k/top-p, as an actor recomputes them. The parameters and
their defaults: docs/local-engine.md ("The generation server").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_gigpo.config.rules import Range

__all__ = ["DecodeControls", "DecodeOutputs", "SamplingParams", "parse_sampling_params", "sample_tokens"]

_KNOWN_PARAMS = {
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_new_tokens",
    "stop_token_ids",
    "allowed_token_ids",
    "seed",
    "generator",
    "logprobs",
    "n",
    "repetition_penalty",
}


@dataclass
class SamplingParams:
    """Validated sampling parameters of one request."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    generator: torch.Generator | None = field(default=None, repr=False)


def parse_sampling_params(params: dict[str, Any] | None, *, vocab_size: int, default_max_tokens: int = 16):
    """Validate a sampling-parameter dict (vLLM names) into :class:`SamplingParams`; ValueError names the bad key."""
    params = dict(params or {})
    unknown = set(params) - _KNOWN_PARAMS
    if unknown:
        raise ValueError(f"unknown sampling parameter(s) {sorted(unknown)}; accepted: {sorted(_KNOWN_PARAMS)}")
    if "max_tokens" in params and "max_new_tokens" in params and params["max_tokens"] != params["max_new_tokens"]:
        raise ValueError("give either max_tokens or max_new_tokens (they are the same setting), not two values")
    out = SamplingParams(max_tokens=default_max_tokens)

    temperature = params.get("temperature", 1.0)
    Range("temperature", "float", "0 = greedy", low=0).check(temperature)
    out.temperature = float(temperature)
    top_p = params.get("top_p", 1.0)
    Range("top_p", "float", "nucleus sampling mass", low=0, high=1, low_open=True).check(top_p)
    out.top_p = float(top_p)
    top_k = params.get("top_k", 0)
    if top_k is None:
        top_k = 0
    Range("top_k", "int", "-1 or 0 = no top-k", low=-1).check(top_k)
    out.top_k = max(int(top_k), 0)
    max_tokens = params.get("max_tokens", params.get("max_new_tokens", default_max_tokens))
    Range("max_tokens", "int", "generated tokens, also called max_new_tokens", low=1).check(max_tokens)
    out.max_tokens = int(max_tokens)
    for name in ("stop_token_ids", "allowed_token_ids"):
        if params.get(name) is not None:
            setattr(out, name, _token_ids(name, params[name], vocab_size))
    seed = params.get("seed")
    Range("seed", "int", "seed of the sampling generator", nullable=True).check(seed)
    out.seed = seed
    generator = params.get("generator")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator is not None and seed is not None:
        raise ValueError("give either seed (a fresh generator per call) or generator (advancing), not both")
    out.generator = generator
    n = params.get("n", 1)
    if n != 1:
        raise ValueError(f"n must be 1 (one sample per request; issue several requests for more), got {n!r}")
    rep = params.get("repetition_penalty", 1.0)
    if rep != 1.0:
        raise ValueError(f"repetition_penalty is not supported by the local server (got {rep!r}); leave it at 1.0")
    return out


def _token_ids(name: str, ids: Any, vocab_size: int) -> tuple[int, ...]:
    """``ids`` checked as a list of token ids in ``[0, vocab_size)`` (``allowed_token_ids`` also non-empty)."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise ValueError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"{name} holds ids outside [0, {vocab_size}): {bad[:5]}")
    if name == "allowed_token_ids" and not ids:
        raise ValueError("allowed_token_ids is empty: nothing could be sampled; omit it to allow every token")
    return tuple(int(i) for i in ids)


@dataclass
class DecodeOutputs:
    """Per-request results of one batched generation (B requests), filled one token at a time."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    stop_reason: list[str]  # "length" until a stop id ends the request ("completed")
    done: list[bool]

    @classmethod
    def empty(cls, batch: int) -> DecodeOutputs:
        """B requests with nothing generated yet."""
        return cls([[] for _ in range(batch)], [[] for _ in range(batch)], ["length"] * batch, [False] * batch)

    def add(self, tokens: list[int], logprobs: list[float], active: list[int], t: int, ctl: DecodeControls) -> None:
        """Append the ``t``-th token (``tokens``, ``logprobs``: (B,)) of each ``active`` request;
        a stop id or ``max_tokens`` ends it."""
        for i in active:
            self.tokens[i].append(tokens[i])
            self.logprobs[i].append(logprobs[i])
            if tokens[i] in ctl.stops[i]:
                self.stop_reason[i] = "completed"
                self.done[i] = True
            elif t + 1 >= ctl.max_tokens[i]:
                self.done[i] = True


@dataclass
class DecodeControls:
    """What decoding needs of B requests' sampling parameters."""

    temperature: torch.Tensor  # (B,) float32
    greedy: torch.Tensor  # (B,) bool, temperature == 0
    max_tokens: list[int]  # (B,)
    allowed: torch.Tensor | None  # (B, V) bool, True = may be sampled; None = every token for every request
    stops: list[set[int]]  # (B,) ids that end each request (EOS, pad, its stop_token_ids)
    generators: list[torch.Generator]  # (B,) where each request's uniforms come from


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    active: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row: ``(tokens (B,), log_probs (B,))`` from ``logits`` (B, V).

    ``log_probs`` = log softmax(logits / T) at the drawn token, before top-k then top-p; inverse-CDF with one uniform
    from each ``active`` row's generator.
    """
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]  # (B, 1)
    scaled = logits / temp  # (B, V)
    logp = torch.log_softmax(scaled, dim=-1)  # (B, V)
    tokens = torch.argmax(logits, dim=-1)  # (B,)
    sample_rows = [i for i in active if not bool(greedy[i])]
    if sample_rows:
        rows = torch.tensor(sample_rows, device=logits.device)
        sub = scaled[rows].clone()  # (S, V)
        for j, i in enumerate(sample_rows):
            k = params[i].top_k
            if 0 < k < sub.shape[-1]:
                kth = torch.topk(sub[j], k).values[-1]
                sub[j] = sub[j].masked_fill(sub[j] < kth, float("-inf"))
        probs = torch.softmax(sub, dim=-1)  # (S, V)
        top_ps = torch.tensor([params[i].top_p for i in sample_rows], device=logits.device)  # (S,)
        if bool((top_ps < 1).any()):
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)  # (S, V)
            mass_before = sorted_p.cumsum(-1) - sorted_p  # (S, V) mass of strictly more likely tokens
            keep_sorted = mass_before < top_ps[:, None]
            keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
            probs = torch.where(keep, probs, torch.zeros_like(probs))
        cdf = probs.double().cumsum(-1)  # (S, V)
        u = torch.stack([torch.rand((), generator=generators[i], dtype=torch.float64) for i in sample_rows])
        u = u.to(logits.device) * cdf[:, -1]  # (S,)
        drawn = torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1)  # (S,)
        # the boundary case u == total mass and zero-probability tail tokens: clamp to the last kept token
        last_kept = (probs > 0).long().cumsum(-1).argmax(-1)  # (S,)
        drawn = torch.minimum(drawn, last_kept)
        tokens = tokens.clone()
        tokens[rows] = drawn
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
