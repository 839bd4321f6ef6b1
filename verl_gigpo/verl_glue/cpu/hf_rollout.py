"""The ``hf`` rollout backend: verl's rollout servers answered by the project's Hugging Face generation server.

Select it with ``actor_rollout_ref.rollout.name=hf`` (``platform=cpu`` does), so that verl's own pipeline runs on a
CPU without vLLM/SGLang. Three pieces, as verl's vLLM backend has: :class:`HFReplica` (one per replica),
:class:`HFGenerationServer` (a Ray actor that generates and receives weights) and :class:`HFServerAdapter` (in each
training worker: verl's weight sync). What each answers, LoRA and the limits: docs/verl-integration.md.
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

    ``config``: verl's ``RolloutConfig``; ``model_path``: verl's ``HFModelConfig.local_path``.
    """

    def __init__(self, config: Any, model_path: str, replica_rank: int, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        from verl_gigpo.local.server import LocalGenerationServer
        from verl_gigpo.rollout.vision import load_pretrained

        self.config = config
        self.replica_rank = replica_rank
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        # a model with a vision_config loads with AutoModelForImageTextToText and its processor
        model, processor = load_pretrained(model_path, trust_remote_code=trust_remote_code)
        #: the image processor of a vision-language model (None: a text model, image requests are refused)
        self.image_processor = processor.image_processor if processor is not None else None
        self.model = model
        max_batch = int(getattr(config, "max_num_seqs", 0) or 0)
        self.server = LocalGenerationServer(
            model,
            tokenizer,
            device="cpu",
            max_batch_size=max(1, min(max_batch, 256)) if max_batch else 64,
            seed=int(getattr(config, "seed", 0)) + replica_rank,  # replicas draw different streams
            image_processor=self.image_processor,
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

        Waits while the server sleeps. ValueError: video/audio input, images for a text model, a sampling parameter
        the local server cannot honour, or a prompt that leaves no room in the model's context.
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
        out = await self.server.generate(
            request_id, prompt_ids=list(prompt_ids), sampling_params=params, image_data=image_data or None
        )
        token_ids, log_probs = list(out.token_ids), list(out.log_probs)
        version = self.global_steps
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",  # eos and length both end a request normally (vLLM maps both the same way)
            extra_fields={"global_steps": version, "min_global_steps": version, "max_global_steps": version},
        )

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
        """Load the actor's full weights (HF names; tied ones may be absent) into the served model; returns the number
        loaded. ValueError for names that do not match the served model."""
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
        """Serve the base weights with a LoRA adapter merged, ``W' = W + s B A`` in float32 (:func:`merge_lora`);
        ``adapter``: peft names, full tensors; ``peft_config``: peft's ``LoraConfig`` as a dict. Returns the layers
        merged; on an error (ValueError / NotImplementedError) the served weights are unchanged."""
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
        """Hold (or, with ``reject_request``, fail) new requests until :meth:`resume_generation`; none are aborted."""
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
    """In-worker side of the ``hf`` backend: verl's weight sync and sleep/wake calls, forwarded to the replica's server
    by its first rank (``update_weights`` runs on every rank: the all-gathers are collectives)."""

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
        """Drain ``weights`` (on every rank) and load them into this replica's server: full weights, or with an
        unmerged LoRA adapter the base weights once and then the adapter alone (``base_sync_done``).
        NotImplementedError for a wire format other than full named tensors."""
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
