"""Run verl's own pipeline on a CPU: the ``cpu`` platform, the ``hf`` rollout backend and the shims they need.

:func:`register_cpu_backends` (called by the plug-in) registers them through verl's own registries; users reach all
of it with ``python -m verl_gigpo.main platform=cpu`` or ``DEVICE=cpu`` in the recipes. How each piece fits into
verl: docs/verl-integration.md ("verl's pipeline on a CPU"); usage and speed: docs/cpu-smoke.md.
"""

from __future__ import annotations

import os
from typing import Any

# No verl import at module level: a Ray process may import a submodule (e.g. the hf server class) before verl, and
# verl's plug-in loading then imports this package again; everything it needs must already be defined here.

__all__ = [
    "PLATFORM_NAME",
    "ROLLOUT_NAME",
    "activate_cpu_platform",
    "check_cpu_config",
    "cpu_selected",
    "register_cpu_backends",
    "register_cpu_engines",
    "register_rollout_adapter",
    "register_rollout_backend",
    "register_rollout_replica",
    "set_transfer_queue_threads",
]

#: the name verl's platform registry knows the CPU platform by (``VERL_PLATFORM=cpu``)
PLATFORM_NAME = "cpu"
#: ``actor_rollout_ref.rollout.name`` of the Hugging Face rollout backend
ROLLOUT_NAME = "hf"


def cpu_selected() -> bool:
    """True when this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


_ADAPTER_PATH = "verl_gigpo.verl_glue.cpu.hf_rollout.HFServerAdapter"


def _load_hf_replica() -> type:
    from verl_gigpo.verl_glue.cpu.hf_rollout import HFReplica

    return HFReplica


def register_rollout_replica(_module: Any = None) -> None:
    """Register the ``hf`` replica class in verl's ``RolloutReplicaRegistry`` (idempotent; the class loads lazily)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_gigpo.verl_glue.contract import check_contract

    check_contract(__name__, "RolloutReplicaRegistry.register")
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)


def register_rollout_adapter(_module: Any = None) -> None:
    """Register the ``hf`` in-worker rollout class (what ``get_rollout_class("hf")`` returns; idempotent)."""
    from verl.workers.rollout import base

    from verl_gigpo.verl_glue.contract import check_contract

    # verl.workers.rollout.base keeps the in-worker rollout classes in a module-private dict (_ROLLOUT_REGISTRY), no
    # register function (get_rollout_class reads it); adding our entry is the only way in.
    check_contract(__name__, ":_ROLLOUT_REGISTRY")
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = _ADAPTER_PATH


def register_rollout_backend() -> None:
    """Register both halves of the ``hf`` rollout backend now (imports verl's rollout modules)."""
    register_rollout_replica()
    register_rollout_adapter()


def register_cpu_engines(_module: Any = None) -> None:
    """Register verl's FSDP engines (language and value models) for device ``cpu``; verl does for cuda/npu only."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    from verl_gigpo.verl_glue.contract import check_contract

    check_contract(__name__, "EngineRegistry._engines")
    check_contract(__name__, "EngineRegistry.register")
    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {})
        for backend in ("fsdp", "fsdp2"):
            if "cpu" not in registered.get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(cls)


def _fsdp_on_cpu(_module: Any = None) -> None:
    from verl_gigpo.verl_glue.cpu.shims import unpinned_ref_offload

    unpinned_ref_offload()
    register_cpu_engines()


def _gloo_on_cpu(_module: Any = None) -> None:
    from verl_gigpo.verl_glue.cpu.shims import gloo_process_group

    gloo_process_group()


def _sorted_micro_batches_on_cpu(_module: Any = None) -> None:
    from verl_gigpo.verl_glue.cpu.shims import length_sorted_micro_batches

    length_sorted_micro_batches()


_HOOKED: set[str] = set()


def _when_imported(module: str, hook: Any) -> None:
    """Run ``hook`` when ``module`` is imported in this process (at once if it is already), once per module."""
    import wrapt

    if module not in _HOOKED:
        _HOOKED.add(module)
        wrapt.register_post_import_hook(hook, module)


def register_cpu_backends() -> None:
    """Register the ``cpu`` platform now, and the ``hf`` backend, CPU engines and shims when verl imports their
    registries (idempotent)."""
    import importlib

    platform = importlib.import_module("verl_gigpo.verl_glue.cpu.platform")
    # a process whose first import is verl_gigpo.verl_glue.cpu.platform reaches here (via verl's plug-in loading) while
    # that module is still importing verl; it registers itself at its end, so there is nothing to do yet
    if hasattr(platform, "register_cpu_platform"):
        platform.register_cpu_platform()
    _when_imported("verl.workers.rollout.replica", register_rollout_replica)
    _when_imported("verl.workers.rollout.base", register_rollout_adapter)
    if cpu_selected():
        _when_imported("verl.utils.distributed", _gloo_on_cpu)
        _when_imported("verl.workers.engine.fsdp.transformer_impl", _fsdp_on_cpu)
        _when_imported("verl.workers.engine.utils", _sorted_micro_batches_on_cpu)


def check_cpu_config(config: Any) -> None:
    """Raise ``ValueError`` naming the setting when a ``trainer.device=cpu`` config cannot run on the CPU platform
    (``platform=cpu`` missing, or one of its settings overridden with a value that needs a GPU)."""
    problems = []
    arr = config.actor_rollout_ref
    if arr.rollout.name != ROLLOUT_NAME:
        problems.append(f"actor_rollout_ref.rollout.name={arr.rollout.name} (needs {ROLLOUT_NAME}: no vLLM on CPU)")
    for role in ("actor", "ref"):
        strategy = arr[role].get("strategy")
        if strategy != "fsdp2":
            problems.append(f"actor_rollout_ref.{role}.strategy={strategy} (needs fsdp2: FSDP1 needs a GPU)")
    attn = (arr.model.get("override_config") or {}).get("attn_implementation")
    if attn not in ("sdpa", "eager"):
        problems.append(f"actor_rollout_ref.model.override_config.attn_implementation={attn} (needs sdpa or eager)")
    reward = config.get("reward") or {}
    if reward.get("num_workers", 1) == 0:
        from verl_gigpo import AGENT_LOOP_NAME

        agent = arr.rollout.get("agent", {}).get("default_agent_loop")
        if agent != AGENT_LOOP_NAME or (reward.get("reward_model") or {}).get("enable", False):
            problems.append(
                f"reward.num_workers=0 with default_agent_loop={agent} or a reward model (only the {AGENT_LOOP_NAME} "
                "agent loop scores its own episodes; set reward.num_workers=1)"
            )
    from verl_gigpo.verl_glue.cluster import ray_address

    # joining a running cluster, its nodes declared their logical GPUs (verl_gigpo.verl_glue.cluster checks them once
    # connected); starting a local Ray, ray_init.num_gpus declares them
    num_gpus = config.ray_kwargs.ray_init.get("num_gpus")
    needed = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    if ray_address(config.ray_kwargs.ray_init) is None and (num_gpus is None or int(num_gpus) < needed):
        problems.append(
            f"ray_kwargs.ray_init.num_gpus={num_gpus} (needs >= trainer.n_gpus_per_node * nnodes = {needed} logical "
            "GPUs: verl places one worker per GPU; to train on several nodes, start a Ray cluster and give its "
            "address: RAY_ADDRESS or ray_kwargs.ray_init.address, docs/multi-node.md)"
        )
    if problems:
        raise ValueError(
            "trainer.device=cpu, but these settings cannot run on a CPU:\n  - "
            + "\n  - ".join(problems)
            + "\nAdd `platform=cpu` to the command (it sets all of them; verl_gigpo/config/platform/cpu.yaml), or "
            "DEVICE=cpu for the recipes."
        )


def activate_cpu_platform(config: Any) -> None:
    """Make this process, and every Ray process it starts, run verl on the CPU platform (config checked,
    ``VERL_PLATFORM=cpu``, TransferQueue's threads, engines and shims, verl's platform singleton replaced)."""
    check_cpu_config(config)
    os.environ["VERL_PLATFORM"] = PLATFORM_NAME
    set_transfer_queue_threads(config)
    register_cpu_backends()
    from verl.plugin.platform import get_platform, set_platform

    from verl_gigpo.verl_glue.cpu.platform import CPUPlatform

    if get_platform().device_name != "cpu":
        set_platform(CPUPlatform())


#: TransferQueue's torch threads per put and get (``TQ_NUM_THREADS``) when unset
TQ_DEFAULT_THREADS = 8


def set_transfer_queue_threads(config: Any, environ: dict[str, str] | None = None) -> str | None:
    """Pass the core count as ``TQ_NUM_THREADS`` to every Ray process on a machine with fewer cores than
    TransferQueue's default 8 (unless the user set it); returns the value set, or None."""
    import psutil
    from omegaconf import OmegaConf, open_dict

    environ = os.environ if environ is None else environ
    key = "ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS"
    cores = psutil.cpu_count(logical=False) or 1
    if "TQ_NUM_THREADS" in environ or OmegaConf.select(config, key) is not None or cores >= TQ_DEFAULT_THREADS:
        return None
    with open_dict(config):
        OmegaConf.update(config, key, str(cores), force_add=True)
    return str(cores)
