"""An in-process generation server for Hugging Face causal LMs with the async interface of verl's server manager.

    server = LocalGenerationServer(model, tokenizer, max_batch_size=64)
    out = await server.generate("traj-0", prompt_ids=[...], sampling_params={"temperature": 1.0, "max_tokens": 8})
    out.token_ids, out.log_probs, out.stop_reason

Concurrent calls are batched into one generation in a worker thread; each request samples from its own generator.
Sampling parameters: :mod:`verl_gigpo.local.sampling`. How batching works: docs/local-engine.md.
Image requests keep each (ids, pixels)'s logits until :meth:`LocalGenerationServer.forget_image_logits` (called
before each rollout): equal states share one forward, with the same tokens and log-probs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from environments.images import pixel_key
from verl_gigpo.local.sampling import (
    DecodeControls,
    DecodeOutputs,
    SamplingParams,
    parse_sampling_params,
    sample_tokens,
)
from verl_gigpo.local.tensors import left_pad
from verl_gigpo.rollout.types import GenerationOutput
from verl_gigpo.rollout.vision import image_inputs, rope_positions, vision_token_ids

__all__ = ["LocalGenerationServer", "SamplingParams", "parse_sampling_params"]

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class LocalGenerationServer:
    """Batched async generation with a Hugging Face causal LM, in this process (CPU or one GPU).

    Args:
        eos_token_ids: stop ids (default: the tokenizer's EOS id plus the generation config's).
        pad_token_id: padding id (default: the tokenizer's pad id, else the first EOS id); it also stops.
        seed: seed of the server's generator, for requests that bring neither ``seed`` nor ``generator``.
        image_processor: a vision-language model's image processor, needed by requests with ``image_data``.

    Attributes:
        stats: counters ``requests``, ``batches``, ``forward_passes``, ``generated_tokens``, ``max_batch``,
            ``busy_s``, ``prefill_rows`` (distinct prompts prefilled).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        max_batch_size: int = 64,
        default_max_tokens: int = 16,
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        seed: int = 0,
        image_processor: Any = None,
        image_cache_size: int = 4096,
    ) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.default_max_tokens = default_max_tokens
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        if eos_token_ids is None:
            ids: list[int] = []
            for source in (getattr(tokenizer, "eos_token_id", None), _generation_eos(model)):
                for i in source if isinstance(source, list | tuple) else [source]:
                    if i is not None and i not in ids:
                        ids.append(int(i))
            eos_token_ids = ids
        if not eos_token_ids:
            raise ValueError("no EOS token id: the tokenizer has none; pass eos_token_ids=[...]")
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad_token_id) if pad_token_id is not None else self.eos_token_ids[0]
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.image_processor = image_processor
        self.vision_ids = sorted(vision_token_ids(model.config)) if image_processor is not None else []
        self.stats = {
            "requests": 0,
            "batches": 0,
            "forward_passes": 0,
            "generated_tokens": 0,
            "max_batch": 0,
            "busy_s": 0.0,
            "prefill_rows": 0,
            "image_cache_hits": 0,
        }
        self.image_cache_size = image_cache_size
        self._image_logits: dict[tuple, torch.Tensor] = {}  # (ids, pixel keys) -> (1, V) logits
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-generate")
        self._pending: list[_Request] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closed = False

    # ------------------------------------------------------------------ public API
    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: Sequence[int],
        sampling_params: dict[str, Any] | None = None,
        image_data: Sequence[Any] | None = None,
    ) -> GenerationOutput:
        """Generate a continuation of ``prompt_ids`` (P,), batched with whatever other requests are waiting.

        Returns a :class:`GenerationOutput`: ``token_ids`` (R,), ``log_probs`` (R,), ``stop_reason`` (``"completed"``
        when a stop id, included, ended it, else ``"length"``). A request with ``image_data`` runs alone.

        Raises:
            ValueError: bad prompt ids or sampling parameters.
            RuntimeError: the server is closed.
        """
        if self._closed:
            raise RuntimeError("LocalGenerationServer is closed")
        if isinstance(prompt_ids, str | bytes) or not isinstance(prompt_ids, Sequence) or len(prompt_ids) == 0:
            raise ValueError(f"request {request_id}: prompt_ids must be a non-empty list of token ids")
        prompt = [int(i) for i in prompt_ids]
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"request {request_id}: prompt_ids must lie in [0, {self.vocab_size}) (the model's vocab)")
        params = parse_sampling_params(
            sampling_params, vocab_size=self.vocab_size, default_max_tokens=self.default_max_tokens
        )
        loop = asyncio.get_running_loop()
        if image_data:
            if self.image_processor is None:
                raise ValueError(f"request {request_id}: images for a text model; use a vision-language model")
            self.stats["requests"] += 1
            # the one generation thread: image requests and text batches never share the model
            return await loop.run_in_executor(
                self._executor, self._generate_with_images, prompt, list(image_data), params
            )
        self._ensure_worker(loop)
        future = loop.create_future()
        self._pending.append(_Request(prompt, params, future))
        self.stats["requests"] += 1
        self._wakeup.set()
        return await future

    async def aclose(self) -> None:
        """Stop the background task and the worker thread (pending requests fail with RuntimeError)."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        for req in self._pending:
            if not req.future.done():
                req.future.set_exception(RuntimeError("LocalGenerationServer closed before this request ran"))
        self._pending.clear()
        self._executor.shutdown(wait=True)

    def close(self) -> None:
        """Synchronous close for use outside an event loop (the worker thread is shut down)."""
        self._closed = True
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        self._executor.shutdown(wait=True)

    def forget_image_logits(self) -> None:
        """Drop the kept logits of image requests; call it whenever the model's weights change."""
        self._image_logits.clear()

    # ------------------------------------------------------------------ batching
    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop or self._worker is None or self._worker.done():
            if self._pending and self._loop is not loop:
                raise RuntimeError("LocalGenerationServer is in use by another event loop")
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._serve(), name="local-generation-server")

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # let coroutines that are ready now (e.g. episodes whose environment step just finished) queue up
            await asyncio.sleep(0)
            while self._pending:
                batch = self._pending[: self.max_batch_size]
                del self._pending[: self.max_batch_size]
                batch = [r for r in batch if not r.future.done()]  # cancelled callers
                if not batch:
                    continue
                try:
                    outputs = await loop.run_in_executor(
                        self._executor, self._generate_batch, [r.prompt_ids for r in batch], [r.params for r in batch]
                    )
                except asyncio.CancelledError:
                    for req in batch:
                        if not req.future.done():
                            req.future.set_exception(RuntimeError("LocalGenerationServer closed during generation"))
                    raise
                except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch, with context
                    logger.exception("batched generation of %d requests failed", len(batch))
                    err = RuntimeError(f"local generation failed for a batch of {len(batch)}: {exc!r}")
                    for req in batch:
                        if not req.future.done():
                            req.future.set_exception(err)
                    continue
                for req, out in zip(batch, outputs, strict=True):
                    if not req.future.done():
                        req.future.set_result(out)

    # ------------------------------------------------------------------ the batched generation
    @torch.inference_mode()
    def _generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        """One batched generation for B requests (runs in the worker thread); one output per request, in order."""
        start = time.perf_counter()
        self.model.eval()
        # identical prompts (e.g. the members of an episode group at their first step) are prefilled once
        unique: dict[tuple[int, ...], int] = {}
        expand = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompts], device=self.device)  # (B,)
        input_ids, attention, positions = left_pad(list(unique), self.pad_token_id, device=self.device)  # (U, P)
        self.stats["prefill_rows"] += len(unique)
        tokens, logprobs, stop_reason = self._decode(input_ids, attention, positions, expand, params)
        self.stats["batches"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], len(prompts))
        self.stats["generated_tokens"] += sum(len(t) for t in tokens)
        self.stats["busy_s"] += time.perf_counter() - start
        return [
            GenerationOutput(token_ids=tokens[i], log_probs=logprobs[i], stop_reason=stop_reason[i])
            for i in range(len(prompts))
        ]

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        positions: torch.Tensor,
        expand: torch.Tensor,
        params: list[SamplingParams],
    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Prefill the U distinct prompts (U, P), then decode B requests one token per forward with a KV cache.

        ``expand`` (B,) maps each request to its prompt; returns per request the token ids, log-probs and stop reason.
        """
        from transformers import DynamicCache

        batch, dev = len(params), self.device
        ctl = self._controls(params)
        longest = max(ctl.max_tokens)
        cache = DynamicCache()
        out = DecodeOutputs.empty(batch)
        step_ids, step_pos = input_ids, positions
        for t in range(longest):
            forward = self.model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=step_pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            self.stats["forward_passes"] += 1
            cache = forward.past_key_values
            logits = forward.logits[:, -1, :].float()  # (B, V); (U, V) after the prefill
            if t == 0:
                logits = logits.index_select(0, expand)  # (B, V)
                if longest > 1:  # decoding continues per request: give each request its own cache row
                    cache.reorder_cache(expand)
                    attention = attention.index_select(0, expand)  # (B, P)
                    step_pos = step_pos.index_select(0, expand)  # (B, P)
            if ctl.allowed is not None:
                logits = logits.masked_fill(~ctl.allowed, float("-inf"))
            active = [i for i in range(batch) if not out.done[i]]
            # (B,) each: one token per request and its log-prob
            tokens, logprobs = sample_tokens(logits, ctl.temperature, ctl.greedy, params, ctl.generators, active)
            out.add(tokens.tolist(), logprobs.tolist(), active, t, ctl)
            if all(out.done):
                break
            finished = torch.tensor(out.done, device=dev)  # (B,)
            step_ids = torch.where(finished, torch.full_like(tokens, self.pad_token_id), tokens)[:, None]  # (B, 1)
            step_pos = step_pos[:, -1:] + 1  # (B, 1)
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=dev)], dim=1)
        return out.tokens, out.logprobs, out.stop_reason

    @torch.inference_mode()
    def _generate_with_images(self, prompt_ids: list[int], images: list[Any], p: SamplingParams) -> GenerationOutput:
        """One request with images, one full forward per token (no KV cache), with the actor's positions and pixels.

        Vision placeholder ids are never drawn; the log-prob returned is the full policy's, as the actor computes it.
        """
        start = time.perf_counter()
        self.model.eval()
        pixels = tuple(pixel_key(image) for image in images)
        vision: dict[str, torch.Tensor] | None = None
        generator = p.generator or (torch.Generator().manual_seed(p.seed) if p.seed is not None else self.generator)
        stops = set(self.eos_token_ids) | {self.pad_token_id} | set(p.stop_token_ids)
        temperature = torch.tensor([p.temperature], dtype=torch.float32, device=self.device)  # (1,)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)  # (1, P)
        tokens: list[int] = []
        logprobs: list[float] = []
        for _ in range(p.max_tokens):
            key = (tuple(ids[0].tolist()), pixels)
            logits = self._image_logits.get(key)  # (1, V)
            if logits is None:
                if vision is None:
                    vision = {k: v.to(self.device) for k, v in image_inputs(self.image_processor, images).items()}
                attention = torch.ones_like(ids)  # (1, L)
                forward = self.model(
                    input_ids=ids,
                    attention_mask=attention,
                    position_ids=rope_positions(self.model, ids, attention, vision["image_grid_thw"]),  # (4, 1, L)
                    **vision,
                    use_cache=False,
                    logits_to_keep=1,
                )
                self.stats["forward_passes"] += 1
                logits = forward.logits[:, -1, :].float()  # (1, V)
                if len(self._image_logits) >= self.image_cache_size:
                    self._image_logits.clear()
                self._image_logits[key] = logits
            else:
                self.stats["image_cache_hits"] += 1
            if p.allowed_token_ids is not None:
                allowed = torch.zeros_like(logits, dtype=torch.bool)
                allowed[0, list(p.allowed_token_ids)] = True
                logits = logits.masked_fill(~allowed, float("-inf"))
            drawable = logits.clone()
            drawable[0, self.vision_ids] = float("-inf")  # (1, V)
            token, _ = sample_tokens(drawable, temperature, temperature == 0, [p], [generator], [0])
            scale = p.temperature if p.temperature > 0 else 1.0
            tokens.append(int(token[0]))
            logprobs.append(float(torch.log_softmax(logits / scale, dim=-1)[0, token[0]]))
            if tokens[-1] in stops:
                break
            ids = torch.cat([ids, token[:, None]], dim=1)  # (1, P + t)
        self.stats["batches"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], 1)
        self.stats["generated_tokens"] += len(tokens)
        self.stats["busy_s"] += time.perf_counter() - start
        stop = "completed" if tokens and tokens[-1] in stops else "length"
        return GenerationOutput(token_ids=tokens, log_probs=logprobs, stop_reason=stop)

    def _controls(self, params: list[SamplingParams]) -> DecodeControls:
        """The B requests' sampling parameters as the tensors and lists the decoding loop reads."""
        allowed = None
        if any(p.allowed_token_ids is not None for p in params):
            allowed = torch.ones((len(params), self.vocab_size), dtype=torch.bool, device=self.device)  # (B, V)
            for i, p in enumerate(params):
                if p.allowed_token_ids is not None:
                    allowed[i] = False
                    allowed[i, list(p.allowed_token_ids)] = True
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=self.device)  # (B,)
        base_stops = set(self.eos_token_ids) | {self.pad_token_id}
        return DecodeControls(
            temperature=temperature,
            greedy=temperature == 0,
            max_tokens=[p.max_tokens for p in params],
            allowed=allowed,
            stops=[base_stops | set(p.stop_token_ids) for p in params],
            generators=[
                p.generator
                if p.generator is not None
                else (torch.Generator().manual_seed(p.seed) if p.seed is not None else self.generator)
                for p in params
            ],
        )


def _generation_eos(model: Any) -> list[int] | int | None:
    config = getattr(model, "generation_config", None)
    return getattr(config, "eos_token_id", None) if config is not None else None
