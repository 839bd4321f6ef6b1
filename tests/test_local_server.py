"""LocalGenerationServer on a tiny real Qwen2 model (CPU-only): batching, equivalence with one-at-a-time
generation, log-probs against a direct forward pass, stop conditions, seeded sampling, parameter validation; and
the left-padding helper both the server and the local actor update batch with."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_gigpo.local.server import LocalGenerationServer
from verl_gigpo.local.tensors import left_pad
from verl_gigpo.rollout import GenerationOutput

ACTIONS = ("up", "down", "left", "right")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def server(model_and_tokenizer):
    model, tok = model_and_tokenizer
    srv = LocalGenerationServer(model, tok, max_batch_size=16)
    yield srv
    srv.close()


def _prompts(tok, n):
    texts = [f"Now: goal: down {i % 4 + 1}, left {i % 3 + 1}. blocked: up." * (1 + i % 3) for i in range(n)]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def _no_eos(tok, srv):
    """All token ids except the stop ids: forces generation to run to max_tokens."""
    stops = set(srv.eos_token_ids) | {srv.pad_token_id}
    return [i for i in range(len(tok)) if i not in stops]


async def test_concurrent_greedy_equals_one_at_a_time(server, model_and_tokenizer):
    _, tok = model_and_tokenizer
    prompts = _prompts(tok, 6)  # three different lengths -> left padding in the batch
    params = {"temperature": 0, "max_tokens": 5, "allowed_token_ids": _no_eos(tok, server)}
    single = [await server.generate(f"s{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts)]
    assert server.stats["batches"] == 6 and server.stats["max_batch"] == 1
    together = await asyncio.gather(
        *[server.generate(f"c{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts)]
    )
    assert server.stats["batches"] == 7 and server.stats["max_batch"] == 6  # one batched generation for all six
    for a, b in zip(single, together, strict=True):
        assert isinstance(b, GenerationOutput)
        assert a.token_ids == b.token_ids and len(a.token_ids) == 5
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-4)


async def test_identical_prompts_are_prefilled_once(server, model_and_tokenizer):
    _, tok = model_and_tokenizer
    prompts = _prompts(tok, 2)
    requests = [prompts[i % 2] for i in range(8)]  # 2 distinct prompts, 4 requests each
    params = [{"max_tokens": 1 + i % 3, "seed": i, "allowed_token_ids": _no_eos(tok, server)} for i in range(8)]
    alone = [
        await server.generate(str(i), prompt_ids=p, sampling_params=q)
        for i, (p, q) in enumerate(zip(requests, params, strict=True))
    ]
    before = server.stats["prefill_rows"]
    together = await asyncio.gather(
        *[
            server.generate(str(i), prompt_ids=p, sampling_params=q)
            for i, (p, q) in enumerate(zip(requests, params, strict=True))
        ]
    )
    assert server.stats["prefill_rows"] - before == 2
    for a, b, q in zip(alone, together, params, strict=True):
        assert a.token_ids == b.token_ids and len(b.token_ids) == q["max_tokens"]
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-4)


async def test_batches_are_capped_by_max_batch_size(server, model_and_tokenizer):
    _, tok = model_and_tokenizer
    outs = await asyncio.gather(
        *[
            server.generate(str(i), prompt_ids=p, sampling_params={"max_tokens": 2})
            for i, p in enumerate(_prompts(tok, 40))
        ]
    )
    assert len(outs) == 40
    assert server.stats["requests"] == 40 and server.stats["max_batch"] == 16
    assert server.stats["batches"] == 3  # 16 + 16 + 8
    assert server.stats["forward_passes"] <= 3 * 2


@pytest.mark.parametrize("params", [{"temperature": 0.7}, {"temperature": 1.3, "top_k": 5, "top_p": 0.8}])
async def test_logprobs_match_a_direct_forward_pass(server, model_and_tokenizer, params):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok, 5)
    full = {**params, "max_tokens": 6, "allowed_token_ids": _no_eos(tok, server), "seed": 3}
    outs = await asyncio.gather(
        *[server.generate(str(i), prompt_ids=p, sampling_params=full) for i, p in enumerate(prompts)]
    )
    allowed = torch.zeros(len(tok), dtype=torch.bool)
    allowed[full["allowed_token_ids"]] = True
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (R, V)
        logits = logits.masked_fill(~allowed, float("-inf")) / params["temperature"]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        assert out.log_probs == pytest.approx(expected.tolist(), abs=1e-4)
        if "top_k" in params:  # sampled tokens lie inside the top-k set of their step
            ranks = (logits > logits.gather(-1, torch.tensor(out.token_ids)[:, None])).sum(-1)
            assert bool((ranks < params["top_k"]).all())


async def test_max_tokens_eos_and_stop_ids(server, model_and_tokenizer):
    _, tok = model_and_tokenizer
    prompt = _prompts(tok, 1)[0]
    no_eos = _no_eos(tok, server)
    out = await server.generate("a", prompt_ids=prompt, sampling_params={"max_tokens": 7, "allowed_token_ids": no_eos})
    assert len(out.token_ids) == 7 and out.stop_reason == "length"
    out = await server.generate(
        "b", prompt_ids=prompt, sampling_params={"max_new_tokens": 3, "allowed_token_ids": no_eos}
    )
    assert len(out.token_ids) == 3 and out.stop_reason == "length"
    # only EOS allowed: generation stops at once, EOS included, log-prob 0 (probability 1)
    eos = tok.eos_token_id
    out = await server.generate("c", prompt_ids=prompt, sampling_params={"max_tokens": 9, "allowed_token_ids": [eos]})
    assert out.token_ids == [eos] and out.stop_reason == "completed" and out.log_probs == pytest.approx([0.0])
    # a request-level stop id ends generation too; rows of one batch stop independently
    up = tok.convert_tokens_to_ids("up")
    down = tok.convert_tokens_to_ids("down")
    a, b = await asyncio.gather(
        server.generate(
            "d", prompt_ids=prompt, sampling_params={"max_tokens": 9, "allowed_token_ids": [up], "stop_token_ids": [up]}
        ),
        server.generate("e", prompt_ids=prompt, sampling_params={"max_tokens": 4, "allowed_token_ids": [down]}),
    )
    assert (a.token_ids, a.stop_reason) == ([up], "completed")
    assert (b.token_ids, b.stop_reason) == ([down] * 4, "length")


async def test_seeded_sampling_is_reproducible_and_batch_independent(server, model_and_tokenizer):
    _, tok = model_and_tokenizer
    prompts = _prompts(tok, 8)
    params = {"temperature": 1.0, "max_tokens": 6, "seed": 11}
    alone = await server.generate("x", prompt_ids=prompts[0], sampling_params=params)
    again = await server.generate("x", prompt_ids=prompts[0], sampling_params=params)
    crowd = await asyncio.gather(
        *[
            server.generate(str(i), prompt_ids=p, sampling_params={**params, "seed": 100 + i})
            for i, p in enumerate(prompts[1:])
        ],
        server.generate("x", prompt_ids=prompts[0], sampling_params=params),
    )
    assert alone.token_ids == again.token_ids == crowd[-1].token_ids

    # a caller-owned generator advances across calls (episodes) and replays from the same seed
    def run(gen):
        return [
            server.generate("g", prompt_ids=prompts[1], sampling_params={"max_tokens": 6, "generator": gen})
            for _ in range(3)
        ]

    first = [(await c).token_ids for c in run(torch.Generator().manual_seed(5))]
    second = [(await c).token_ids for c in run(torch.Generator().manual_seed(5))]
    assert first == second and first[0] != first[1]


async def test_sampling_follows_the_model_distribution(server, model_and_tokenizer):
    _, tok = model_and_tokenizer
    prompt = _prompts(tok, 1)[0]
    ids = [tok.convert_tokens_to_ids(a) for a in ACTIONS]
    params = {"max_tokens": 1, "allowed_token_ids": ids, "temperature": 0.3}
    outs = await asyncio.gather(
        *[server.generate(str(i), prompt_ids=prompt, sampling_params={**params, "seed": i}) for i in range(240)]
    )
    probs = {}
    for o in outs:
        probs[o.token_ids[0]] = float(torch.tensor(o.log_probs[0]).exp())
    assert abs(sum(probs.values()) - 1) < 1e-4 or len(probs) < 4  # every allowed id seen -> a full distribution
    for token, p in probs.items():
        freq = sum(o.token_ids[0] == token for o in outs) / len(outs)
        assert abs(freq - p) < 4 * (p * (1 - p) / len(outs)) ** 0.5 + 0.01, (token, freq, p)
    greedy = await server.generate("g", prompt_ids=prompt, sampling_params={**params, "temperature": 0})
    top1 = await server.generate("k", prompt_ids=prompt, sampling_params={**params, "top_k": 1, "seed": 9})
    assert greedy.token_ids == top1.token_ids == [max(probs, key=probs.get)]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2, "max_new_tokens": 3}, "either"),
        ({"beam_width": 4}, "unknown sampling parameter"),
        ({"allowed_token_ids": []}, "empty"),
        ({"allowed_token_ids": [10**7]}, "outside"),
        ({"n": 2}, "n must be 1"),
        ({"seed": 1, "generator": torch.Generator()}, "either seed"),
        ({"generator": 3}, "torch.Generator"),
    ],
)
async def test_bad_params_raise_value_error(server, model_and_tokenizer, params, message):
    _, tok = model_and_tokenizer
    with pytest.raises(ValueError, match=message):
        await server.generate("bad", prompt_ids=_prompts(tok, 1)[0], sampling_params=params)


async def test_bad_prompts_and_closed_server(model_and_tokenizer):
    model, tok = model_and_tokenizer
    srv = LocalGenerationServer(model, tok)
    with pytest.raises(ValueError, match="non-empty"):
        await srv.generate("p", prompt_ids=[], sampling_params={})
    with pytest.raises(ValueError, match="vocab"):
        await srv.generate("p", prompt_ids=[len(tok) + 5], sampling_params={})
    with pytest.raises(ValueError, match="max_batch_size"):
        LocalGenerationServer(model, tok, max_batch_size=0)
    await srv.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await srv.generate("p", prompt_ids=[1, 2], sampling_params={})


# ------------------------------------------------------------------------------------------------ left padding
def test_left_pad_by_hand():
    ids, attention, positions = left_pad([[5, 6, 7], [8], (9, 4)], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 4]]
    assert attention.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    assert ids.dtype == attention.dtype == positions.dtype == torch.long
    with pytest.raises(ValueError, match="at least one sequence"):
        left_pad([], pad_id=0)


def test_left_padded_rows_score_like_single_rows(model_and_tokenizer):
    """The property both callers rely on: a row's last logits do not depend on the padding left of it."""
    model, tok = model_and_tokenizer
    prompts = _prompts(tok, 3)  # three lengths
    ids, attention, positions = left_pad(prompts, pad_id=tok.pad_token_id)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, -1]  # (B, V)
        for row, prompt in enumerate(prompts):
            alone = model(input_ids=torch.tensor([prompt])).logits[0, -1]  # (V,)
            assert torch.allclose(batched[row], alone, atol=1e-4)
