"""Print a Ray cluster's nodes and actors (dead ones too) as JSON, read from the cluster's GCS tables.

    python tests/helpers/ray_actor_table.py <gcs address>

Output: ``{"nodes": [{"node_id", "alive", "is_head"}], "actors": [{"class_name", "name", "node_id", "pid",
"job_id", "state"}]}``. A process of its own, so that the caller need not connect to the cluster (a pytest process
may already hold another Ray). The actors come from ``ray._private.state.actors()``, the GCS actor table that Ray's
state API (``ray list actors``, which needs the dashboard) serves too, and that verl reads in the same module
(``sort_placement_group_by_node_ip``); the cluster then needs no dashboard, ~10 processes fewer to start.
"""

from __future__ import annotations

import json
import sys

import ray
from ray._private import state


def table(address: str) -> dict:
    """The cluster's nodes and actors (module docstring)."""
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        nodes = [
            {
                "node_id": n["NodeID"],
                "alive": bool(n["Alive"]),
                "is_head": "node:__internal_head__" in n.get("Resources", {}),
            }
            for n in ray.nodes()
        ]
        actors = [
            {
                "class_name": a["ActorClassName"],
                "name": a["Name"],
                "node_id": a["Address"]["NodeID"],
                "pid": a["Pid"],
                "job_id": a["JobID"],
                "state": a["State"],
            }
            for a in state.actors().values()
        ]
    finally:
        ray.shutdown()
    return {"nodes": nodes, "actors": actors}


if __name__ == "__main__":
    print(json.dumps(table(sys.argv[1])))
