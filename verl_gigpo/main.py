"""Train with GiGPO on verl's own PPO pipeline (Ray, vLLM/SGLang rollout servers, FSDP actor).

    python -m verl_gigpo.main env.name=alfworld data.train_files=... data.val_files=... [overrides...]

The config is ``verl_gigpo/config/gigpo_trainer.yaml`` (verl's ``ppo_trainer`` plus the GiGPO keys). Before verl
starts Ray it checks the plug-in's registration, the config and the files (preflight), the Ray cluster it joins and
the experiment folder; a refused launch, or one whose Ray actor died, ends with one ``error:`` line and exit status 1.
Why not verl's own ``main_ppo``: docs/verl-integration.md ("Before Ray"); resuming and metrics: docs/runs.md.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

# `platform=cpu` on the command line: select verl's cpu platform before Hydra's composition first imports verl, so
# that no process of the run ever resolves (and warns about) a GPU platform. main() checks the composed config.
if any(arg in ("platform=cpu", "trainer.device=cpu") for arg in sys.argv[1:]):
    os.environ.setdefault("VERL_PLATFORM", "cpu")


#: seconds an error out of Ray that names no dead actor waits for Ray's actor table to show one: Ray marks the
#: processes of a node that left DEAD when its heartbeats stop (measured: 13.7 s after a SIGKILL of the node's raylet)
TABLE_WAIT_S = 30.0


@hydra.main(config_path="config", config_name="gigpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Hydra entry point: check the plug-in, then hand the composed config to verl's ``main_ppo``."""
    if config.trainer.device == "cpu":
        from verl_gigpo.verl_glue.cpu import activate_cpu_platform

        activate_cpu_platform(config)  # before main_ppo: verl reads the platform at import time
    from verl.trainer import main_ppo

    from verl_gigpo.plugin import ensure_registered
    from verl_gigpo.verl_glue.cluster import ClusterError, check_cluster, prepare_ray_init
    from verl_gigpo.verl_glue.dead_actor import dead_actor_in_job, find_dead_actor, raised_by_ray, stop_message
    from verl_gigpo.verl_glue.launch import LaunchError, prepare_launch, summary_lines
    from verl_gigpo.verl_glue.preflight import GiGPOConfigError, preflight

    ensure_registered()
    try:
        preflight(config)  # algorithm.gigpo.*, env.*, paths and the V1 path, checked here rather than inside Ray
    except GiGPOConfigError as error:  # each problem on its line, not inside Hydra's traceback
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    # joining a running Ray cluster (ray_kwargs.ray_init.address or RAY_ADDRESS): no num_cpus/num_gpus for Ray
    address = prepare_ray_init(config)
    try:
        if address is not None:  # verl's ranks must fit on the cluster's nodes, or its placement groups wait forever
            print(f"[verl_gigpo] {check_cluster(config, address).summary()}", flush=True)
        plan = prepare_launch(config)  # partial checkpoints, resume announcement and check, the metrics file
    except (LaunchError, ClusterError) as error:
        # a refusal that says what to do: one line, not a traceback (Hydra reports only Exceptions, not SystemExit)
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    for line in plan.messages:
        print(f"[verl_gigpo] {line}", flush=True)
    try:
        main_ppo.main(config)  # hydra passes an explicit config straight to the task function
    except Exception as error:
        dead = find_dead_actor(error, waited_on="TaskRunnerV1")  # run_ppo waits on verl's TaskRunnerV1
        if dead is None and raised_by_ray(error):
            # an error that names no dead actor (a client whose service's node left fails on its own first): ask
            # Ray's actor table, which marks a node's processes dead only once it notices the node is gone
            print(f"[verl_gigpo] checking Ray's actor table for a dead process (up to {TABLE_WAIT_S:g} s)", flush=True)
            dead = dead_actor_in_job(wait_s=TABLE_WAIT_S)
        if dead is None:
            raise
        # a dead process of the run (verl replaces none): one line naming it and how to resume, not Ray's nesting
        print(f"error: {stop_message(dead, config.trainer.default_local_dir)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    for line in summary_lines(plan):  # iterations, last validation, alarms, checkpoint, evaluate/export commands
        print(f"[verl_gigpo] {line}", flush=True)


if __name__ == "__main__":
    from verl_gigpo.config.keys import check_argv

    # a typo'd key of this project's sections: one line naming the nearest keys, before Hydra composes (exit 2)
    sys.argv[1:] = check_argv(sys.argv[1:])
    main()
