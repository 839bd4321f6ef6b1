"""A dead Ray actor behind verl's error (verl_gigpo.verl_glue.dead_actor). Ray's own ``ActorDiedError`` (built from the
context Ray's core worker fills in when an actor's process dies), nested in ``RayTaskError``s as Ray nests it through
the actors that waited on it, gives one line naming the innermost dead process and the checkpoint to resume from. And
(slow: a local Ray) the watch the trainer mode runs while verl waits for rollouts finds an actor killed with SIGKILL
in Ray's actor table."""

from __future__ import annotations

import os
import signal
import time

import pytest
from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from verl_gigpo.verl_glue.dead_actor import DeadActor, find_dead_actor, stop_message

REASON = (
    "The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT Worker exit "
    "detail: Worker unexpectedly exits with a connection error code 2. End of file."
)


def _died(class_name: str, pid: int, name: str = "") -> ActorDiedError:
    context = ActorDiedErrorContext(
        class_name=class_name,
        actor_id=bytes(16),
        pid=pid,
        name=name,
        ray_namespace="ns",
        node_ip_address="10.1.2.3",
        error_message=REASON,
    )
    return ActorDiedError(context)


def _waited_on(error: BaseException, actor: str) -> RayTaskError:
    """``error`` as the caller ``actor`` re-raises it: Ray's RayTaskError, cause and traceback text included."""
    try:
        raise error
    except BaseException as exc:  # noqa: BLE001 - wrapped exactly as Ray wraps a task's exception
        return RayTaskError(f"{actor}.run", f"Traceback (most recent call last):\n{exc}", exc, actor_repr=actor)


def test_the_innermost_dead_actor_is_named_through_nested_task_errors():
    server = _died("HFGenerationServer", 4242, "hf_server_0")
    # the rollout server died; the agent-loop worker awaiting it failed; the TaskRunner waiting on that failed
    nested = _waited_on(_waited_on(server, "AgentLoopWorkerTQ").as_instanceof_cause(), "TaskRunner")
    dead = find_dead_actor(nested.as_instanceof_cause())
    assert dead == DeadActor("HFGenerationServer", 4242, "hf_server_0", "10.1.2.3", REASON)
    assert dead.describe() == "hf rollout server (Ray actor HFGenerationServer hf_server_0, pid 4242, node 10.1.2.3)"


def test_a_dead_agent_loop_worker_raised_directly_is_found():
    dead = find_dead_actor(_died("AgentLoopWorkerTQ", 77, "agent_loop_worker_0_1a2b3c4d"))
    assert (dead.class_name, dead.pid, dead.role) == ("AgentLoopWorkerTQ", 77, "agent-loop worker")
    assert DeadActor("Foo", 5, "foo_1").describe() == "Ray actor Foo foo_1 (pid 5)"
    # verl's training workers are Ray actors of a class it builds in a function (Ray's class name keeps the path)
    assert DeadActor("create_colocated_worker_cls.<locals>.WorkerDict").role == "training worker (FSDP rank)"


@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory"), ValueError("The actor died")])
def test_errors_without_a_dead_actor_give_none(error):
    assert find_dead_actor(error) is None


# a DeathCause as Ray's actor table printed it for an actor whose node's processes were SIGKILLed (ids shortened)
NODE_DEATH = r"""actor_died_error_context {
  error_message: "The actor died because its node has died. Node Id: e4271f2f\n\tthe actor\'s node was lost"
  pid: 31657
  name: "far"
  class_name: "Far"
  node_death_info {
    reason: UNEXPECTED_TERMINATION
    reason_message: "health check failed due to missing too many heartbeats"
  }
  reason: NODE_DIED
}
"""


def test_the_death_reason_is_the_actors_not_its_nodes():
    from verl_gigpo.verl_glue.dead_actor import _detail, death_reason

    assert death_reason(NODE_DEATH) == "NODE_DIED"
    # the reason in the stop line: one line, Ray's escapes undone
    assert _detail(NODE_DEATH).endswith("has died. Node Id: e4271f2f the actor's node was lost")
    assert death_reason('actor_died_error_context {\n  error_message: "killed"\n  reason: RAY_KILL\n}\n') == "RAY_KILL"
    assert death_reason("") is None


def test_only_an_error_out_of_ray_waits_for_the_actor_table():
    """verl_gigpo.main asks Ray's actor table (up to TABLE_WAIT_S) only when a Ray error is in the chain."""
    from verl_gigpo.verl_glue.dead_actor import raised_by_ray

    assert not raised_by_ray(RuntimeError("a bug in the driver"))
    outer = RuntimeError("the trainer's call failed")
    outer.__cause__ = _waited_on(TimeoutError("no answer from the TransferQueue controller"), "TaskRunnerV1")
    assert raised_by_ray(outer)


def test_the_stop_message_names_the_process_and_the_checkpoint_to_resume_from(tmp_path):
    dead = DeadActor("AgentLoopWorkerTQ", 77, "agent_loop_worker_0_x", None, "worker died")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2\n")
    line = stop_message(dead, tmp_path)
    assert "\n" not in line and "agent-loop worker (Ray actor AgentLoopWorkerTQ agent_loop_worker_0_x, pid 77)" in line
    assert "trainer.resume_mode=auto" in line and f"{tmp_path / 'global_step_2'} (iteration 2)" in line
    assert "starts over" in stop_message(dead, tmp_path / "empty")


def test_an_unreachable_task_runner_is_named_when_its_node_left(tmp_path):
    """What the driver's ``ray.get`` on verl's TaskRunner raised when the node it ran on was killed
    (benchmarks/node_leaving.py): Ray's ActorUnavailableError, whose text names no class or pid."""
    reason = "The actor is temporarily unavailable: RpcError: Socket closed rpc_code: 14"
    error = ActorUnavailableError(reason, bytes(16))
    assert find_dead_actor(error).class_name == f"id {'00' * 16}"  # nobody said which actor the caller waited on
    dead = find_dead_actor(error, waited_on="TaskRunnerV1")
    assert dead.describe() == "trainer (verl's TaskRunner) (Ray actor TaskRunnerV1)"
    assert "Socket closed" in dead.detail and "node may have left" in dead.detail
    assert "may or may not have been executed" not in dead.detail
    # the TaskRunner alive, one of ITS calls found an actor unavailable (a rank on the node that left): that actor,
    # by id, on one line, not the TaskRunner
    via_runner = _waited_on(error, "TaskRunnerV1").as_instanceof_cause()
    inner = find_dead_actor(via_runner, waited_on="TaskRunnerV1")
    assert inner.describe() == f"Ray actor id {'00' * 16}" and "Socket closed" in inner.detail
    assert "\n" not in stop_message(inner, tmp_path) and "\x1b" not in stop_message(inner, tmp_path)
    # a described dead actor deeper in the chain still wins over the fallback
    nested = _waited_on(_died("WorkerDict", 9, "w_0:0"), "TaskRunnerV1").as_instanceof_cause()
    assert find_dead_actor(nested, waited_on="TaskRunnerV1").class_name == "WorkerDict"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2\n")
    line = stop_message(dead, tmp_path)
    assert "\n" not in line and "global_step_2 (iteration 2)" in line


@pytest.fixture(scope="module")
def ray_local():
    """Ray in this process: the one an earlier test file of this pytest worker left running (and leaves to it), or
    a local one started here and shut down after."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_the_watch_names_an_actor_killed_with_sigkill_and_the_error_reaches_the_driver(ray_local):
    """A real Ray actor (named like verl's agent-loop workers) gets SIGKILL: the watch reads Ray's actor table and
    raises DeadActorError, and that error, raised inside another actor as the trainer raises it inside verl's
    TaskRunner, reaches the driver as a RayTaskError that still names the dead process."""
    from verl_gigpo.verl_glue.dead_actor import ActorWatch, DeadActorError, dead_actor_in_job, guard_replay_buffer

    ray = ray_local

    class AgentLoopWorkerTQ:  # named as verl's agent-loop worker class (Ray reports the qualified name)
        __qualname__ = "AgentLoopWorkerTQ"

        def pid(self) -> int:
            return os.getpid()

    worker = ray.remote(AgentLoopWorkerTQ).options(name="agent_loop_worker_0_test").remote()
    pid = ray.get(worker.pid.remote())
    stopped = ray.remote(AgentLoopWorkerTQ).options(name="stopped_on_purpose").remote()
    ray.get(stopped.pid.remote())
    ray.kill(stopped)  # dead before the SIGKILL, but by the run's own hand: never reported
    watch = ActorWatch(lambda: [worker])
    watch.check()  # alive: nothing raised

    class Buffer:  # the two members of verl's ReplayBuffer that the guard wraps
        polls = 0

        def _wait_for_next_poll(self, partition_id, last_debug_time):
            self.polls += 1
            return last_debug_time

        def sample(self, global_steps, partition_id, batch_size):
            while True:  # verl's loop: no deadline
                self._wait_for_next_poll(partition_id, 0.0)

    buffer = guard_replay_buffer(Buffer(), watch)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while watch.dead() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    # the fallback for an error that names no actor: this job's actor that died unasked, from Ray's table
    in_job = dead_actor_in_job()
    assert (in_job.class_name, in_job.pid, in_job.name) == ("AgentLoopWorkerTQ", pid, "agent_loop_worker_0_test")
    with pytest.raises(DeadActorError, match=f"class_name: AgentLoopWorkerTQ\n\tpid: {pid}") as info:
        buffer.sample(1, "train", 4)
    assert buffer.polls == 0  # stopped before waiting

    @ray.remote
    class TaskRunner:
        def run(self, text: str) -> None:
            raise DeadActorError(text)

    with pytest.raises(Exception) as raised:  # as the driver's ray.get(runner.run.remote(config)) sees it
        ray.get(TaskRunner.remote().run.remote(str(info.value)))
    dead = find_dead_actor(raised.value)
    assert (dead.class_name, dead.pid, dead.name) == ("AgentLoopWorkerTQ", pid, "agent_loop_worker_0_test")
    assert "worker process has died" in dead.detail and "Some common causes" not in dead.detail
