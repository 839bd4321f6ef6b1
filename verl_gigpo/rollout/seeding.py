"""Seeds of generation requests: one per (rollout seed, stream, task, member of the group, step), on both engines.

Two runs validated with one rollout seed then play every validation task with the same random numbers (common
random numbers), and a resumed run plays the episodes an uninterrupted one would. docs/reproducibility.md says what
each rollout backend makes of the seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_gigpo.rollout.types import TaskSpec

__all__ = [
    "DRAW_FIELD",
    "EpisodeSeeds",
    "VALIDATION_STREAM",
    "request_seed",
    "seed_param",
    "seeded_sampling_from",
    "training_stream",
]

#: the stream of validation and evaluation: it names no iteration, so every validation of a run (and of any other
#: run with the same rollout seed) plays a task's members with the same seeds
VALIDATION_STREAM = "val"

#: the task-row field that numbers an iteration's training draws on verl's path (the trainer mode adds it to every
#: training row it submits; validation rows have none)
DRAW_FIELD = "gigpo_draw"

#: dev only (``make e2e``): the agent loop returns episodes whose stream starts with this variable's value
#: :data:`HOLD_S` seconds after their transcript is written, so the smoke's kill of the agent-loop worker lands while
#: that rollout still runs (docs/cpu-smoke.md)
HOLD_STREAM_ENV = "GIGPO_DEV_HOLD_STREAM"
HOLD_S = 120.0

#: sampling parameter that carries a request's seed, by ``actor_rollout_ref.rollout.name`` (others: ``seed``)
_SEED_PARAMS = {"sglang": "sampling_seed"}

#: seeds lie in [0, 2**31): every backend takes them (vLLM, SGLang, torch generators)
_SEED_BITS = 31


def training_stream(iteration: int, draw: int) -> str:
    """The stream of training iteration ``iteration`` (verl's ``global_steps``, from 1), task draw ``draw`` (the
    task's index among the iteration's draws; a later dynamic-sampling round continues the count), so two draws of
    one task in one iteration play different episodes."""
    return f"train:{int(iteration)}:{int(draw)}"


def request_seed(rollout_seed: int, stream: str, task: TaskSpec, member: int, step: int) -> int:
    """The seed of one generation request: a stable hash (BLAKE2b, not Python's ``hash``) of
    ``(rollout_seed, stream, task.env_name, task.split, task.seed, member, step)``, in [0, 2**31)."""
    text = f"{int(rollout_seed)}|{stream}|{task.env_name}|{task.split}|{int(task.seed)}|{int(member)}|{int(step)}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def seed_param(rollout_name: str | None) -> str:
    """The sampling parameter a backend reads its seed from: ``sampling_seed`` for SGLang, ``seed`` otherwise
    (vLLM, the ``hf`` CPU backend, the local engine)."""
    return _SEED_PARAMS.get(str(rollout_name or ""), "seed")


def seeded_sampling_from(env: Mapping[str, Any] | None) -> bool:
    """``env.seeded_sampling`` (default true); ValueError when it is not a boolean."""
    value = (env or {}).get("seeded_sampling", True)
    if not isinstance(value, bool):
        raise ValueError(f"env.seeded_sampling must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class EpisodeSeeds:
    """The seeds of one episode's requests: member ``member`` of the group of ``task`` in ``stream``.

    ``param`` is the sampling parameter that carries the seed (:func:`seed_param`)."""

    rollout_seed: int
    stream: str
    task: TaskSpec
    member: int
    param: str = "seed"

    def at(self, step: int) -> int:
        """The seed of the request at step ``step`` (:func:`request_seed`)."""
        return request_seed(self.rollout_seed, self.stream, self.task, self.member, step)

    def sampling_params(self, params: Mapping[str, Any], step: int) -> dict[str, Any]:
        """``params`` with the seed of step ``step`` set (an advancing ``generator`` given by a caller is dropped:
        the seed replaces it)."""
        out = {k: v for k, v in params.items() if k != "generator"}
        out[self.param] = self.at(step)
        return out
