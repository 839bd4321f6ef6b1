"""A process of a verl run that died (a Ray actor: SIGKILL, the OOM killer, a segfault): one line saying which and what
to do, instead of Ray's nested tracebacks.

verl does not replace a dead actor. Its driver waits on the actors with ``ray.get`` (the agent-loop manager on its
workers, ``AgentLoopManagerTQ.generate_sequences``; the agent loops await the rollout server,
``LLMServerClient.generate``; the trainer on its worker groups), and Ray raises ``ActorDiedError`` there as soon as
the actor's process is gone. The error travels up as a ``RayTaskError`` through every actor that waited on it
(agent-loop worker, TaskRunner) to ``main_ppo.run_ppo`` in the driver. :func:`find_dead_actor` reads the innermost
dead actor from that error (Ray writes ``class_name``, ``pid``, ``name``, ``ip`` into its message);
``python -m verl_gigpo.main`` then stops with :func:`stop_message` and exit status 1, and a relaunch with
``trainer.resume_mode=auto`` resumes from the last checkpoint (docs/runs.md, "A process dies").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROLES", "DeadActor", "find_dead_actor", "stop_message"]

#: what each actor class of a verl run is, in the message
ROLES = {
    "AgentLoopWorkerTQ": "agent-loop worker",
    "AgentLoopWorker": "agent-loop worker",
    "HFGenerationServer": "hf rollout server",
    "vLLMHttpServer": "vLLM rollout server",
    "SGLangHttpServer": "SGLang rollout server",
    "TaskRunner": "verl's TaskRunner (the trainer)",
    "WorkerDict": "training worker (FSDP rank)",
}

# Ray's ActorDiedError text (ray.exceptions.ActorDiedError): the base sentence, then one "\tkey: value" line each
_DIED = "The actor died unexpectedly before finishing this task."
_FIELD = re.compile(r"^\s*(class_name|actor_id|pid|name|namespace|ip): (.*)$")


@dataclass(frozen=True)
class DeadActor:
    """A Ray actor that died: its class, process id, actor name and node address as Ray reported them (``None``
    when Ray did not say), and Ray's reason (``detail``: its first line after the fields)."""

    class_name: str
    pid: int | None = None
    name: str | None = None
    ip: str | None = None
    detail: str = ""

    @property
    def role(self) -> str:
        """What the actor was in the run (``agent-loop worker``, ``hf rollout server``, ...), else its class."""
        return ROLES.get(self.class_name, f"Ray actor {self.class_name}")

    def describe(self) -> str:
        """``agent-loop worker (Ray actor AgentLoopWorkerTQ agent_loop_worker_0_1a2b, pid 123, node 10.0.0.2)``."""
        parts = [f"Ray actor {self.class_name}{f' {self.name}' if self.name else ''}"]
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        if self.ip:
            parts.append(f"node {self.ip}")
        return f"{self.role} ({', '.join(parts)})"


def _parse(text: str) -> DeadActor | None:
    """The LAST dead actor described in ``text`` (the innermost cause in Ray's nested task errors), or None."""
    start = text.rfind(_DIED)
    if start < 0:
        return None
    fields: dict[str, str] = {}
    detail = ""
    for line in text[start + len(_DIED) :].splitlines()[1:]:
        found = _FIELD.match(line)
        if found and found.group(1) not in fields:
            fields[found.group(1)] = found.group(2).strip()
        elif fields and line.strip():
            detail = line.strip()
            detail = detail if len(detail) <= 240 else detail[:239] + "…"
            break
    if "class_name" not in fields:
        return None
    pid = fields.get("pid", "")
    return DeadActor(
        class_name=fields["class_name"],
        pid=int(pid) if pid.isdigit() else None,
        name=fields.get("name") or None,
        ip=fields.get("ip") or None,
        detail=detail,
    )


def find_dead_actor(error: BaseException) -> DeadActor | None:
    """The dead Ray actor behind ``error`` (an exception out of verl's ``main_ppo``), or None when no actor died.

    Looks at ``error`` and its causes (``RayTaskError.cause``, ``__cause__``, ``__context__``); among the texts
    that describe a dead actor (``ray.exceptions.ActorDiedError``), the innermost cause wins: the actor whose death
    made the others fail.
    """
    from ray.exceptions import RayActorError

    seen: set[int] = set()
    chain: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        chain.append(exc)
        todo.extend([exc.__context__, exc.__cause__, getattr(exc, "cause", None)])
    found = None
    for exc in chain:  # outermost first: a later (deeper) description replaces an earlier one
        if isinstance(exc, RayActorError) or _DIED in str(exc):
            found = _parse(str(exc)) or found
    return found


def stop_message(dead: DeadActor, experiment_dir: str | Path) -> str:
    """The line a launch ends with when ``dead`` died: which process, that the run stopped, and how to resume from
    the last complete checkpoint of ``experiment_dir`` (``trainer.default_local_dir``)."""
    folder = Path(experiment_dir)
    pointer = folder / "latest_checkpointed_iteration.txt"
    step = pointer.read_text().strip() if pointer.is_file() else ""
    if step.isdigit():
        resume = f"resumes from its last checkpoint, {folder / f'global_step_{step}'} (iteration {step}), with"
    else:
        resume = f"finds no complete checkpoint in {folder} yet and starts over, with"
    reason = f" ({dead.detail})" if dead.detail else ""
    return (
        f"a process of the run died: the {dead.describe()}{reason}. verl does not replace a dead process, so the "
        f"run stopped. Relaunch the same command with trainer.resume_mode=auto (the default): it {resume} the "
        "metrics history kept (docs/runs.md, 'A process dies')"
    )
