"""CPU test of environment deadlines on verl's path: verl's V1 ``AgentLoopWorkerTQ`` Ray actor runs the
``gigpo_env_agent`` agent loop against the ``hf`` rollout server (through verl's ``LLMServerClient``) on two gridnavs
whose task seed 0 never returns from its second step (tests/helpers/gigpo_hanging_env.py, registered through
``env.registry``): one runs in threads, one (``thread_parallel = False``) in an environment worker process. With
``env.step_timeout_s=1`` the batch completes: the hanging tasks' episodes fail (masked rows, ``env/env_error_rate``),
the threaded ones with their threads abandoned (``env/abandoned_threads``), the hosted ones with their worker killed
and replaced. ``tests/test_verl_agent_loop_trainer.py`` shows the same set-up without faults.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import ray
import transfer_queue as tq
from gigpo_hanging_env import waited_seconds
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer
from verl.trainer.ppo.utils import create_rl_dataset
from verl.trainer.ppo.v1 import AgentLoopWorkerTQ
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.router import get_router_handle

from environments import list_envs, register_env
from verl_gigpo.data.prepare import write_task_files
from verl_gigpo.verl_glue.cpu.hf_rollout import HFGenerationServer
from verl_gigpo.verl_glue.trainer import StepBatch, episode_metrics

pytestmark = pytest.mark.slow  # a Ray cluster, TransferQueue, an agent-loop worker actor and a rollout server

ROOT = Path(__file__).resolve().parents[1]
TASKS_PER_ENV, GROUP = 2, 2
ENVS = {"gridnav_hang": "gigpo_hanging_env:HangingGridNav", "gridnav_hang_proc": "gigpo_hanging_env:HangingGridNavProc"}
#: the hung calls never return (nothing releases them in the worker), so the batch finishing at all shows the deadlines
#: fired; past this many seconds the test stops waiting and fails. No test asserts how long the batch took.
STALL_GUARD_S = 600


@pytest.fixture(autouse=True, scope="module")
def hanging_envs():
    """Register the hanging gridnavs in this process too (data prep builds them)."""
    for name, target in ENVS.items():
        if name not in list_envs():
            register_env(name, target)


def _config(model_dir: Path, train_files: list[Path]):
    overrides = [
        "algorithm.adv_estimator=gigpo",
        "env.name=gridnav_hang",  # the rows name their environment; this is the default
        *(f"+env.registry.{name}={target}" for name, target in ENVS.items()),
        "+env.kwargs.hang_seed=0",
        "+env.kwargs.min_path=4",
        "env.max_steps=5",
        "env.step_timeout_s=1",
        "env.num_workers=1",
        f"data.train_files=[{','.join(str(f) for f in train_files)}]",
        f"data.val_files={train_files[0]}",
        f"data.train_batch_size={TASKS_PER_ENV * len(ENVS)}",
        "data.max_prompt_length=256",
        "data.max_response_length=3",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.n={GROUP}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.temperature=1.0",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def rollout(ray_tq, action_model_dir, tmp_path_factory):
    """One batch (seeds 0 and 1 of each hanging gridnav x GROUP episodes) through an agent-loop worker; every row's
    extra_fields and response mask (after the batch's prompts finished)."""
    files = []
    for name in ENVS:
        out = tmp_path_factory.mktemp(name)
        write_task_files(name, out, train_size=TASKS_PER_ENV, val_size=1)
        files.append(out / "train.parquet")
    cfg = _config(action_model_dir, files)
    tokenizer = AutoTokenizer.from_pretrained(action_model_dir)
    dataset = create_rl_dataset([str(f) for f in files], cfg.data, tokenizer, None)
    n_tasks = len(dataset)
    batch_dict = collate_fn([dataset[i] for i in range(n_tasks)])
    uids = [str(uuid.uuid4()) for _ in range(n_tasks)]
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    rollout_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    server = (
        ray.remote(HFGenerationServer)
        .options(max_concurrency=64)
        .remote(config=rollout_cfg, model_path=str(action_model_dir), replica_rank=0)
    )
    client = LLMServerClient(cfg, load_balancer_handle=get_router_handle(servers={"hf://deadline-server": server}))
    # the hanging environments' module must be importable in the worker and in its environment worker process
    path = f"{ROOT}:{ROOT / 'tests' / 'helpers'}"
    worker = AgentLoopWorkerTQ.options(runtime_env={"env_vars": {"PYTHONPATH": path}}).remote(cfg, client)
    try:
        start = time.monotonic()
        ray.get(worker.generate_sequences.remote(batch))
        while True:
            status = tq.kv_list("train").get("train", {})
            if all(status.get(uid, {}).get("status") in ("finished", "failure") for uid in uids):
                break
            stalled = time.monotonic() - start > STALL_GUARD_S
            assert not stalled, f"the batch did not finish in {STALL_GUARD_S} s: a hanging environment stalled it"
            time.sleep(0.2)
        assert all(status[uid]["status"] == "finished" for uid in uids)  # failed episodes are rows, not errors
        keys = sorted(k for k in status if k not in uids and k.rsplit("_", 2)[0] in uids)
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["response_mask", "extra_fields"])
        rows = list(data["extra_fields"])
        for row, mask in zip(rows, data["response_mask"].unbind(), strict=True):
            row["_uid"], row["_mask"] = row["traj_id"].rsplit("_", 1)[0], mask.tolist()
        yield rows
    finally:
        ray.kill(worker)
        ray.kill(server)


def test_a_hanging_environment_fails_its_episodes_and_the_batch_finishes(rollout):
    rows = rollout
    trajectories: dict[str, list[dict]] = {}
    for row in rows:
        trajectories.setdefault(row["traj_id"], []).append(row)
    assert len(trajectories) == TASKS_PER_ENV * len(ENVS) * GROUP
    failed = 0
    for traj in trajectories.values():
        first = traj[0]
        if first["seed"] != 0:
            assert not first["env_error"] and all(1 in row["_mask"] for row in traj)
            continue
        # hung at step 2: one played step, masked; the message names the environment, task, step and wait
        failed += 1
        hosted = first["env_name"] == "gridnav_hang_proc"
        assert first["env_error"] and len(traj) == 1 and traj[0]["_mask"] == [0] * len(traj[0]["_mask"])
        message = first["env_error_message"]
        assert message.startswith("EnvDeadlineError") and f"env={first['env_name']} " in message
        assert f"task={first['task_id']} step=2" in message
        assert "step() gave no answer within env.step_timeout_s=1 s (waited " in message
        assert waited_seconds(message) >= 1.0  # the call had its full second
        assert ("killed and is replaced" if hosted else "its thread abandoned") in message
        assert first["abandoned_threads"] == (0 if hosted else 1)
    assert failed == len(ENVS) * GROUP
    steps = StepBatch.from_rows([r["_uid"] for r in rows], rows, [False] * len(rows))
    metrics = episode_metrics(steps)  # the trainer mode's env/* metrics of this batch
    assert metrics["env/env_error_rate"] == pytest.approx(failed / len(trajectories))
    assert metrics["env/abandoned_threads"] == float(GROUP)  # the threaded environment's two hung episodes
