"""A node leaving mid-run: two Ray nodes, the second one killed after iteration 2's checkpoint, then a relaunch on
one node that resumes.

1. Two Ray nodes on this machine (``tests/helpers/ray_nodes.py``, 1 logical GPU each) and ``python -m
   verl_gigpo.main platform=cpu trainer.nnodes=2 trainer.n_gpus_per_node=1`` joining them for 4 GiGPO iterations
   with a checkpoint after each (the two-node test's settings otherwise).
2. Once iteration 2's checkpoint and metrics are written, every process of the second node gets SIGKILL (its
   ``ray start`` process group: the raylet, its workers, the FSDP rank, the rollout server and the agent-loop worker
   it hosts), as when a machine fails. The script records whether the launch stops by itself, how long after the
   kill, and its last ``error:`` line; a launch still running 300 s after the kill counts as a hang and is killed.
3. The same experiment relaunched on one node (``trainer.nnodes=1 trainer.n_gpus_per_node=2``: the same 2 ranks,
   its own local Ray) with ``trainer.resume_mode=auto``: it must resume from the last complete checkpoint and end
   with iterations 1-4 once each in ``metrics.jsonl``.

    python benchmarks/node_leaving.py [--out runs/node_leaving]

About 8 minutes on 2 cores. Prints a summary; ``OUT/summary.json`` holds it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from ray_nodes import HELPERS, benchmark_folder, launch_overrides, two_ray_nodes  # noqa: E402

from verl_gigpo.dev.smoke import checkpointed_and_logged, run_pipeline  # noqa: E402
from verl_gigpo.verl_glue.metrics_file import training_steps  # noqa: E402

#: seconds a launch may go on after the node's death before it counts as a hang
HANG_BOUND_S = 300.0


def _overrides(out: Path, extra: list[str], *, ranks: int, nnodes: int) -> list[str]:
    return launch_overrides(out, out / "run", extra, ranks=ranks, nnodes=nnodes, total_steps=4, save_freq=1)


def main(argv: list[str] | None = None) -> int:
    """Run the experiment and print its summary; returns 0 when the relaunch resumed and holds iterations 1-4 once,
    1 otherwise."""
    out, extra = benchmark_folder(__doc__, "runs/node_leaving", argv)
    pythonpath = {"PYTHONPATH": os.pathsep.join((str(ROOT), str(HELPERS)))}
    run_dir = out / "run"
    killed_at: list[float] = []
    with two_ray_nodes() as (address, nodes):
        second = nodes[1]
        ready = checkpointed_and_logged(run_dir, 2)

        def kill_second_node() -> None:
            while not ready():
                time.sleep(0.5)
            killed_at.append(time.time())
            os.killpg(second.proc.pid, signal.SIGKILL)

        threading.Thread(target=kill_second_node, daemon=True).start()
        start = time.time()
        first = run_pipeline(
            "two_nodes",
            run_dir,
            _overrides(out, extra, ranks=1, nnodes=2),
            env={**pythonpath, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"},
            stop_when=lambda: bool(killed_at) and time.time() - killed_at[0] > HANG_BOUND_S,
            timeout=1800,
        )
        ended = start + first.seconds
    errors = [line for line in first.output.splitlines() if line.startswith("error: ")]
    resumed = run_pipeline("one_node", run_dir, _overrides(out, extra, ranks=2, nnodes=1), env=pythonpath)
    steps = training_steps(resumed.history)
    summary = {
        "node_killed_after_s": round(killed_at[0] - start, 1) if killed_at else None,
        "two_node_launch": {
            "exit": first.returncode,
            "hung": first.killed,
            "stopped_after_kill_s": round(ended - killed_at[0], 1) if killed_at and not first.killed else None,
            "error_line": errors[-1] if errors else None,
            "last_output": first.output.strip().splitlines()[-5:],
        },
        "one_node_relaunch": {
            "exit": resumed.returncode,
            "resumed_from": next((ln for ln in resumed.output.splitlines() if "resum" in ln.lower()), None),
            "iterations_in_metrics": steps,
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0 if resumed.returncode == 0 and steps == [1, 2, 3, 4] else 1


if __name__ == "__main__":
    raise SystemExit(main())
