"""Serve verl's agent-loop workers from an in-process Hugging Face model (no vLLM/SGLang): CPU debugging and tests.

verl's agent-loop workers call ``await llm_client.generate(request_id, prompt_ids=..., sampling_params=...)`` and
expect a :class:`verl.workers.rollout.replica.TokenOutput`. :class:`LocalLLMClient` answers that call with the
project's :class:`verl_gigpo.local.server.LocalGenerationServer`. It is picklable (only the model path travels),
so it can be handed to a Ray actor such as ``AgentLoopWorkerTQ``; the model is loaded on first use inside the
process that generates::

    client = LocalLLMClient(model_dir, max_tokens=32)
    worker = AgentLoopWorkerTQ.remote(config, client)

It reports a fixed weight version (``weight_version``) in ``extra_fields`` the way verl's servers report theirs.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LocalLLMClient"]

#: sampling keys verl's agent-loop workers send that the local server has no use for, with the only value accepted
_NEUTRAL_PARAMS = {"repetition_penalty": 1.0}


class LocalLLMClient:
    """A picklable stand-in for verl's ``LLMServerClient`` backed by :class:`LocalGenerationServer`.

    Args:
        model_path: a Hugging Face model folder (loaded with ``from_pretrained``, offline).
        max_tokens: generation cap used when the request does not say (verl's workers leave it to the server,
            which uses ``rollout.response_length``).
        weight_version: the ``global_steps`` version reported with every output.
        device: torch device of the model.
    """

    def __init__(self, model_path: str, *, max_tokens: int = 64, weight_version: int = 0, device: str = "cpu"):
        self.model_path = str(model_path)
        self.max_tokens = int(max_tokens)
        self.weight_version = int(weight_version)
        self.device = device
        self._server: Any = None
        self._lock: asyncio.Lock | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_server"] = None
        state["_lock"] = None
        return state

    async def _get_server(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._server is None:
                from transformers import AutoModelForCausalLM, AutoTokenizer

                from verl_gigpo.local.server import LocalGenerationServer

                tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                model = AutoModelForCausalLM.from_pretrained(self.model_path)
                self._server = LocalGenerationServer(model, tokenizer, device=self.device)
        return self._server

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        """Generate for one request; returns verl's ``TokenOutput`` (token ids, log-probs, stop reason, versions).

        Raises:
            ValueError: a sampling parameter the local server cannot honour (e.g. repetition_penalty != 1).
        """
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        for key, neutral in _NEUTRAL_PARAMS.items():
            if key in params:
                value = params.pop(key)
                if value != neutral:
                    raise ValueError(f"LocalLLMClient cannot apply {key}={value!r} (only {neutral!r})")
        params.setdefault("max_tokens", self.max_tokens)
        if params.get("top_k") is None:
            params.pop("top_k", None)
        server = await self._get_server()
        out = await server.generate(request_id, prompt_ids=list(prompt_ids), sampling_params=params)
        version = self.weight_version
        return TokenOutput(
            token_ids=list(out.token_ids),
            log_probs=list(out.log_probs) if out.log_probs is not None else None,
            stop_reason="completed",
            extra_fields={"global_steps": version, "min_global_steps": version, "max_global_steps": version},
        )
