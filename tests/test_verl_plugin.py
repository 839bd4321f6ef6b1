"""CPU tests of the ``verl.plugins`` entry point: registration in a fresh process and inside a Ray worker, the INFO
line, and the registered estimator's behaviour through verl's generic path."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from subprocs import Started

from verl_gigpo.advantage import compute_gigpo_advantage

#: the plug-in's line on success, in its one format (docs/troubleshooting.md)
LOADED = (
    "INFO verl_gigpo.plugin: verl_gigpo plug-in loaded: adv_estimator=gigpo|hgpo|graphgpo|g2po, agent loop "
    "'gigpo_env_agent', trainer mode 'gigpo_sync' (registered when verl imports their registries)"
)

# The first line is the acceptance command verbatim: nothing but `import verl` loads the plug-in.
CHECK = """
import verl; from verl.trainer.ppo.core_algos import get_adv_estimator_fn; get_adv_estimator_fn('gigpo')
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.v1 import get_trainer_cls
fn = get_adv_estimator_fn("gigpo")
print(fn.__module__, fn.__name__)
print(_agent_loop_registry["gigpo_env_agent"]["_target_"])
print(get_trainer_cls("gigpo_sync").__name__)
# what else a run imports in its processes: the CPU platform's registration, the local engine's trainer; then which
# dev-only modules (verl_gigpo.dev) all of that loaded (tests/test_layout.py: none)
import json, sys, verl_gigpo.local.train
from verl_gigpo.verl_glue.cpu import register_cpu_backends
register_cpu_backends()
print(json.dumps(sorted(name for name in sys.modules if name.startswith("verl_gigpo.dev"))))
"""


@pytest.fixture(scope="module")
def fresh():
    """The module's fresh-process checks (:data:`CHECK`, :data:`LIGHT`), started at once."""
    started = Started({"check": [sys.executable, "-c", CHECK], "light": [sys.executable, "-c", LIGHT]})
    yield started
    started.close()


def test_fresh_process_registers_estimator_agent_loop_and_trainer_mode_and_logs_once(fresh):
    proc = fresh.result("check")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == [
        "verl_gigpo.plugin gigpo_adv_estimator",
        "verl_gigpo.verl_glue.agent_loop.GiGPOEnvAgentLoop",
        "GiGPOTrainerSync",
    ]
    assert proc.stderr.count("verl_gigpo plug-in loaded") == 1
    assert f"\n{LOADED}" in f"\n{proc.stderr}"  # verl's basicConfig came first: the plug-in's format all the same


def test_the_loaded_line_has_one_format_whoever_configures_logging_first():
    """A command that configures logging before it imports verl (the demo, the evaluation) gets the same line."""
    first = "import logging; logging.basicConfig(format='%(asctime)s|%(name)s|%(message)s', level=logging.INFO)"
    code = f"{first}; from verl.trainer.ppo.core_algos import get_adv_estimator_fn; get_adv_estimator_fn('gigpo')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if "plug-in loaded" in line] == [LOADED]


def test_runtime_imports_no_dev_code(fresh):
    """The plug-in, trainer mode, agent loop, CPU platform and local trainer load nothing from verl_gigpo.dev (the
    layout's promise, tests/test_layout.py; the timeline is loaded only when GIGPO_TIMELINE asks for it)."""
    proc = fresh.result("check")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().split("\n")[-1] == "[]", proc.stdout


@pytest.mark.slow
def test_plugin_is_loaded_inside_a_ray_worker(ray_tq):
    @ray.remote
    def registered() -> tuple[bool, bool, bool]:
        import verl  # noqa: F401  - the worker's own import triggers the entry point
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        return (
            "gigpo" in ADV_ESTIMATOR_REGISTRY,
            "gigpo_env_agent" in _agent_loop_registry,
            "gigpo_sync" in TRAINER_REGISTRY,
        )

    assert ray.get(registered.remote()) == (True, True, True)


def test_generic_verl_path_raises_naming_the_trainer_mode():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fn = get_adv_estimator_fn("gigpo")
    config = OmegaConf.create({"gamma": 0.95, "gigpo": {"norm": "mean_std"}})
    with pytest.raises(ValueError, match=r"trainer\.v1\.trainer_mode=gigpo_sync"):
        fn(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3), config=config, index=np.array([0, 0]))


def test_registered_function_computes_the_estimator_when_given_step_data():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rng = np.random.default_rng(0)
    n = 12
    step_rewards = torch.tensor(rng.normal(size=n), dtype=torch.float32)
    mask = torch.ones(n, 4)
    groups = np.array(["g0"] * 6 + ["g1"] * 6, dtype=object)
    traj = np.array([f"t{i // 3}" for i in range(n)], dtype=object)
    steps = np.array([i % 3 for i in range(n)])
    keys = np.array([f"s{i % 2}" for i in range(n)], dtype=object)
    config = OmegaConf.create({"gamma": 0.9, "gigpo": {"norm": "mean", "step_advantage_w": 0.5}})
    got = get_adv_estimator_fn("gigpo")(
        token_level_rewards=torch.zeros(n, 4),
        response_mask=mask,
        config=config,
        index=groups,
        step_rewards=step_rewards,
        traj_ids=traj,
        step_ids=steps,
        anchor_keys=keys,
    )
    want = compute_gigpo_advantage(
        step_rewards, mask, groups, traj, steps, keys, gamma=0.9, norm="mean", step_advantage_w=0.5
    )
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


ROOM = (
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, a butterknife 3, a cup 1, "
    "a dishsponge 2, a fork 1, a lettuce 2, a peppershaker 1, a plate 2, a saltshaker 3, and a spatula 1."
)


def test_registered_function_honours_similarity_keys_as_the_trainer_mode_does():
    """key_mode=similarity through verl's generic dispatch: near-identical observations share an anchor group, so
    the advantages are the trainer mode's (it used to group them exactly here, silently)."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from verl_gigpo.config import GiGPOConfig
    from verl_gigpo.rollout.step_rows import StepBatch

    # One task, three trajectories of two steps; the first observations differ in one object only.
    first = [ROOM, ROOM.replace("apple 1", "apple 2"), ROOM.replace("lettuce", "tomato")]
    second = ["You pick up the apple 1.", "Nothing happens.", "You open the fridge 1."]
    rewards = [0.0, 1.0, -0.1, 0.0, 0.0, 0.5]
    extra = [
        {"traj_id": f"t{i // 2}", "step_id": i % 2, "anchor_key": (first if i % 2 == 0 else second)[i // 2]}
        | {"step_reward": rewards[i], "action_valid": True, "won": False, "env_error": False}
        for i in range(6)
    ]
    steps = StepBatch.from_rows(["u0"] * 6, extra, [False] * 6)
    mask = torch.ones(6, 3)
    config = OmegaConf.create({"gamma": 0.9, "gigpo": {"key_mode": "similarity", "similarity_threshold": 0.9}})
    adv, ret = get_adv_estimator_fn("gigpo")(
        token_level_rewards=torch.zeros(6, 3),
        response_mask=mask,
        config=config,
        index=steps.group_ids,
        step_rewards=torch.as_tensor(steps.step_rewards, dtype=torch.float64),
        traj_ids=steps.traj_ids,
        step_ids=steps.step_ids,
        anchor_keys=steps.anchor_keys,
    )
    cfg = GiGPOConfig.from_algorithm(config)
    want_adv, want_ret = steps.advantage_terms(cfg, mask).token_level(mask)  # the trainer mode's advantage step
    torch.testing.assert_close(adv, want_adv, rtol=0, atol=0)
    torch.testing.assert_close(ret, want_ret, rtol=0, atol=0)
    # The three first steps form one anchor group (not three singletons with A_S = 0): R_t = 0.9, -0.1, 0.45. The
    # second steps are singletons (A_S = 0) and A_E is the trajectory's, so A(step 0) - A(step 1) = A_S(step 0).
    r_t = np.array([0.9, -0.1, 0.45])
    a_s = (r_t - r_t.mean()) / (r_t.std(ddof=1) + 1e-6)  # about 0.965, -1.032, 0.067
    torch.testing.assert_close(adv[[0, 2, 4], 0] - adv[[1, 3, 5], 0], torch.tensor(a_s, dtype=torch.float32))
    exact, _ = compute_gigpo_advantage(
        step_rewards=torch.as_tensor(steps.step_rewards, dtype=torch.float64),
        response_mask=mask,
        group_ids=steps.group_ids,
        traj_ids=steps.traj_ids,
        step_ids=steps.step_ids,
        anchor_keys=steps.anchor_keys,
        gamma=0.9,
    )
    assert not torch.equal(adv, exact)


LIGHT = """
import sys
import verl
heavy = ["verl.trainer.ppo.core_algos", "verl.trainer.ppo.v1", "verl.experimental.agent_loop.agent_loop",
         "verl.workers.rollout.replica", "verl_gigpo.verl_glue.trainer", "verl_gigpo.verl_glue.agent_loop"]
print(sorted(m for m in heavy if m in sys.modules))
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import get_rollout_class
print("gigpo" in ADV_ESTIMATOR_REGISTRY, "gigpo_env_agent" in _agent_loop_registry,
      get_trainer_cls("gigpo_sync").__name__,
      RolloutReplicaRegistry.get("hf").__name__, get_rollout_class("hf").__name__)
"""


def test_import_verl_stays_light_and_registers_on_first_use(fresh):
    """`import verl` (every Ray process: rollout servers, workers) must not pull verl's trainer stack because of the
    plug-in; each registration happens when verl imports the module holding its registry."""
    proc = fresh.result("light")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "[]"
    assert lines[1] == "True True GiGPOTrainerSync HFReplica HFServerAdapter"


@pytest.mark.parametrize("method", ["hgpo", "graphgpo", "g2po"])
def test_successors_are_registered_and_compute_their_estimator(method):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from verl_gigpo.advantage import ESTIMATOR_TERMS

    fn = get_adv_estimator_fn(method)
    assert (fn.__module__, fn.__name__) == ("verl_gigpo.plugin", f"{method}_adv_estimator")
    n = 6
    data = {
        "step_rewards": torch.tensor([0.0, 1.0, 0.0, 0.0, -0.1, 0.0]),
        "traj_ids": np.array(["t0", "t0", "t1", "t1", "t2", "t2"], dtype=object),
        "step_ids": np.array([0, 1, 0, 1, 0, 1]),
        "anchor_keys": np.array(["a", "b", "a", "c", "a", "b"], dtype=object),
        "won": np.array([True, True, False, False, False, False]),
        "action_valid": np.array([True, True, True, True, False, True]),
    }
    config = OmegaConf.create({"gamma": 0.9, "gigpo": {"norm": "mean_std"}, "graphgpo": {"omega": 0.5}})
    mask = torch.ones(n, 2)
    adv, ret = fn(token_level_rewards=torch.zeros(n, 2), response_mask=mask, config=config, index=np.zeros(n), **data)
    extra = {"won": data["won"], "action_valid": data["action_valid"]} if method != "hgpo" else {}
    options = {"graphgpo": {"omega": 0.5}}.get(method, {})
    want = ESTIMATOR_TERMS[method](
        data["step_rewards"],
        mask,
        np.zeros(n),
        data["traj_ids"],
        data["step_ids"],
        data["anchor_keys"],
        gamma=0.9,
        **extra,
        **options,
    )
    torch.testing.assert_close(adv, want.token_level(mask)[0])
    assert torch.count_nonzero(adv) > 0
    with pytest.raises(ValueError, match=rf"adv_estimator='{method}' needs per-step data"):
        fn(token_level_rewards=torch.zeros(n, 2), response_mask=mask, config=config, index=np.zeros(n))
