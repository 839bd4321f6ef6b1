"""The ``hf`` rollout backend's server (``verl_gigpo.verl_glue.cpu.hf_rollout.HFGenerationServer``), in this process.

It runs as a Ray actor in verl's pipeline (``tests/test_e2e_verl_cpu.py``); here its contract is checked directly on
the tiny model with verl's own ``RolloutConfig`` (composed from ``platform=cpu``): verl's ``max_tokens`` default,
weight versions, weight loading and its refusals, LoRA adapter syncs (merged against peft's own model), sleep/wake
gating, and parameters it cannot honour.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.replica import TokenOutput

from verl_gigpo.verl_glue.cpu.hf_rollout import HFGenerationServer

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [5, 6, 7, 8]


def _server(tiny_model_dir, replica_rank: int = 0, *extra: str) -> HFGenerationServer:
    overrides = [
        "platform=cpu",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "data.max_prompt_length=16",
        "data.max_response_length=3",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        cfg = compose(config_name="gigpo_trainer", overrides=overrides)
    return HFGenerationServer(omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout), str(tiny_model_dir), replica_rank)


@pytest.fixture
def server(tiny_model_dir):
    return _server(tiny_model_dir)


def _generate(server, prompt=PROMPT, **params) -> TokenOutput:
    return asyncio.run(server.generate("r", prompt, {"temperature": 1.0, "top_k": -1, "logprobs": True, **params}))


def test_generate_follows_verls_length_default_and_reports_the_weight_version(server):
    out = _generate(server, seed=0)
    assert 1 <= len(out.token_ids) <= 3 == server.config.response_length  # min(response_length, room left)
    assert len(out.log_probs) == len(out.token_ids) and all(lp <= 0 for lp in out.log_probs)
    assert out.stop_reason == "completed" and out.extra_fields["global_steps"] is None
    long_prompt = list(range(5, 5 + 18))  # prompt_length 16 + response_length 3 - 18 = 1 token of budget
    assert len(_generate(server, long_prompt, seed=0).token_ids) == 1
    server.update_weights(server.get_weights(), global_steps=7)
    assert _generate(server, seed=0).extra_fields == {"global_steps": 7, "min_global_steps": 7, "max_global_steps": 7}


def test_update_weights_loads_every_tensor_and_refuses_partial_or_foreign_ones(server):
    weights = {name: t + 0.5 for name, t in server.get_weights().items()}
    tied = "lm_head.weight"
    assert torch.equal(server.get_weights()[tied], server.get_weights()["model.embed_tokens.weight"])
    del weights[tied]  # tied to the embeddings: may be left out
    assert server.update_weights(weights, global_steps=1) == len(weights)
    for name, tensor in server.get_weights().items():
        torch.testing.assert_close(tensor, weights.get(name, weights["model.embed_tokens.weight"]), rtol=0, atol=0)
    before = server.get_weights()
    with pytest.raises(ValueError, match=r"1 names unknown.*\['model\.extra\.weight'\]"):
        server.update_weights({**weights, "model.extra.weight": torch.zeros(1)})
    missing = dict(weights)
    del missing["model.norm.weight"]
    with pytest.raises(ValueError, match=r"1 parameters .*not sent.*\['model\.norm\.weight'\]"):
        server.update_weights(missing)
    wrong = {**weights, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match="wrong shape"):
        server.update_weights(wrong)
    after = server.get_weights()  # nothing of the refused syncs was loaded
    assert all(torch.equal(after[k], before[k]) for k in before) and server.get_status()["weight_updates"] == 1


def test_no_generation_between_sleep_and_the_kv_cache_wake_up(server):
    async def scenario() -> list[str]:
        events = []
        await server.sleep()
        request = asyncio.create_task(server.generate("r", PROMPT, {"seed": 0}))
        await asyncio.sleep(0.2)
        events.append("waiting" if not request.done() else "served asleep")
        await server.wake_up(tags=["weights"])  # verl wakes the weights first, loads them, then the kv cache
        await asyncio.sleep(0.2)
        events.append("waiting" if not request.done() else "served before kv_cache")
        await server.wake_up(tags=["kv_cache"])
        await asyncio.wait_for(request, timeout=60)
        events.append("served")
        await server.abort_all_requests(reject_request=True)
        try:
            await server.generate("r", PROMPT, {"seed": 0})
            events.append("served while rejecting")
        except RuntimeError as exc:
            events.append("rejected" if "rejected" in str(exc) else repr(exc))
        await server.resume_generation()
        await server.generate("r", PROMPT, {"seed": 0})
        events.append("served")
        return events

    assert asyncio.run(scenario()) == ["waiting", "waiting", "served", "rejected", "served"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"repetition_penalty": 1.2}, "cannot apply repetition_penalty=1.2"),
        ({"ignore_eos": True}, "cannot apply ignore_eos=True"),
        ({"presence_penalty": 0.5}, "sampling parameter 'presence_penalty'"),
    ],
)
def test_parameters_it_cannot_honour_are_errors(server, params, message):
    with pytest.raises(ValueError, match=message):
        _generate(server, **params)


def test_multimodal_input_and_a_full_context_are_errors(server):
    with pytest.raises(ValueError, match="images for a text model"):
        asyncio.run(server.generate("r", PROMPT, {}, image_data=["img"]))
    with pytest.raises(ValueError, match="text and images only"):
        asyncio.run(server.generate("r", PROMPT, {}, video_data=["clip"]))
    too_long = list(range(5, 5 + server.max_model_len))
    with pytest.raises(ValueError, match="leaves no room"):
        _generate(server, too_long)


def test_replicas_sample_from_streams_seeded_by_rollout_seed_and_rank(tiny_model_dir):
    """Requests without a seed draw from the server's generator, seeded ``rollout.seed + replica_rank`` as verl
    seeds a vLLM replica: a fresh server of the same rank repeats its replies, another rank or seed does not (two
    replicas serving one group's identical prompts must not give identical episodes)."""

    def replies(server) -> list[list[int]]:
        return [_generate(server).token_ids for _ in range(8)]

    first = replies(_server(tiny_model_dir, 0))
    assert replies(_server(tiny_model_dir, 0)) == first
    assert replies(_server(tiny_model_dir, 1)) != first
    assert replies(_server(tiny_model_dir, 0, "actor_rollout_ref.rollout.seed=7")) != first


def _trained_adapter(model_dir, seed):
    """A peft LoRA adapter (rank 4, alpha 8, every linear layer) on the tiny model with random A and B, as training
    leaves it; returns (peft model, the tensors verl's weight sync sends, its peft config as verl sends it)."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    model.eval()
    # what FSDPEngine.get_per_tensor_param yields once the base is synced (verl's collect_lora_params)
    sent = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return model, sent, model.peft_config["default"].to_dict()


def test_a_lora_adapter_sync_serves_the_actors_adapted_model(server, tiny_model_dir):
    """verl's unmerged-adapter sync: the server merges W + s B A itself, in float32, onto the base it holds."""
    initial = server.get_weights()
    actor, sent, peft_config = _trained_adapter(tiny_model_dir, seed=0)
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in sent) and len(sent) == 28
    assert server.update_adapter(sent, peft_config, global_steps=1) == 14
    ids = torch.tensor([PROMPT + [9, 10, 11]])
    with torch.no_grad():
        gap = (server.model(ids).logits - actor(ids).logits).abs().max()
    assert gap < 1e-5  # merged fp32 weights against peft's unmerged forward: float rounding only
    merged = actor.merge_and_unload().state_dict()
    served = server.get_weights()
    for name in served:
        torch.testing.assert_close(served[name], merged[name], rtol=0, atol=0, msg=name)

    # the next adapter is merged onto the base, not onto the previous merge; a layer it leaves out gets its base back
    _, second, _ = _trained_adapter(tiny_model_dir, seed=1)
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    del second[f"{q}.lora_A.weight"], second[f"{q}.lora_B.weight"]
    assert server.update_adapter(second, peft_config, global_steps=2) == 13
    served = server.get_weights()
    assert torch.equal(
        served["model.layers.0.self_attn.q_proj.weight"], initial["model.layers.0.self_attn.q_proj.weight"]
    )
    a, b = (
        second[f"{q.replace('q_proj', 'k_proj')}.lora_A.weight"],
        second[f"{q.replace('q_proj', 'k_proj')}.lora_B.weight"],
    )
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    torch.testing.assert_close(served[k_proj], initial[k_proj] + 2.0 * b @ a, rtol=0, atol=0)

    # a refused adapter leaves the served weights as they were
    with pytest.raises(ValueError, match="do not fit"):
        server.update_adapter({**second, f"{q}.lora_A.weight": torch.ones(4, 3), f"{q}.lora_B.weight": b}, peft_config)
    assert all(torch.equal(server.get_weights()[k], served[k]) for k in served)
    assert server.get_status()["weight_updates"] == 2 and server.global_steps == 2

    # full weights after adapters are the new base
    shifted = {name: t + 1.0 for name, t in initial.items() if name != "lm_head.weight"}
    server.update_weights(shifted, global_steps=3)
    server.update_adapter(second, peft_config, global_steps=4)
    torch.testing.assert_close(server.get_weights()[k_proj], shifted[k_proj] + 2.0 * b @ a, rtol=0, atol=0)
