"""CPU tests of joining a running Ray cluster (verl_gigpo/verl_glue/cluster.py), without starting Ray: which launch
joins one (Ray's own address rule), what it stops passing to ``ray.init``, the CPU platform's check of its logical GPUs,
and whether verl's per-node placement groups fit on a cluster's nodes. The real connection, on two real Ray nodes, is in
tests/test_multinode.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from verl.single_controller.ray.base import ResourcePoolManager

from verl_gigpo.config.resume import VERL_RESUME
from verl_gigpo.verl_glue.cluster import CPUS_PER_RANK, placement_problems, prepare_ray_init, ray_address
from verl_gigpo.verl_glue.cpu import check_cpu_config

CONFIG_DIR = Path(__file__).resolve().parents[1] / "verl_gigpo" / "config"


def compose(*overrides: str):
    """verl_gigpo/config/gigpo_trainer.yaml composed with ``overrides``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name="gigpo_trainer", overrides=list(overrides))


@pytest.mark.parametrize(
    ("address", "environ", "expected"),
    [
        (None, {}, None),  # verl starts a local Ray
        (None, {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.1:6379"),
        ("auto", {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.1:6379"),  # Ray: RAY_ADDRESS replaces None and auto
        ("auto", {}, "auto"),  # the cluster started on this machine
        ("10.0.0.2:6379", {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.2:6379"),  # an explicit address wins
        ("local", {"RAY_ADDRESS": "10.0.0.1:6379"}, None),  # always a new local Ray
        (None, {"RAY_ADDRESS": "  "}, None),
    ],
)
def test_ray_address_follows_rays_own_rule(address, environ, expected):
    assert ray_address({"address": address}, environ) == expected


def test_joining_drops_the_node_settings_ray_refuses_and_keeps_the_rest():
    cfg = compose("platform=cpu", "ray_kwargs.ray_init.address=10.0.0.1:6379")
    assert (cfg.ray_kwargs.ray_init.num_cpus, cfg.ray_kwargs.ray_init.num_gpus) == (16, 1)
    assert prepare_ray_init(cfg, environ={}) == "10.0.0.1:6379"
    ray_init = cfg.ray_kwargs.ray_init
    assert ray_init.num_cpus is None and ray_init.num_gpus is None  # ray.init takes None as not given
    assert ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu" and ray_init.include_dashboard is False


def test_a_local_launch_keeps_its_node_settings_and_ray_address_in_the_environment_joins():
    cfg = compose("platform=cpu", "trainer.n_gpus_per_node=2")
    assert prepare_ray_init(cfg, environ={}) is None
    assert (cfg.ray_kwargs.ray_init.num_cpus, cfg.ray_kwargs.ray_init.num_gpus) == (16, 2)
    assert prepare_ray_init(cfg, environ={"RAY_ADDRESS": "head:6379"}) == "head:6379"
    assert cfg.ray_kwargs.ray_init.num_gpus is None


def test_the_cpu_check_leaves_a_joined_clusters_gpus_to_the_cluster_check(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = compose("platform=cpu", "trainer.nnodes=2")
    with pytest.raises(ValueError, match=r"ray_kwargs.ray_init.num_gpus=1 \(needs >= .* = 2 .*RAY_ADDRESS"):
        check_cpu_config(cfg)  # two nodes on a local one-GPU Ray: refused, pointing to a cluster
    check_cpu_config(compose("platform=cpu", "trainer.nnodes=2", "ray_kwargs.ray_init.address=head:6379"))
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    check_cpu_config(cfg)


def test_node_counts_are_not_training_keys():
    """A run may resume on another number of nodes (the launch check does not stop it for that)."""
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node", "ray_kwargs.ray_init.address"):
        assert VERL_RESUME.may_change(key)


def _node(name: str, gpus: float, cpus: float, alive: bool = True) -> dict:
    return {"NodeID": name * 8, "NodeManagerAddress": name, "Alive": alive, "Resources": {"GPU": gpus, "CPU": cpus}}


def test_cpus_per_rank_is_verls_bundle():
    """verl's placement-group bundle asks for max_colocate_count CPUs per rank; the V1 trainer leaves the default."""
    default = {f.name: f.default for f in dataclasses.fields(ResourcePoolManager)}["max_colocate_count"]
    assert CPUS_PER_RANK == default == 3


@pytest.mark.parametrize(
    ("nodes", "n_gpus_per_node", "nnodes"),
    [
        ([_node("a", 1, 16), _node("b", 1, 16)], 1, 2),  # the two-node test's cluster
        ([_node("a", 2, 16)], 1, 2),  # two groups packed onto one node
        ([_node("a", 8, 96), _node("b", 8, 96), _node("c", 0, 8)], 8, 2),  # a CPU-only head
        ([_node("a", 4, 12), _node("b", 4, 12)], 4, 2),  # exactly 3 CPUs per rank
    ],
)
def test_placements_that_fit(nodes, n_gpus_per_node, nnodes):
    assert placement_problems(nodes, n_gpus_per_node=n_gpus_per_node, nnodes=nnodes) == []


def test_too_few_gpus_in_all_names_the_count_and_the_fix():
    [problem] = placement_problems([_node("a", 1, 16), _node("b", 1, 16, alive=False)], n_gpus_per_node=1, nnodes=2)
    assert "has 1 GPU(s) in all (a (aaaaaaaa): 1 GPU, 16 CPU)" in problem  # the dead node does not count
    assert "trainer.nnodes=2 x trainer.n_gpus_per_node=1" in problem and "needs 2" in problem
    assert "ray start --address=<head> --num-gpus=N" in problem


def test_enough_gpus_in_all_but_not_on_one_node_is_caught():
    """verl's own check (total GPUs) passes here and its STRICT_PACK placement group would wait forever."""
    [problem] = placement_problems([_node("a", 1, 16), _node("b", 1, 16)], n_gpus_per_node=2, nnodes=1)
    assert "only 0 of the 1 such group(s) fit" in problem and "at least 2 GPU(s) and 6 CPUs" in problem


def test_too_few_cpus_on_a_node_is_caught():
    [problem] = placement_problems([_node("a", 1, 16), _node("b", 1, 2)], n_gpus_per_node=1, nnodes=2)
    assert "only 1 of the 2 such group(s) fit" in problem and "b (bbbbbbbb): 1 GPU, 2 CPU" in problem


def test_the_accelerator_resource_is_the_platforms():
    npu = [{"NodeID": "x" * 8, "NodeManagerAddress": "x", "Alive": True, "Resources": {"NPU": 8, "CPU": 64}}]
    assert placement_problems(npu, n_gpus_per_node=8, nnodes=1, resource="NPU") == []
    assert "has 0 GPU(s) in all" in placement_problems(npu, n_gpus_per_node=8, nnodes=1)[0]
