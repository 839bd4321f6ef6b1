"""The ``hf`` rollout backend: verl's rollout servers answered by the project's Hugging Face generation server.

Select it with ``actor_rollout_ref.rollout.name=hf`` (``platform=cpu``, i.e. ``config/platform/cpu.yaml``, does).
It is verl's rollout contract, met without vLLM/SGLang, so that verl's own pipeline (``main_ppo`` -> TaskRunner ->
the trainer -> agent loops) runs on a CPU. Three pieces, as verl's vLLM backend has:

* :class:`HFReplica` (``verl.workers.rollout.replica.RolloutReplica``, registered in ``RolloutReplicaRegistry``):
  one per rollout replica; in verl's synchronous ("hybrid") mode it starts one :class:`HFGenerationServer` Ray
  actor next to the replica's training worker.
* :class:`HFGenerationServer`: a Ray actor wrapping :class:`verl_gigpo.local.server.LocalGenerationServer`
  (batched generation, KV cache, per-token log-probs). It speaks verl's server interface: ``generate`` returns
  ``TokenOutput`` with the weight version (``global_steps``); ``sleep``/``wake_up`` gate generation the way
  verl's trainer expects (no generation between ``sleep`` and the ``wake_up`` after a weight update);
  ``update_weights`` loads the actor's new weights.
* :class:`HFServerAdapter` (``verl.workers.rollout.base.BaseRollout``): lives in each training worker; verl's
  weight sync (``ActorRolloutRefWorker.update_weights``) hands it a generator of ``(HF name, full tensor)``; every
  rank drains it (``DTensor.full_tensor()`` is a collective) and the replica's first rank sends the tensors to its
  server through Ray's object store.

LoRA (``actor_rollout_ref.model.lora_rank`` > 0). verl's default (``model.lora.merge=false``) syncs as it does for
vLLM: the base weights once (``base_sync_done=False``, layer names with peft's ``.base_layer``), then only the
adapter's ``A`` and ``B`` after every update. The server keeps the base weights and serves ``W + s B A`` merged in
float32 (:func:`verl_gigpo.verl_glue.lora.merge_lora`), the same function as the actor's unmerged adapter: rollout and
actor log-probs agree to float rounding. With ``model.lora.merge=true`` verl merges in the actor and sends every weight
cast to bfloat16 (``FSDPEngine._merged_lora_per_tensor_param``): the server then holds bf16-rounded weights
(measured gap to the fp32 actor ~4e-3 in token probability, 4e-4 after an update), so keep the default on a CPU.

Limits (stated, not hidden): only verl's synchronous trainer (hybrid replicas) is supported; aborting requests does
not interrupt a running batch (in-flight requests finish); video and audio inputs are rejected. Requests with images
(a vision-language model, loaded with ``AutoModelForImageTextToText``) run one at a time without a KV cache
(:meth:`HFGenerationServer._generate_with_images`; docs/vision.md). It is a correctness tool, not a fast one: use vLLM
on GPUs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from verl_gigpo.verl_glue.contract import check_contract
from verl_gigpo.verl_glue.cpu import ROLLOUT_NAME
from verl_gigpo.verl_glue.lora import merge_lora

__all__ = ["DUMP_WEIGHTS_ENV", "HFGenerationServer", "HFReplica", "HFServerAdapter", "server_actor_name"]


#: environment variable: a folder where every server saves the weights it serves after each sync (safetensors,
#: ``sync<NNN>_step<global_steps>_replica<R>.safetensors``: the weights received, or after a LoRA adapter sync the
#: merged weights of the adapted layers and the rest), so that a run can be checked against the actor's checkpoints
#: afterwards (the CPU e2e tests do)
DUMP_WEIGHTS_ENV = "GIGPO_HF_DUMP_WEIGHTS_DIR"

#: sampling keys verl's agent loops send that the local server reads under the same name
_PASSED = ("temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "seed", "stop_token_ids")
#: keys accepted only at their neutral value (the local server cannot apply anything else)
_NEUTRAL = {"repetition_penalty": 1.0, "ignore_eos": False, "n": 1}
#: keys that carry no meaning here (log-probs are always returned)
_IGNORED = ("logprobs",)


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    """Ray actor name of the generation server of replica ``replica_rank`` (unique within a Ray job)."""
    return f"gigpo_hf_server_{replica_rank}{name_suffix}"


def _rollout_world_size(config: Any) -> int:
    return int(config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size)


class HFGenerationServer:
    """Ray actor: verl's rollout-server interface over :class:`~verl_gigpo.local.server.LocalGenerationServer`.

    Args:
        config: verl ``RolloutConfig`` (reads ``prompt_length``, ``response_length``, ``max_model_len``,
            ``max_num_seqs``, ``free_cache_engine`` and ``seed``: the server samples requests that bring no ``seed``
            from a generator seeded ``seed + replica_rank``, as verl seeds each vLLM replica's engine).
        model_path: local Hugging Face model folder (verl's ``HFModelConfig.local_path``).
        replica_rank: the replica this server belongs to (for messages).
        trust_remote_code: passed to ``from_pretrained``.
    """

    def __init__(self, config: Any, model_path: str, replica_rank: int, trust_remote_code: bool = False):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from verl_gigpo.local.server import LocalGenerationServer

        self.config = config
        self.replica_rank = replica_rank
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        vision = getattr(
            AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code), "vision_config", None
        )
        #: the image processor of a vision-language model (None: a text model, image requests are refused)
        self.image_processor = None
        #: the vision placeholder ids, never drawn in a reply (verl's rope index would read one as an image)
        self._vision_ids: set[int] = set()
        if vision is not None:  # AutoModelForCausalLM has no mapping for Qwen-VL models
            from transformers import AutoProcessor

            model = AutoModelForImageTextToText.from_pretrained(
                model_path, trust_remote_code=trust_remote_code, dtype=torch.float32
            )
            processor = AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)
            self.image_processor = processor.image_processor
            names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
            self._vision_ids = {int(i) for i in (getattr(model.config, n, None) for n in names) if i is not None}
        else:
            model = AutoModelForCausalLM.from_pretrained(
                model_path, trust_remote_code=trust_remote_code, torch_dtype=torch.float32
            )
        self.model = model
        max_batch = int(getattr(config, "max_num_seqs", 0) or 0)
        self.server = LocalGenerationServer(
            model,
            tokenizer,
            device="cpu",
            max_batch_size=max(1, min(max_batch, 256)) if max_batch else 64,
            seed=int(getattr(config, "seed", 0)) + replica_rank,  # replicas draw different streams
        )
        self.max_model_len = int(
            getattr(config, "max_model_len", None)
            or getattr(model.config, "max_position_embeddings", 0)
            or config.prompt_length + config.response_length
        )
        self.global_steps: int | None = None
        self.weight_updates = 0
        #: the base weights while a LoRA adapter is served merged (:meth:`update_adapter`), else None
        self._base: dict[str, torch.Tensor] | None = None
        #: the weights that hold an adapter merged into the base (restored when a later adapter leaves them out)
        self._merged: set[str] = set()
        self._awake = asyncio.Event()
        self._awake.set()
        self._reject = False

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Generate one response; returns ``TokenOutput(token_ids, log_probs, stop_reason, extra_fields)``.

        ``max_tokens`` defaults as in verl's vLLM server: ``min(response_length, prompt_length + response_length
        - len(prompt))``, clamped to the model's context. Waits while the server sleeps (weights are being
        replaced); fails after ``abort_all_requests(reject_request=True)``.

        Raises:
            ValueError: video/audio input, images for a text model, a sampling parameter the local server cannot
                honour, or a prompt that leaves no room in the model's context.
        """
        if video_data is not None or kwargs.get("audio_data") is not None:
            raise ValueError("the 'hf' rollout backend takes text and images only (video/audio data given)")
        if image_data is not None and self.image_processor is None:
            raise ValueError("the 'hf' rollout backend got images for a text model: use a vision-language model")
        while not self._awake.is_set():
            if self._reject:
                raise RuntimeError(f"hf server {self.replica_rank}: requests are rejected (replica leaving)")
            await self._awake.wait()
        params = self._sampling_params(prompt_ids, sampling_params)
        if image_data:
            # the local server's one generation thread: image requests and text batches never share the model
            token_ids, log_probs = await asyncio.get_running_loop().run_in_executor(
                self.server._executor, self._generate_with_images, list(prompt_ids), list(image_data), params
            )
        else:
            out = await self.server.generate(request_id, prompt_ids=list(prompt_ids), sampling_params=params)
            token_ids, log_probs = list(out.token_ids), list(out.log_probs)
        version = self.global_steps
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",  # eos and length both end a request normally (vLLM maps both the same way)
            extra_fields={"global_steps": version, "min_global_steps": version, "max_global_steps": version},
        )

    @torch.inference_mode()
    def _generate_with_images(
        self, prompt_ids: list[int], images: list[Any], params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """One request with images: ``(token ids, log-probs)``, decoded one token per full forward (no KV cache).

        The positions are those verl's agent loop gives the actor (:meth:`_positions`); the pixels come from the
        processor's image processor, as verl's agent loop computes ``multi_modal_inputs``. Sampling and log-probs as
        the local server's (:func:`verl_gigpo.local.sampling.sample_tokens`). Vision placeholder tokens (image/video
        pad, vision start/end) are never drawn (verl would read one in a reply as an image without pixels; a random
        model draws them), but the log-prob returned is the full policy's, as the actor computes it.
        """
        from verl_gigpo.local.sampling import parse_sampling_params, sample_tokens

        server = self.server
        p = parse_sampling_params(params, vocab_size=server.vocab_size)
        vision = self.image_processor(images=images, return_tensors="pt")
        generator = p.generator or (torch.Generator().manual_seed(p.seed) if p.seed is not None else server.generator)
        stops = set(server.eos_token_ids) | {server.pad_token_id} | set(p.stop_token_ids)
        temperature = torch.tensor([p.temperature], dtype=torch.float32)  # (1,)
        ids = torch.tensor([prompt_ids], dtype=torch.long)  # (1, P)
        tokens: list[int] = []
        logprobs: list[float] = []
        self.model.eval()
        for _ in range(p.max_tokens):
            attention = torch.ones_like(ids)  # (1, L)
            logits = (
                self.model(
                    input_ids=ids,
                    attention_mask=attention,
                    position_ids=self._positions(ids, attention, vision["image_grid_thw"]),  # (4, 1, L)
                    pixel_values=vision["pixel_values"],
                    image_grid_thw=vision["image_grid_thw"],
                    use_cache=False,
                    logits_to_keep=1,
                )
                .logits[:, -1, :]
                .float()
            )  # (1, V)
            if p.allowed_token_ids is not None:
                allowed = torch.zeros_like(logits, dtype=torch.bool)
                allowed[0, list(p.allowed_token_ids)] = True
                logits = logits.masked_fill(~allowed, float("-inf"))
            drawable = logits.clone()
            drawable[0, list(self._vision_ids)] = float("-inf")  # (1, V)
            token, _ = sample_tokens(drawable, temperature, temperature == 0, [p], [generator], [0])
            scale = p.temperature if p.temperature > 0 else 1.0
            logprob = torch.log_softmax(logits / scale, dim=-1)[0, token[0]]  # the policy's, as the actor computes
            tokens.append(int(token[0]))
            logprobs.append(float(logprob))
            if tokens[-1] in stops:
                break
            ids = torch.cat([ids, token[:, None]], dim=1)  # (1, P + t)
        server.stats["requests"] += 1
        server.stats["generated_tokens"] += len(tokens)
        return tokens, logprobs

    def _positions(self, ids: torch.Tensor, attention: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """(4, 1, L) positions as verl's agent loop computes them for the actor: the text positions, then the
        model's 3 rope axes (``get_rope_index``). The text row changes how the model builds its attention mask."""
        image_id = int(self.model.config.image_token_id)
        token_types = (ids == image_id).to(torch.int)  # (1, L): 1 = image token
        rope, _ = self.model.model.get_rope_index(
            ids, mm_token_type_ids=token_types, image_grid_thw=grid_thw, attention_mask=attention
        )  # (3, 1, L)
        text = torch.arange(ids.shape[1], dtype=rope.dtype)[None, None, :]  # (1, 1, L)
        return torch.cat([text, rope], dim=0)

    def _sampling_params(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for key, value in dict(sampling_params).items():
            if key in _PASSED:
                params[key] = value
            elif key in _NEUTRAL:
                if value != _NEUTRAL[key] and value is not None:
                    raise ValueError(
                        f"the 'hf' rollout backend cannot apply {key}={value!r} (only {_NEUTRAL[key]!r}); "
                        f"leave actor_rollout_ref.rollout.{key} at its default"
                    )
            elif key not in _IGNORED:
                raise ValueError(f"the 'hf' rollout backend does not know the sampling parameter {key!r}")
        if params.get("top_k") is None or params.get("top_k") == -1:
            params.pop("top_k", None)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the model's context ({self.max_model_len})"
            )
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_tokens is None:
            cfg = self.config
            max_tokens = min(cfg.response_length, cfg.prompt_length + cfg.response_length - len(prompt_ids))
        params["max_tokens"] = max(1, min(int(max_tokens), room))
        return params

    # ------------------------------------------------------------------ weights
    def update_weights(self, weights: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the actor's full weights (HF names) into the served model; returns the number of tensors loaded.

        They are also the base weights of later LoRA adapter syncs (:meth:`update_adapter`). Tied parameters (e.g.
        ``lm_head.weight`` with tied embeddings) may be absent; any other missing or unknown name is an error, so a
        sync can never silently leave stale weights.

        Raises:
            ValueError: names that do not match the served model.
        """
        own = self.model.state_dict()
        unknown = sorted(set(weights) - set(own))
        if unknown:
            raise ValueError(f"weight sync: {len(unknown)} names unknown to the served model, e.g. {unknown[:3]}")
        missing = sorted(set(own) - set(weights))
        tied = _tied_names(self.model)
        untied_missing = [name for name in missing if name not in tied]
        if untied_missing:
            raise ValueError(
                f"weight sync: {len(untied_missing)} parameters were not sent, e.g. {untied_missing[:3]}; "
                "the served model would keep stale weights"
            )
        self._load(weights)
        if self._base is not None:  # an adapter was merged before: these weights are the new base
            self._base = {name: t.detach().clone() for name, t in self.model.state_dict().items()}
            self._merged = set()
        self._synced(global_steps, weights)
        return len(weights)

    def update_adapter(
        self, adapter: dict[str, torch.Tensor], peft_config: dict[str, Any], global_steps: int | None = None
    ) -> int:
        """Serve the base weights with a LoRA adapter merged: ``W' = W + s B A`` for every adapted layer, in float32
        (:func:`verl_gigpo.verl_glue.lora.merge_lora`). The base ``W`` is what the last full sync
        (:meth:`update_weights`) or the model folder gave, never an earlier merge. Returns the number of layers merged.

        Args:
            adapter: the adapter's ``lora_A``/``lora_B`` tensors as verl sends them (peft names, full tensors).
            peft_config: the adapter's peft ``LoraConfig`` as a dict (rank, alpha, ...).

        Raises:
            ValueError / NotImplementedError: from :func:`~verl_gigpo.verl_glue.lora.merge_lora` (names, shapes, a LoRA
                variant the formula does not cover); the served weights are then unchanged.
        """
        if self._base is None:  # before the first merge the served weights are the base
            self._base = {name: t.detach().clone() for name, t in self.model.state_dict().items()}
        merged = merge_lora(self._base, adapter, peft_config)
        # a layer adapted by the previous adapter but not by this one goes back to its base weight
        self._load({**{name: self._base[name] for name in self._merged - set(merged)}, **merged})
        self._merged = set(merged)
        self._synced(global_steps)
        return len(merged)

    def _load(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (served names, all checked to exist) into the served model after checking every shape."""
        own = self.model.state_dict()
        wrong = [
            f"{n} {tuple(t.shape)} != {tuple(own[n].shape)}" for n, t in weights.items() if t.shape != own[n].shape
        ]
        if wrong:  # checked before any copy: a failed sync leaves the served weights as they were
            raise ValueError(f"weight sync: {len(wrong)} tensors of the wrong shape (sent != served), e.g. {wrong[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                own[name].copy_(tensor.to(dtype=own[name].dtype))

    def _synced(self, global_steps: int | None, received: dict[str, torch.Tensor] | None = None) -> None:
        """Count a sync, set the weight version and, with :data:`DUMP_WEIGHTS_ENV`, save the weights ``received``
        (None: every weight the model now serves)."""
        self.weight_updates += 1
        if global_steps is not None:
            self.global_steps = int(global_steps)
        dump_dir = os.environ.get(DUMP_WEIGHTS_ENV)
        if dump_dir:
            from safetensors.torch import save_file

            os.makedirs(dump_dir, exist_ok=True)
            name = f"sync{self.weight_updates:03d}_step{self.global_steps}_replica{self.replica_rank}.safetensors"
            if received is None:  # clones: tied weights share storage, which safetensors refuses to save
                received = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            save_file({k: v.contiguous() for k, v in received.items()}, os.path.join(dump_dir, name))

    def get_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the served model's weights (HF names), e.g. to check a sync against the actor."""
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def get_status(self) -> dict[str, Any]:
        """``global_steps`` (weight version), ``weight_updates``, ``awake`` and the generation counters."""
        return {
            "global_steps": self.global_steps,
            "weight_updates": self.weight_updates,
            "awake": self._awake.is_set(),
            **self.server.stats,
        }

    async def set_global_steps(self, global_steps: int) -> None:
        """Set the weight version reported with every output."""
        self.global_steps = int(global_steps)

    # ------------------------------------------------------------------ lifecycle (verl's server interface)
    async def sleep(self) -> None:
        """Stop serving until :meth:`wake_up` (verl puts replicas to sleep before replacing weights)."""
        self._awake.clear()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Serve again. verl wakes ``weights`` first, loads them, then ``kv_cache``: serving resumes on the latter."""
        if tags is None or "kv_cache" in tags:
            self._reject = False
            self._awake.set()

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Hold (or, with ``reject_request``, fail) new requests until :meth:`resume_generation`.

        Requests already in a batch finish (the local server cannot interrupt a batch): none are aborted.
        """
        self._reject = bool(reject_request)
        self._awake.clear()
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        """Admit requests again after :meth:`abort_all_requests`."""
        self._reject = False
        self._awake.set()

    async def clear_kv_cache(self) -> None:
        """No-op: the local server builds a fresh KV cache for every batch."""

    async def release_kv_cache(self) -> None:
        """No-op (see :meth:`clear_kv_cache`)."""

    async def resume_kv_cache(self) -> None:
        """No-op (see :meth:`clear_kv_cache`)."""

    async def start_profile(self, **kwargs: Any) -> None:
        """No profiler on this backend."""

    async def stop_profile(self) -> None:
        """No profiler on this backend."""


def _tied_names(model: Any) -> set[str]:
    """Names of parameters that share storage with another parameter (e.g. tied input/output embeddings)."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=False).items():
        key = tensor.data_ptr()
        if key in seen:
            tied.update((name, seen[key]))
        else:
            seen[key] = name
    return tied


class HFReplica(RolloutReplica):
    """verl rollout replica of the ``hf`` backend: one :class:`HFGenerationServer` Ray actor per replica."""

    async def launch_servers(self) -> None:
        """Start this replica's generation server on the node of its training worker (hybrid mode only)."""
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the '{ROLLOUT_NAME}' rollout backend runs with verl's synchronous trainer only (hybrid replicas, "
                f"got {self.rollout_mode}); use vllm or sglang for colocated/standalone rollouts"
            )
        if self.world_size != 1:
            raise ValueError(
                f"the '{ROLLOUT_NAME}' rollout backend serves one process per replica: set "
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline parallel size 1)"
            )
        node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        model_config = self.model_config
        model_path = model_config.get("local_path") or model_config.get("path")
        name = server_actor_name(self.replica_rank, self.name_suffix)
        server_cls = ray.remote(HFGenerationServer)
        server = server_cls.options(
            name=name,
            num_cpus=0,  # placement only; it shares the worker's cores
            max_concurrency=self.max_concurrency,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            ),
        ).remote(
            config=self.config,
            model_path=model_path,
            replica_rank=self.replica_rank,
            trust_remote_code=bool(model_config.get("trust_remote_code", False)),
        )
        await server.get_status.remote()  # surfaces load errors here, not at the first request
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{ROLLOUT_NAME}://{name}"


class HFServerAdapter(BaseRollout):
    """In-worker side of the ``hf`` backend: verl's weight sync and sleep/wake calls, forwarded to the server.

    verl builds one per training rank (``ActorRolloutRefWorker``); the rank ``rank % rollout_world_size == 0``
    of each replica owns the server handle. ``update_weights`` must be called on every rank (verl does): the
    generator's ``full_tensor()`` all-gathers are collectives.
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = _rollout_world_size(self.config)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.sleep_level = 1
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self.rollout_rank != 0:
            return None
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Wake the server (``tags``: ``weights`` and/or ``kv_cache``)."""
        server = self._server_handle()
        if server is not None:
            await server.wake_up.remote(tags=list(tags))

    async def release(self) -> None:
        """Put the server to sleep."""
        server = self._server_handle()
        if server is not None:
            await server.sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        peft_config: Any = None,
        global_steps: int | None = None,
        base_sync_done: bool = True,
        **kwargs: Any,
    ) -> None:
        """Drain ``weights`` (on every rank) and load them into this replica's server.

        What verl sends (``ActorRolloutRefWorker.update_weights``): full weights (``peft_config`` None); with an
        unmerged LoRA adapter, the base weights once (``base_sync_done`` false; peft's ``.base_layer`` is dropped
        from their names) and then the adapter alone (``base_sync_done`` true), which the server merges
        (:meth:`HFGenerationServer.update_adapter`).

        Raises:
            NotImplementedError: a wire format other than full named tensors (delta updates).
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the '{ROLLOUT_NAME}' rollout backend takes full tensors, not {wire_format!r}")
        adapter_only = peft_config is not None and base_sync_done
        server = self._server_handle()
        state: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if server is not None:
                key = name if adapter_only else name.replace(".base_layer.", ".")
                state[key] = full.detach().to("cpu", copy=True).contiguous()
        if server is None:
            return
        if adapter_only:
            await server.update_adapter.remote(state, dict(peft_config), global_steps)
        else:
            await server.update_weights.remote(state, global_steps)


check_contract(__name__)  # RolloutReplica's _server_handle and _server_address, which HFReplica sets
