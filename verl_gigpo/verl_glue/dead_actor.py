"""A process of a verl run that died (a Ray actor: SIGKILL, the OOM killer, a segfault): one line saying which and what
to do, instead of Ray's nested tracebacks.

:class:`ActorWatch` turns the hang of verl's rollout wait on a dead agent-loop worker or rollout server into
:class:`DeadActorError`; :func:`find_dead_actor` reads the dead actor from the error that reaches the driver, and
``python -m verl_gigpo.main`` ends with :func:`stop_message`. Why and how: docs/verl-integration.md ("A dead Ray
actor"); what a user sees: docs/runs.md ("A process dies").
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ROLES",
    "ActorWatch",
    "DeadActor",
    "DeadActorError",
    "dead_actor_in_job",
    "death_reason",
    "error_chain",
    "find_dead_actor",
    "guard_replay_buffer",
    "raised_by_ray",
    "stop_message",
]

logger = logging.getLogger(__name__)

#: what each actor class of a verl run is, in the message
ROLES = {
    "AgentLoopWorkerTQ": "agent-loop worker",
    "AgentLoopWorker": "agent-loop worker",
    "HFGenerationServer": "hf rollout server",
    "vLLMHttpServer": "vLLM rollout server",
    "SGLangHttpServer": "SGLang rollout server",
    "TaskRunner": "trainer (verl's TaskRunner)",
    "TaskRunnerV1": "trainer (verl's TaskRunner)",
    "WorkerDict": "training worker (FSDP rank)",
}

# Ray's ActorDiedError text (ray.exceptions.ActorDiedError): the base sentence, then one "\tkey: value" line each
_DIED = "The actor died unexpectedly before finishing this task."
# Ray's ActorUnavailableError text: "The actor <hex id> is unavailable: <reason>. The task may or may not ..."
_UNAVAILABLE = re.compile(r"The actor ([0-9a-f]+) is unavailable: (.*?)(?:\. The task may or may not|$)", re.M)
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
    def role(self) -> str | None:
        """What the actor was in the run (``agent-loop worker``, ``hf rollout server``, ...), None for another class.
        A class built inside a function is named by its last part (verl's ``create_colocated_worker_cls.<locals>.
        WorkerDict``)."""
        return ROLES.get(self.class_name.rsplit(".", 1)[-1])

    def describe(self) -> str:
        """``agent-loop worker (Ray actor AgentLoopWorkerTQ agent_loop_worker_0_1a2b, pid 123, node 10.0.0.2)``;
        ``Ray actor Foo foo_1 (pid 123)`` for a class not in :data:`ROLES`."""
        actor = f"Ray actor {self.class_name}{f' {self.name}' if self.name else ''}"
        where = [f"pid {self.pid}"] if self.pid is not None else []
        where += [f"node {self.ip}"] if self.ip else []
        if self.role is None:
            return f"{actor} ({', '.join(where)})" if where else actor
        return f"{self.role} ({', '.join([actor, *where])})"

    def ray_text(self) -> str:
        """The actor in the layout of Ray's ``ActorDiedError`` message (what :func:`find_dead_actor` reads)."""
        lines = [_DIED, f"\tclass_name: {self.class_name}"]
        lines += [f"\tpid: {self.pid}"] if self.pid is not None else []
        lines += [f"\tname: {self.name}"] if self.name else []
        lines += [f"\tip: {self.ip}"] if self.ip else []
        return "\n".join([*lines, self.detail or "The actor is dead."])


class DeadActorError(RuntimeError):
    """A Ray actor of the run was found dead by :class:`ActorWatch`; the message holds it in Ray's layout
    (:meth:`DeadActor.ray_text`), so it reaches the driver through Ray's task errors and is named there."""


#: the reason in the ``DeathCause`` text of Ray's actor table (``actor_died_error_context { error_message: "..." }``)
_CAUSE = re.compile(r'error_message: "((?:[^"\\]|\\.)*)"')


def _detail(cause: str) -> str:
    found = _CAUSE.search(cause or "")
    text = found.group(1) if found else ""
    text = text.split(" Some common causes include", 1)[0]  # Ray's generic advice: not about this process
    # the protobuf text escapes line breaks and quotes (a node's death: "... Node Id: ...\\n\\tthe ..."): one line
    text = " ".join(re.sub(r"\\[nt]", " ", text).replace("\\'", "'").replace('\\"', '"').split())
    return text if len(text) <= 240 else text[:239] + "…"


def _from_table(info: dict[str, Any]) -> DeadActor:
    """A dead actor from its row of Ray's actor table (``ray._private.state.actors``)."""
    return DeadActor(
        class_name=str(info.get("ActorClassName") or "?"),
        pid=int(info["Pid"]) if info.get("Pid") else None,
        name=info.get("Name") or None,
        ip=(info.get("Address") or {}).get("IPAddress") or None,
        detail=_detail(str(info.get("DeathCause") or "")),
    )


#: ``reason`` of a ``DeathCause`` for a process that died unasked (Ray's ``ActorDiedErrorContext.Reason``), the
#: first one the cause; ``ray.kill``, a dropped handle (``OUT_OF_SCOPE``, ``REF_DELETED``) are a run's own doing
_UNASKED = ("WORKER_DIED", "NODE_DIED", "OWNER_DIED")
# the context's own ``reason`` (two spaces in): a node's death nests ``node_death_info { reason: ... }`` deeper
_REASON = re.compile(r"^  reason: (\w+)$", re.M)


def death_reason(cause: str) -> str | None:
    """The ``reason`` of the actor in a ``DeathCause`` text of Ray's actor table (``WORKER_DIED``, ``NODE_DIED``,
    ``RAY_KILL``, ...: Ray's ``ActorDiedErrorContext.Reason``), not the nested reason of its node's death; None when
    the text has none."""
    found = _REASON.search(cause or "")
    return found.group(1) if found else None


def dead_actor_in_job(*, wait_s: float = 0.0, poll_s: float = 0.25) -> DeadActor | None:
    """The actor of this driver's Ray job that died unasked, from Ray's actor table, read every ``poll_s`` for up to
    ``wait_s`` seconds; None when none did (or Ray is not running here)."""
    import ray
    from ray._private import state

    if not ray.is_initialized():
        return None
    job = ray.get_runtime_context().get_job_id()
    deadline = time.monotonic() + wait_s
    while True:
        candidates = []
        for info in state.actors().values():
            if info.get("JobID") != job or info.get("State") != "DEAD":
                continue
            reason = death_reason(str(info.get("DeathCause") or ""))
            if reason in _UNASKED:
                candidates.append((reason == "OWNER_DIED", info.get("EndTime") or math.inf, info))
        if candidates:
            return _from_table(min(candidates, key=lambda c: c[:2])[2])
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


class ActorWatch:
    """Whether the Ray actors of ``handles()`` (agent-loop workers, rollout servers) are alive, from Ray's actor
    table; :meth:`check` raises :class:`DeadActorError` for a dead one."""

    def __init__(self, handles: Callable[[], Iterable[Any]], *, every_s: float = 1.0):
        self.handles, self.every_s = handles, every_s
        self._last = -math.inf

    def dead(self) -> DeadActor | None:
        """The first watched actor that Ray's actor table says is DEAD, or None."""
        from ray._private import state

        for handle in self.handles():
            info = state.actors(actor_id=handle._actor_id.hex())
            if info and info.get("State") == "DEAD":
                return _from_table(info)
        return None

    def check(self, *, force: bool = True) -> None:
        """Raise :class:`DeadActorError` when a watched actor is dead. Without ``force``, at most one look at Ray's
        table per ``every_s`` seconds (verl's buffer may poll every 0.1 s); the other calls return at once."""
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        dead = self.dead()
        if dead is not None:
            logger.error("a process of the run died: the %s", dead.describe())
            raise DeadActorError(
                "a process of the run died while the trainer waited for rollouts "
                "(verl_gigpo.verl_glue.dead_actor.ActorWatch)"
                f"\n{dead.ray_text()}"
            )


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


def error_chain(error: BaseException) -> list[BaseException]:
    """``error`` and every exception behind it (``__context__``, ``__cause__``, and ``cause``: the exception a
    ``RayTaskError`` carries from the task that raised it), each once, ``error`` first."""
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
    return chain


def raised_by_ray(error: BaseException) -> bool:
    """Whether ``error`` or an exception behind it is one of Ray's (a remote task's, an actor's, a lost object's):
    the errors ``verl_gigpo.main`` checks against Ray's actor table (:func:`dead_actor_in_job`)."""
    from ray.exceptions import RayError

    return any(isinstance(exc, RayError) for exc in error_chain(error))


def find_dead_actor(error: BaseException, *, waited_on: str | None = None) -> DeadActor | None:
    """The dead Ray actor behind ``error`` (out of verl's ``main_ppo``; the innermost cause wins), or None.

    Failing that, an ``ActorUnavailableError`` in the chain, named ``waited_on`` (the class the caller's own
    ``ray.get`` waited on) when ``error`` is that error, else by its actor id.
    """
    from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

    chain = error_chain(error)
    found = None
    for exc in chain:  # outermost first: a later (deeper) description replaces an earlier one
        if isinstance(exc, RayActorError | DeadActorError) or _DIED in str(exc):
            found = _parse(str(exc)) or found
    unavailable = [exc for exc in chain if isinstance(exc, ActorUnavailableError)]
    if found is None and unavailable:
        described = _UNAVAILABLE.search(str(unavailable[-1]))
        actor_id, reason = described.groups() if described else ("?", "unavailable")
        detail = f"unavailable: {reason.strip()}; its node may have left the Ray cluster"
        direct = unavailable[-1] is error and not isinstance(error, RayTaskError)
        if direct and waited_on is not None:
            found = DeadActor(class_name=waited_on, detail=detail)
        else:
            found = DeadActor(class_name=f"id {actor_id}", detail=detail)
    return found


def stop_message(dead: DeadActor, experiment_dir: str | Path) -> str:
    """The line a launch ends with when ``dead`` died: which process, that the run stopped, and how to resume from
    the last complete checkpoint of ``experiment_dir`` (``trainer.default_local_dir``)."""
    from verl_gigpo.config.resume import POINTER

    folder = Path(experiment_dir)
    pointer = folder / POINTER
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


def guard_replay_buffer(buffer: Any, watch: ActorWatch) -> Any:
    """Make verl's replay buffer call ``watch.check()`` before each poll of TransferQueue and before and after each
    ``sample`` (both wrapped on the instance); returns ``buffer``."""
    from verl_gigpo.verl_glue.contract import check_contract

    check_contract(__name__)  # verl's sample still polls through _wait_for_next_poll
    wait, sample = buffer._wait_for_next_poll, buffer.sample

    def checked_wait(*args: Any, **kwargs: Any) -> Any:
        watch.check(force=False)
        return wait(*args, **kwargs)

    def checked_sample(*args: Any, **kwargs: Any) -> Any:
        watch.check()  # one that died since the last look stops the iteration before any wait
        result = sample(*args, **kwargs)
        watch.check()
        return result

    buffer._wait_for_next_poll, buffer.sample = checked_wait, checked_sample
    return buffer
