"""The two-node test's launch on one node and on two, side by side: the same metric keys and row counts?

``tests/test_multinode.py`` runs ``python -m verl_gigpo.main platform=cpu trainer.nnodes=2 trainer.n_gpus_per_node=1``
on two Ray nodes of this machine and reads where the work ran from Ray's state. This script runs that launch (the
same settings, tasks and seed; 2 GiGPO iterations) twice: on one node with 2 ranks (its own local Ray), and on two
Ray nodes with 1 rank each (``tests/helpers/ray_nodes.py``). It prints, per iteration, the step rows, success rate,
the count of ``gigpo/*``, ``env/*`` and ``episode/*`` keys, the rollout-vs-actor gap and the PG loss of each, and the
keys only one of them logged; the same table goes to ``OUT/compare.md``.

The two runs split the batch over the ranks in the same way (2 ranks either way) but sample their episodes
independently, so their values differ; their structure (keys, rows per iteration) should not.

    python benchmarks/multinode_compare.py [--out runs/multinode_compare]

About 6 minutes on 2 cores (two launches and two Ray nodes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from ray_nodes import HELPERS, benchmark_folder, launch_overrides, two_ray_nodes  # noqa: E402

from verl_gigpo.dev.smoke import run_pipeline  # noqa: E402

#: the key families compared by count
FAMILIES = ("gigpo/", "env/", "episode/")
#: the values shown per iteration
SHOWN = ("episode/num_step_rows", "env/success_rate", "training/rollout_probs_diff_max", "actor/pg_loss")


def _launch(name: str, out: Path, extra: list[str], *, ranks: int, nnodes: int, env: dict[str, str]):
    run_dir = out / name
    overrides = launch_overrides(out, run_dir, extra, ranks=ranks, nnodes=nnodes, total_steps=2, save_freq=-1)
    run = run_pipeline(name, run_dir, overrides, env={"PYTHONPATH": os.pathsep.join((str(ROOT), str(HELPERS))), **env})
    if run.returncode != 0:
        raise SystemExit(f"error: the {name} launch failed (exit {run.returncode}); its log: {run_dir / 'train.log'}")
    return [row for row in run.metrics if "actor/pg_loss" in row]


def compare(one: list[dict], two: list[dict]) -> str:
    """A markdown table of the two runs' training rows, iteration by iteration (``one``/``two``: verl's metrics rows
    of each run's training iterations), and the keys only one run logged."""
    lines = [
        "| iteration | run | " + " | ".join([*(f"`{k}`" for k in SHOWN), *(f"`{f}*` keys" for f in FAMILIES)]) + " |",
        "|---" * (2 + len(SHOWN) + len(FAMILIES)) + "|",
    ]
    for a, b in zip(one, two, strict=True):
        for name, row in (("1 node x 2 ranks", a), ("2 nodes x 1 rank", b)):
            values = [f"{row[k]:.4g}" if isinstance(row.get(k), int | float) else "-" for k in SHOWN]
            counts = [str(sum(k.startswith(f) for k in row)) for f in FAMILIES]
            lines.append(f"| {row['step']} | {name} | " + " | ".join(values + counts) + " |")
    only_one = sorted(set().union(*one) - set().union(*two))
    only_two = sorted(set().union(*two) - set().union(*one))
    lines += ["", f"keys only on one node: {only_one or 'none'}; only on two nodes: {only_two or 'none'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run both launches and print the comparison; returns 0."""
    out, extra = benchmark_folder(__doc__, "runs/multinode_compare", argv)
    one = _launch("one_node", out, extra, ranks=2, nnodes=1, env={})
    with two_ray_nodes() as (address, _):
        joined = {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"}
        two = _launch("two_nodes", out, extra, ranks=1, nnodes=2, env=joined)
    table = compare(one, two)
    (out / "compare.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
