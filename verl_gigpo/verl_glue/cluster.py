"""Joining a running Ray cluster: which launch joins one, what it must not pass to Ray, and whether verl's workers fit.

A launch joins when Ray is given an address (``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS``); Ray then refuses
``num_cpus``/``num_gpus``, which :func:`prepare_ray_init` drops. verl's own check counts only the cluster's total
GPUs, and a placement group that fits no node waits forever, so :func:`check_cluster` counts per node on the driver
before verl starts. docs/multi-node.md ("Launch a run on the cluster").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CPUS_PER_RANK",
    "ClusterError",
    "ClusterReport",
    "check_cluster",
    "placement_problems",
    "prepare_ray_init",
    "ray_address",
]

logger = logging.getLogger(__name__)

#: logical CPUs verl's placement-group bundle asks for per rank: ``ResourcePoolManager.max_colocate_count``'s default
#: (the V1 trainer builds its pools with it, ``verl.trainer.ppo.v1.trainer_base``)
CPUS_PER_RANK = 3

#: the ``ray_init`` keys Ray refuses when it joins a running cluster (``ray.init``); the first two are the ones the
#: ``platform=cpu`` config sets
_NODE_ONLY_KEYS = ("num_cpus", "num_gpus", "resources", "object_store_memory", "labels")


class ClusterError(ValueError):
    """The Ray cluster a launch joins cannot hold verl's workers (or cannot be reached); the message says what to do."""


def ray_address(ray_init: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The address of the running Ray cluster a launch will join (``ray_init.address``, else ``RAY_ADDRESS`` for
    None or ``"auto"``: Ray's rule), or None when verl will start a local Ray (``"local"``)."""
    environ = os.environ if environ is None else environ
    address = (ray_init or {}).get("address")
    address = None if address is None else str(address).strip() or None
    if address == "local":
        return None
    from_env = (environ.get("RAY_ADDRESS") or "").strip()
    if address in (None, "auto") and from_env:
        return from_env
    return address


def prepare_ray_init(config: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """When the launch joins a cluster, set to None in ``config.ray_kwargs.ray_init`` the keys Ray then refuses
    (``num_cpus``, ``num_gpus``, ...), logging them; return the address, else None."""
    ray_init = config.ray_kwargs.ray_init
    address = ray_address(ray_init, environ)
    if address is None:
        return None
    dropped = {key: ray_init[key] for key in _NODE_ONLY_KEYS if ray_init.get(key) is not None}
    for key in dropped:
        ray_init[key] = None
    if dropped:
        logger.info(
            "joining the Ray cluster at %s: not passing %s to ray.init (each node declared its own with `ray start`)",
            address,
            ", ".join(f"ray_kwargs.ray_init.{k}={v}" for k, v in dropped.items()),
        )
    return address


def _node_name(node: Mapping[str, Any]) -> str:
    return f"{node.get('NodeManagerAddress', '?')} ({str(node.get('NodeID', '?'))[:8]})"


def placement_problems(
    nodes: Sequence[Mapping[str, Any]],
    *,
    n_gpus_per_node: int,
    nnodes: int,
    resource: str = "GPU",
    cpus_per_rank: int = CPUS_PER_RANK,
) -> list[str]:
    """What stops verl's trainer placement groups from fitting on ``nodes`` (``ray.nodes()`` entries; empty when they
    fit): ``nnodes`` groups of ``n_gpus_per_node`` ranks, each packed onto one node, a rank taking 1 ``resource`` and
    ``cpus_per_rank`` CPUs. A node with G accelerators and C CPUs holds
    ``min(floor(G / n), floor(C / (cpus_per_rank * n)))`` groups, counted from its declared totals."""
    alive = [n for n in nodes if n.get("Alive", True)]
    need = n_gpus_per_node * nnodes
    gpus = {_node_name(n): float(n.get("Resources", {}).get(resource, 0)) for n in alive}
    cpus = {_node_name(n): float(n.get("Resources", {}).get("CPU", 0)) for n in alive}
    listing = ", ".join(f"{name}: {gpus[name]:g} {resource}, {cpus[name]:g} CPU" for name in gpus) or "no live nodes"
    layout = f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={n_gpus_per_node} (NNODES x N_GPUS in the recipes)"
    if sum(gpus.values()) < need:
        return [
            f"the Ray cluster has {sum(gpus.values()):g} {resource}(s) in all ({listing}); {layout} needs {need}. "
            f"Start more nodes (`ray start --address=<head> --num-gpus=N`; on the CPU platform the GPUs are logical: "
            f"any N), or lower NNODES/N_GPUS"
        ]
    per_group = {
        name: int(min(gpus[name] // n_gpus_per_node, cpus[name] // (cpus_per_rank * n_gpus_per_node))) for name in gpus
    }
    fits = sum(per_group.values())
    if fits < nnodes:
        return [
            f"verl packs each node's {n_gpus_per_node} rank(s) onto ONE Ray node ({n_gpus_per_node} {resource} and "
            f"{cpus_per_rank * n_gpus_per_node} CPUs; a placement group that fits nowhere waits forever), and only "
            f"{fits} of the {nnodes} such group(s) fit ({listing}). Give each node at least {n_gpus_per_node} "
            f"{resource}(s) and {cpus_per_rank * n_gpus_per_node} CPUs (`ray start ... --num-gpus/--num-cpus`), or "
            f"set N_GPUS to the {resource}s of the smallest node and NNODES to the number of nodes ({layout})"
        ]
    return []


@dataclass
class ClusterReport:
    """What the driver saw of the cluster it joins: ``address``, the live ``nodes`` (``ray.nodes()`` entries) and the
    accelerator ``resource`` name counted."""

    address: str
    nodes: list[dict[str, Any]]
    resource: str

    def summary(self) -> str:
        """One line: how many live nodes, and each node's accelerators and CPUs."""
        parts = [
            f"{_node_name(n)}: {n['Resources'].get(self.resource, 0):g} {self.resource}, "
            f"{n['Resources'].get('CPU', 0):g} CPU"
            for n in self.nodes
        ]
        return f"Ray cluster at {self.address}: {len(self.nodes)} live node(s): " + "; ".join(parts)


def check_cluster(config: Any, address: str) -> ClusterReport:
    """Connect to the cluster at ``address``, read its live nodes, disconnect; raise :class:`ClusterError` when
    ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks cannot fit there or it cannot be reached."""
    import ray
    from verl.plugin.platform import get_platform

    resource = get_platform().ray_resource_name()
    connected_before = ray.is_initialized()
    try:
        if not connected_before:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        nodes = [dict(n) for n in ray.nodes() if n.get("Alive")]
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as error:
        auth = isinstance(error, ray.exceptions.AuthenticationError)
        remedy = (
            "The cluster uses Ray's token authentication (`ray start --head` turns it on unless RAY_AUTH_MODE is "
            "set): set RAY_AUTH_MODE=token here and give this machine the cluster's token (~/.ray/auth_token, "
            "RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN; docs/multi-node.md)"
            if auth
            else "Start it first (`ray start --head`, docs/multi-node.md) or unset RAY_ADDRESS to train on this machine"
        )
        raise ClusterError(
            f"cannot connect to the Ray cluster at {address} (ray_kwargs.ray_init.address or RAY_ADDRESS): "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}. {remedy}"
        ) from error
    finally:
        if not connected_before and ray.is_initialized():
            ray.shutdown()  # verl's run_ppo connects again, with the run's runtime environment
    report = ClusterReport(address, nodes, resource)
    problems = placement_problems(
        nodes,
        n_gpus_per_node=int(config.trainer.n_gpus_per_node),
        nnodes=int(config.trainer.nnodes),
        resource=resource,
    )
    if problems:  # each problem lists the nodes
        raise ClusterError(f"Ray cluster at {address}, {len(nodes)} live node(s): " + " ".join(problems))
    return report
