"""verl's pipeline on two Ray nodes: a Ray head and a second node started on this machine as separate ``ray start``
processes, each with its own logical CPUs and one logical GPU, and ``python -m verl_gigpo.main platform=cpu
trainer.nnodes=2 trainer.n_gpus_per_node=1`` joining them (``RAY_ADDRESS``) for GiGPO iterations with the ``hf``
rollout, two agent-loop workers and environments in environment worker processes. After iteration 2's checkpoint
the second node leaves (SIGKILL to all its processes, as when a machine fails) in the middle of iteration 3.

Where the work ran is read from Ray's own state (the cluster's GCS node and actor tables, dead actors included,
queried while the cluster lives: ``tests/helpers/ray_actor_table.py``), not from our logs: the FSDP ranks, the
rollout servers (one replica per rank) and the agent-loop workers each ran on both nodes, and the environment worker
processes (children of the agent-loop workers, which record their parent's pid: ``tests/helpers/gigpo_pid_env.py``)
ran under agent-loop workers of both nodes. The metrics file holds both iterations with the ``gigpo/*``, ``env/*``
and ``episode/*`` keys, and the rollout-vs-actor gap is within :data:`verl_gigpo.dev.smoke.ROLLOUT_GAP_LIMIT`.
The node's leaving stops the launch by itself, within seconds, with one line naming a dead process of the run and
the checkpoint to resume from (``benchmarks/node_leaving.py`` also relaunches on one node and resumes). A launch
asking for a third node stops before verl starts, naming the cluster's nodes and what to do
(:func:`verl_gigpo.verl_glue.cluster.check_cluster`).

The nodes run in their own process groups (``ray start --block``) and are stopped by signalling those groups, never
with ``ray stop``, which stops every Ray on the machine. One training launch, about 3 minutes on 2 cores. A Ray node
needs its dashboard agent up within Ray's own ~15-30 s start-up waits (not configurable): on a machine whose cores
are taken by other work (load 7-10 on 2 cores, this test at ``nice 10``) the nodes fail to start and the test errors
in its fixture with the node's log.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest
from ray_nodes import HELPERS, ROOT, prepare_launch, two_ray_nodes  # tests/helpers (pytest's pythonpath)

from verl_gigpo.dev.smoke import (
    ROLLOUT_GAP_LIMIT,
    STOP_BOUND_S,
    checkpointed_and_logged,
    pipeline_overrides,
    run_pipeline,
)
from verl_gigpo.verl_glue.metrics_file import training_steps

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """A Ray head and one more node on this machine (:func:`ray_nodes.two_ray_nodes`); yields the head's address and
    the nodes ``[head, second]``."""
    with two_ray_nodes() as (address, nodes):
        yield address, nodes


@pytest.fixture(scope="module")
def two_node_run(cluster, action_model_dir, tmp_path_factory):
    """One launch of 4 GiGPO iterations on the two nodes whose second node leaves (SIGKILL to all its processes, as
    when a machine fails) once iteration 2's checkpoint and metrics are written, and Ray's record of its actors and
    the nodes, read while the head lives: ``(run, actors, nodes, env_pids, refused, node_left)``; ``refused`` is a
    launch asking for 3 nodes; ``node_left``: when the node was killed (seconds into the launch) and how long the
    launch went on after it (None: still running :data:`~verl_gigpo.dev.smoke.STOP_BOUND_S` later, then killed)."""
    from gigpo_pid_env import recorded_pids

    address, ray_nodes = cluster
    out = tmp_path_factory.mktemp("multinode")
    records, extra = prepare_launch(out)
    common = {"model_dir": action_model_dir, "data_dir": out / "data", "estimator": "gigpo", "ranks": 1}
    env = {
        "RAY_ADDRESS": address,
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(HELPERS))),
    }
    # a third node does not exist: refused on the driver, before verl or Ray's placement groups start
    refused = run_pipeline(
        "refused",
        out / "refused",
        pipeline_overrides(
            run_dir=out / "refused",
            total_steps=2,
            save_freq=-1,
            val_before_train=False,
            extra=[*extra, "trainer.nnodes=3"],  # 3 x 1 logical GPU: one more than the cluster holds
            **common,
        ),
        env=env,
        timeout=300,
    )
    checkpointed = checkpointed_and_logged(out / "two_nodes", 2)
    killed_at: list[float] = []

    def second_node_leaves() -> None:
        while not checkpointed():
            time.sleep(0.5)
        killed_at.append(time.time())
        os.killpg(ray_nodes[1].proc.pid, signal.SIGKILL)

    threading.Thread(target=second_node_leaves, daemon=True).start()
    run = run_pipeline(
        "two_nodes",
        out / "two_nodes",
        pipeline_overrides(
            run_dir=out / "two_nodes",
            total_steps=4,  # the node leaves in iteration 3
            save_freq=2,
            val_before_train=False,
            extra=[*extra, "trainer.nnodes=2"],
            **common,
        ),
        env=env,
        timeout=900,
        stop_when=lambda: bool(killed_at) and time.time() - killed_at[0] > STOP_BOUND_S,
    )
    ended = run.started + run.seconds
    node_left = SimpleNamespace(
        at_s=killed_at[0] - run.started if killed_at else None,
        stopped_after_s=None if run.killed or not killed_at else ended - killed_at[0],
    )
    query = [sys.executable, str(HELPERS / "ray_actor_table.py"), address]
    printed = subprocess.run(query, capture_output=True, text=True, check=True, timeout=300).stdout
    found = json.loads(printed.strip().splitlines()[-1])  # the table is the last line, whatever Ray printed before
    nodes = [SimpleNamespace(**n) for n in found["nodes"]]
    actors = [SimpleNamespace(**a) for a in found["actors"]]
    return run, actors, nodes, recorded_pids(records), refused, node_left


def _nodes_of(actors, predicate) -> dict[str, set[str]]:
    found = defaultdict(set)
    for actor in actors:
        if predicate(actor):
            found[actor.class_name].add(actor.node_id)
    return dict(found)


def test_the_launch_trains_two_iterations_on_the_two_node_cluster(two_node_run):
    run, _, nodes, _, _, node_left = two_node_run
    assert node_left.at_s is not None, "\n".join(run.output.splitlines()[-60:])  # iteration 2 was checkpointed
    # both nodes joined (the table is read seconds after the second one left: Ray's health check may not have
    # marked it dead yet)
    assert len(nodes) == 2 and sum(n.is_head for n in nodes) == 1
    assert re.search(r"\[verl_gigpo\] Ray cluster at [\d.]+:\d+: 2 live node\(s\)", run.output)
    # joining, the CPU platform's node settings are not passed to Ray (it refuses them), the nodes' own count
    [kwargs] = [line for line in run.output.splitlines() if line.startswith("ray init kwargs:")]
    assert "'num_cpus': None" in kwargs and "'num_gpus': None" in kwargs


def test_fsdp_ranks_rollout_servers_and_agent_loop_workers_ran_on_both_nodes(two_node_run):
    run, actors, nodes, *_ = two_node_run
    both = {n.node_id for n in nodes}
    job = {a.job_id for a in actors if a.class_name == "HFGenerationServer"}
    assert len(job) == 1, job  # one launch on this cluster
    ours = [a for a in actors if a.job_id in job]
    by_class = defaultdict(list)
    for actor in ours:
        by_class[actor.class_name].append(actor)
    head = next(n.node_id for n in nodes if n.is_head)
    summary = {
        cls: sorted((a.name, a.node_id[:8] + (" (head)" if a.node_id == head else "")) for a in group)
        for cls, group in by_class.items()
    }
    print(json.dumps(summary, indent=1))  # the closing note's node ids (pytest -s)
    # verl names each rank's actor <prefix><class>_<placement group>:<local rank>; one group per node
    ranks = [a for a in ours if re.search(r"_(\d+):(\d+)$", a.name or "")]
    assert len(ranks) == 2 and {a.node_id for a in ranks} == both, summary
    assert {re.search(r"_(\d+):\d+$", a.name).group(1) for a in ranks} == {"0", "1"}
    servers = by_class["HFGenerationServer"]
    assert len(servers) == 2 and {a.node_id for a in servers} == both, summary
    loops = by_class["AgentLoopWorkerTQ"]
    assert len(loops) == 2 and {a.node_id for a in loops} == both, summary


def test_environment_worker_processes_ran_under_agent_loop_workers_of_both_nodes(two_node_run):
    _, actors, nodes, env_pids, *_ = two_node_run
    both = {n.node_id for n in nodes}
    loop_node = {a.pid: a.node_id for a in actors if a.class_name == "AgentLoopWorkerTQ"}
    hosted = {pid: loop_node[parent] for pid, parent in env_pids if parent in loop_node}
    assert hosted, f"no environment worker process under an agent-loop worker: {env_pids} vs {loop_node}"
    assert set(hosted.values()) == both
    assert all(pid not in loop_node for pid in hosted)  # processes of their own, not the agent-loop workers


def test_metrics_hold_both_iterations_with_gigpo_and_env_keys_and_a_small_rollout_gap(two_node_run):
    run = two_node_run[0]
    rows = [m for m in run.metrics if "actor/pg_loss" in m]
    assert training_steps(rows) == [1, 2]
    for row in rows:
        for key in ("gigpo/step_group_size_mean", "gigpo/num_masked_rows", "env/success_rate", "env/env_error_rate"):
            assert isinstance(row.get(key), int | float) and math.isfinite(row[key]), (row["step"], key)
        assert row["episode/num_step_rows"] > 0 and row["env/env_error_rate"] == 0
        assert row["actor/grad_norm"] > 0
    gap = rows[0]["training/rollout_probs_diff_max"]  # the launch's first iteration: the actor pass on both ranks
    assert gap <= ROLLOUT_GAP_LIMIT, gap


def test_a_launch_asking_for_more_nodes_than_the_cluster_has_stops_before_verl_starts(two_node_run):
    refused = two_node_run[4]
    assert refused.returncode == 1 and "Traceback" not in refused.output
    [error] = [line for line in refused.output.splitlines() if line.startswith("error: ")]
    assert (
        error.startswith("error: Ray cluster at ") and ", 2 live node(s): the Ray cluster has 2 GPU(s) in all" in error
    )
    assert "trainer.nnodes=3 x trainer.n_gpus_per_node=1" in error and "needs 3" in error
    assert "ray init kwargs" not in refused.output  # verl's run_ppo never started


def test_a_node_leaving_stops_the_run_with_one_line_naming_the_process_and_the_checkpoint(two_node_run):
    """The second node's processes (its FSDP rank, rollout server, agent-loop worker, maybe verl's TaskRunner) die in
    iteration 3: the launch stops by itself, soon, with one ``error:`` line naming a process of the run and the
    checkpoint a relaunch resumes from (``benchmarks/node_leaving.py`` relaunches on one node: it resumes)."""
    run, *_, node_left = two_node_run
    assert node_left.stopped_after_s is not None, "still running STOP_BOUND_S after the node left: a hang"
    print(
        f"node killed {node_left.at_s:.1f} s into the launch; the launch ended {node_left.stopped_after_s:.1f} s later"
    )
    tail = "\n".join(run.output.splitlines()[-80:])
    assert run.returncode == 1, tail
    errors = [line for line in run.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, tail
    [error] = errors
    assert error.startswith("error: a process of the run died: the "), error
    assert "global_step_2 (iteration 2)" in error and "trainer.resume_mode=auto" in error
    assert training_steps([m for m in run.metrics if "actor/pg_loss" in m]) == [1, 2]
