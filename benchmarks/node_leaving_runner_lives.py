"""A node leaving while verl's TaskRunner lives on: the case where the error that stops the trainer names no process.

On two Ray nodes the TaskRunner lands on the node that is then killed (``benchmarks/node_leaving.py``,
``tests/test_multinode.py``), and the driver's own call fails. Here a third node with CPUs only joins:

1. Three Ray nodes on this machine (``tests/helpers/ray_nodes.py``): the head and a second node with 1 logical GPU
   each, a third with none. ``python -m verl_gigpo.main platform=cpu trainer.nnodes=2 trainer.n_gpus_per_node=1``
   joins them for 4 GiGPO iterations with a checkpoint after iteration 2 (the two-node test's settings otherwise):
   the FSDP ranks go to the two GPU nodes; the TaskRunner, which needs a CPU only, may land on any node.
2. Once iteration 2's checkpoint and metrics are written, Ray's actor table says where the TaskRunner is, and every
   process of the second node gets SIGKILL. When the TaskRunner was not on the second node, the surviving rank's
   next collective fails with gloo's "Connection closed by peer", an error naming no process: ``verl_gigpo.main``
   then reads Ray's actor table (up to ``TABLE_WAIT_S``) and names a process of the node that left.
3. The script records where the TaskRunner was, whether the launch stopped by itself and how long after the kill,
   whether it consulted the actor table, and its ``error:`` lines; a launch still running 300 s after the kill
   counts as a hang and is killed.

    python benchmarks/node_leaving_runner_lives.py [--out runs/node_leaving_runner_lives]

About 4 minutes on 2 cores. Prints a summary; ``OUT/summary.json`` holds it. Exit status 0 when the TaskRunner
lived on and the launch stopped by itself with one ``error:`` line naming a process of the run, 2 when Ray put the
TaskRunner on the killed node (the case did not arise: run it again), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from ray_nodes import HELPERS, benchmark_folder, launch_overrides, ray_nodes  # noqa: E402

from verl_gigpo.dev.smoke import checkpointed_and_logged, run_pipeline  # noqa: E402

#: seconds a launch may go on after the node's death before it counts as a hang
HANG_BOUND_S = 300.0
#: the line ``verl_gigpo.main`` prints before it reads Ray's actor table
TABLE_LINE = "checking Ray's actor table"


def _actor_table(address: str) -> dict:
    """The cluster's nodes and actors, read by ``tests/helpers/ray_actor_table.py`` in a process of its own."""
    query = [sys.executable, str(HELPERS / "ray_actor_table.py"), address]
    printed = subprocess.run(query, capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(printed.strip().splitlines()[-1])


def _placement(table: dict) -> dict[str, str]:
    """Which node (head, second, third) holds verl's TaskRunner and TransferQueue controller. The second node is the
    one that is not the head and holds an FSDP rank (the ranks need the GPU nodes)."""
    head = next(n["node_id"] for n in table["nodes"] if n["is_head"])
    ranks = {a["node_id"] for a in table["actors"] if "WorkerDict" in a["class_name"]}
    second = next(iter(ranks - {head}), None)
    placed = {}
    for actor in table["actors"]:
        if actor["state"] == "ALIVE" and actor["class_name"] in ("TaskRunnerV1", "TransferQueueController"):
            node = actor["node_id"]
            placed[actor["class_name"]] = "head" if node == head else "second" if node == second else "third"
    return placed


def main(argv: list[str] | None = None) -> int:
    """Run the experiment and print its summary; the exit status is in the module docstring."""
    out, extra = benchmark_folder(__doc__, "runs/node_leaving_runner_lives", argv)
    run_dir = out / "run"
    overrides = launch_overrides(out, run_dir, extra, ranks=1, nnodes=2, total_steps=4, save_freq=2)
    placed: dict[str, str] = {}
    killed_at: list[float] = []
    with ray_nodes((1, 1, 0)) as (address, nodes):
        ready = checkpointed_and_logged(run_dir, 2)

        def kill_second_node() -> None:
            while not ready():
                time.sleep(0.5)
            placed.update(_placement(_actor_table(address)))
            killed_at.append(time.time())
            os.killpg(nodes[1].proc.pid, signal.SIGKILL)

        threading.Thread(target=kill_second_node, daemon=True).start()
        start = time.time()
        run = run_pipeline(
            "three_nodes",
            run_dir,
            overrides,
            env={
                "PYTHONPATH": os.pathsep.join((str(ROOT), str(HELPERS))),
                "RAY_ADDRESS": address,
                "RAY_AUTH_MODE": "disabled",
            },
            stop_when=lambda: bool(killed_at) and time.time() - killed_at[0] > HANG_BOUND_S,
            timeout=1800,
        )
        ended = start + run.seconds
    errors = run.error_lines()
    summary = {
        "placed": placed,
        "node_killed_after_s": round(killed_at[0] - start, 1) if killed_at else None,
        "exit": run.returncode,
        "hung": run.killed,
        "stopped_after_kill_s": round(ended - killed_at[0], 1) if killed_at and not run.killed else None,
        "consulted_actor_table": TABLE_LINE in run.output,
        "error_lines": errors,
        "last_output": run.output.strip().splitlines()[-5:],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if placed.get("TaskRunnerV1") == "second":
        print("Ray put the TaskRunner on the killed node: the case this script measures did not arise; run it again")
        return 2
    named = len(errors) == 1 and errors[0].startswith("error: a process of the run died: the ")
    return 0 if run.returncode == 1 and not run.killed and named else 1


if __name__ == "__main__":
    raise SystemExit(main())
