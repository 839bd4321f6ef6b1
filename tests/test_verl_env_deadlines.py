"""CPU test of environment deadlines on verl's path: verl's V1 ``AgentLoopWorkerTQ`` Ray actor runs the
``gigpo_env_agent`` agent loop against the ``hf`` rollout server (through verl's ``LLMServerClient``), on a gridnav
whose task seed 0 never returns from its second step (tests/helpers/gigpo_hanging_env.py, registered through
``env.registry``). With ``env.step_timeout_s=1`` the batch completes: that task's episodes fail (masked rows,
``env/env_error_rate``), in threads (abandoned: ``env/abandoned_threads``) and in a worker process (killed and
replaced). ``tests/test_verl_agent_loop_trainer.py`` shows the same set-up without faults.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import ray
import transfer_queue as tq
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
from verl_gigpo.cpu.hf_rollout import HFGenerationServer
from verl_gigpo.data.prepare import write_task_files
from verl_gigpo.trainer import StepBatch, episode_metrics

pytestmark = pytest.mark.slow  # a Ray cluster, TransferQueue, an agent-loop worker actor and a rollout server

ROOT = Path(__file__).resolve().parents[1]
N_TASKS, GROUP = 3, 2
ENVS = {"gridnav_hang": "gigpo_hanging_env:HangingGridNav", "gridnav_hang_proc": "gigpo_hanging_env:HangingGridNavProc"}


@pytest.fixture(autouse=True, scope="module")
def hanging_envs():
    """Register the hanging gridnavs in this process too (data prep builds them)."""
    for name, target in ENVS.items():
        if name not in list_envs():
            register_env(name, target)


def _config(model_dir: Path, data_dir: Path, env_name: str, num_workers: int):
    overrides = [
        "algorithm.adv_estimator=gigpo",
        f"env.name={env_name}",
        f"+env.registry.{env_name}={ENVS[env_name]}",
        "+env.kwargs.hang_seed=0",
        "+env.kwargs.min_path=4",
        "env.max_steps=5",
        "env.step_timeout_s=1",
        f"env.num_workers={num_workers}",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        f"data.train_batch_size={N_TASKS}",
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
def server(ray_tq, action_model_dir, tmp_path_factory):
    """One ``hf`` rollout server for the module's batches (its config does not depend on the environment)."""
    data_dir = tmp_path_factory.mktemp("server-tasks")
    write_task_files("gridnav", data_dir, train_size=1, val_size=1)
    rollout = _config(action_model_dir, data_dir, "gridnav_hang", 0).actor_rollout_ref.rollout
    handle = (
        ray.remote(HFGenerationServer)
        .options(max_concurrency=64)
        .remote(config=omega_conf_to_dataclass(rollout), model_path=str(action_model_dir), replica_rank=0)
    )
    yield handle
    ray.kill(handle)


def _rollout(cfg, data_dir: Path, model_dir: Path, server) -> tuple[list[dict], float]:
    """One batch of N_TASKS tasks x GROUP episodes through a fresh agent-loop worker; returns every row's
    extra_fields (waiting for the batch's prompts to finish) and the seconds the batch took."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = create_rl_dataset([str(data_dir / "train.parquet")], cfg.data, tokenizer, None)
    batch_dict = collate_fn([dataset[i] for i in range(N_TASKS)])
    uids = [str(uuid.uuid4()) for _ in range(N_TASKS)]
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    tq.kv_batch_put(
        keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * N_TASKS
    )
    client = LLMServerClient(cfg, load_balancer_handle=get_router_handle(servers={"hf://deadline-server": server}))
    # the hanging environment's module must be importable in the worker (and in its environment worker processes)
    path = f"{ROOT}:{ROOT / 'tests' / 'helpers'}"
    worker = AgentLoopWorkerTQ.options(runtime_env={"env_vars": {"PYTHONPATH": path}}).remote(cfg, client)
    try:
        start = time.monotonic()
        ray.get(worker.generate_sequences.remote(batch))
        while True:
            tags = tq.kv_list("train").get("train", {})
            if all(tags.get(uid, {}).get("status") in ("finished", "failure") for uid in uids):
                break
            assert time.monotonic() - start < 120, "the batch did not finish: a hanging environment stalled it"
            time.sleep(0.2)
        seconds = time.monotonic() - start
        assert all(tags[uid]["status"] == "finished" for uid in uids)  # failed episodes are rows, not errors
        keys = sorted(k for k in tags if k.rsplit("_", 2)[0] in uids and k not in uids)
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["uid", "response_mask", "extra_fields"])
        rows = list(data["extra_fields"])
        masks = [m.tolist() for m in data["response_mask"].unbind()]
        for row, mask in zip(rows, masks, strict=True):
            row["_uid"], row["_mask"] = row["traj_id"].rsplit("_", 1)[0], mask
        return rows, seconds
    finally:
        ray.kill(worker)


@pytest.mark.parametrize("num_workers", [0, 1], ids=["threads", "worker-process"])
def test_a_hanging_environment_fails_its_episodes_and_the_batch_finishes(
    server, action_model_dir, tmp_path, num_workers
):
    env_name = "gridnav_hang_proc" if num_workers else "gridnav_hang"
    write_task_files(env_name, tmp_path, train_size=N_TASKS, val_size=2)
    cfg = _config(action_model_dir, tmp_path, env_name, num_workers)
    rows, seconds = _rollout(cfg, tmp_path, action_model_dir, server)
    assert seconds < 90
    trajectories = {}
    for row in rows:
        trajectories.setdefault(row["traj_id"], []).append(row)
    assert len(trajectories) == N_TASKS * GROUP
    for traj in trajectories.values():
        first = traj[0]
        if first["seed"] == 0:  # hung at step 2: one played step, masked, the error names env, task, step, wait
            assert first["env_error"] and len(traj) == 1 and traj[0]["_mask"] == [0] * len(traj[0]["_mask"])
            message = first["env_error_message"]
            assert message.startswith("EnvDeadlineError") and f"env={env_name}" in message and "step=2" in message
            assert "step() gave no answer within env.step_timeout_s=1 s" in message
            remedy = "killed and is replaced" if num_workers else "its thread abandoned"
            assert remedy in message
            assert first["env_abandoned_threads"] == (0 if num_workers else 1)
        else:
            assert not first["env_error"] and all(1 in row["_mask"] for row in traj)
    steps = StepBatch.from_rows([r["_uid"] for r in rows], rows, [False] * len(rows))
    metrics = episode_metrics(steps)  # the trainer mode's env/* metrics of this batch
    assert metrics["env/env_error_rate"] == pytest.approx(GROUP / (N_TASKS * GROUP))
    assert metrics["env/abandoned_threads"] == (0.0 if num_workers else float(GROUP))
