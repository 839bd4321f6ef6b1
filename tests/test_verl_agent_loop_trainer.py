"""CPU end-to-end test of the verl extension points, with real verl objects and no mocks of verl:

task parquet (verl_gigpo.data.prepare) -> verl's RLHFDataset + collate -> verl's V1 ``AgentLoopWorkerTQ`` Ray actor
running the ``gigpo_env_agent`` agent loop against a tiny Qwen2 model (built in the session, tokenizer trained
locally) served by the project's local generation server -> rows in a real TransferQueue -> verl's ReplayBuffer
-> verl's padding (``upsample_batch_to_divisible_size``) -> the ``gigpo_sync`` trainer mode's advantage step.

Generation goes through verl's own ``LLMServerClient`` and load balancer to the ``hf`` rollout backend's server
(:class:`verl_gigpo.verl_glue.cpu.hf_rollout.HFGenerationServer`, a Ray actor) instead of a vLLM server; the FSDP actor
is not started here (``tests/test_e2e_verl_cpu.py`` runs the whole pipeline).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_dir
from omegaconf import open_dict
from transformers import AutoTokenizer
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.utils import create_rl_dataset
from verl.trainer.ppo.v1 import AgentLoopWorkerTQ
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.router import get_router_handle

from environments import make_env
from verl_gigpo.advantage import compute_gigpo_advantage, gigpo_advantage_terms
from verl_gigpo.credit.records import read_credit_records
from verl_gigpo.data.prepare import write_task_files
from verl_gigpo.local.config import load_config
from verl_gigpo.local.rollout import LocalRollout
from verl_gigpo.rollout.health import HealthMonitor, HealthOptions
from verl_gigpo.verl_glue.cpu.hf_rollout import HFGenerationServer
from verl_gigpo.verl_glue.trainer import GiGPOTrainerSync

pytestmark = pytest.mark.slow  # a Ray cluster, TransferQueue and an agent-loop worker actor

ROOT = Path(__file__).resolve().parents[1]
N_TASKS, GROUP, MAX_STEPS, RESPONSE_LEN = 3, 4, 6, 3
#: the validation settings of the module's rollout: verl's default do_sample=false, at a temperature to overrule
GREEDY_AT_0_7 = (
    "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
    "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
)


@contextlib.contextmanager
def caplog_at_info(name: str = "verl_gigpo.verl_glue.trainer"):
    """The messages logger ``name`` emits inside the block at INFO and above (a list, filled as they come): pytest's
    ``caplog`` is per test, this serves a module-scoped fixture."""
    records: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger(name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _config(model_dir: Path, data_dir: Path, estimator: str, *extra: str):
    overrides = [
        f"algorithm.adv_estimator={estimator}",
        "algorithm.gigpo.key_mode=state",
        "env.name=gridnav",
        f"env.max_steps={MAX_STEPS}",
        "env.history_length=2",
        "env.invalid_action_penalty=0.1",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        f"data.train_batch_size={N_TASKS}",
        "data.max_prompt_length=256",
        f"data.max_response_length={RESPONSE_LEN}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.n={GROUP}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=[*overrides, *extra])


def _expected_gigpo(data, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator on the rows' own extra_fields with the config's settings: the oracle of the trainer mode."""
    extra = list(data["extra_fields"])
    return compute_gigpo_advantage(
        torch.tensor([ef["step_reward"] for ef in extra], dtype=torch.float64),  # as StepBatch passes them
        mask,
        np.array(list(data["uid"]), dtype=object),
        np.array([ef["traj_id"] for ef in extra], dtype=object),
        np.array([ef["step_id"] for ef in extra]),
        np.array([ef["anchor_key"] for ef in extra], dtype=object),
        gamma=0.95,
        step_advantage_w=1.0,
        norm="mean_std",
        epsilon=1e-6,
        episode_stats="trajectory",
    )


@pytest.fixture(scope="module")
def rollout(ray_tq, action_model_dir, tmp_path_factory):
    """Run one batch of N_TASKS tasks x GROUP episodes through verl's agent-loop worker into TransferQueue.

    Credit records are on (every iteration, every group), so the agent loop adds each step's observation and action
    to the rows; the trainer starts at global_steps 0, as verl's trainer does before its first iteration."""
    data_dir = tmp_path_factory.mktemp("tasks")
    run_dir = tmp_path_factory.mktemp("run")
    write_task_files("gridnav", data_dir, train_size=N_TASKS, val_size=2)
    credit = ["trainer.credit_log_freq=1", "trainer.credit_log_groups=-1", f"trainer.default_local_dir={run_dir}"]
    # the episode table: rows without the trainer mode's draw field (as here) are validation rows for the agent loop
    credit += ["trainer.log_episodes=2", "trainer.log_episodes_train_freq=2"]
    transcripts = ["env.transcript_dir=" + str(run_dir / "transcripts")]  # what an evaluation launch sets
    # verl's default val_kwargs.do_sample=false with a temperature the trainer mode must overrule (greedy validation)
    cfg = _config(action_model_dir, data_dir, "gigpo", *credit, *transcripts, *GREEDY_AT_0_7)
    tokenizer = AutoTokenizer.from_pretrained(action_model_dir)
    dataset = create_rl_dataset([str(data_dir / "train.parquet")], cfg.data, tokenizer, None)
    batch_dict = collate_fn([dataset[i] for i in range(N_TASKS)])
    uids = [str(uuid.uuid4()) for _ in range(N_TASKS)]
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)

    with caplog_at_info() as records:
        trainer = GiGPOTrainerSync(cfg)
    trainer.global_steps = 0
    tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    server = (
        ray.remote(HFGenerationServer)
        .options(max_concurrency=64)
        .remote(
            config=omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout),
            model_path=str(action_model_dir),
            replica_rank=0,
        )
    )
    client = LLMServerClient(cfg, load_balancer_handle=get_router_handle(servers={"hf://test-server": server}))
    worker = AgentLoopWorkerTQ.remote(cfg, client)
    ray.get(worker.generate_sequences.remote(batch))
    meta, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=N_TASKS)
    fields = ["uid", "prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores", "extra_fields"]
    data = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=fields)
    yield {
        "cfg": cfg,
        "trainer": trainer,
        "meta": meta,
        "data": data,
        "tokenizer": tokenizer,
        "uids": uids,
        "run_dir": run_dir,
        "server": server,
        "worker": worker,
        "trainer_log": records,
    }
    ray.kill(worker)
    ray.kill(server)


def test_trainer_mode_is_sync_for_verl(rollout):
    trainer = rollout["trainer"]
    assert trainer.trainer_mode == "sync" and trainer.registered_mode == "gigpo_sync"
    assert type(trainer.replay_buffer) is ReplayBuffer


def test_one_row_per_step_with_the_episode_fields(rollout):
    meta, data, tokenizer = rollout["meta"], rollout["data"], rollout["tokenizer"]
    extra = list(data["extra_fields"])
    rows_by_traj = defaultdict(list)
    for i, key in enumerate(meta.keys):
        uid, session, index = key.rsplit("_", 2)
        ef = extra[i]
        assert ef["traj_id"] == f"{uid}_{session}" and ef["step_id"] == int(index)
        assert list(data["uid"])[i] == uid
        rows_by_traj[ef["traj_id"]].append(i)
    assert len(rows_by_traj) == N_TASKS * GROUP
    assert {key.rsplit("_", 2)[0] for key in meta.keys} == set(rollout["uids"])

    response_mask = data["response_mask"].unbind()
    responses = data["responses"].unbind()
    logprobs = data["rollout_log_probs"].unbind()
    rm_scores = data["rm_scores"].unbind()
    for rows in rows_by_traj.values():
        rows.sort(key=lambda i: extra[i]["step_id"])
        first = extra[rows[0]]
        assert [extra[i]["step_id"] for i in rows] == list(range(len(rows)))
        assert 1 <= len(rows) <= MAX_STEPS and first["episode_length"] == len(rows)
        assert "reward_extra_info" in first and not first["env_error"]
        episode_return = sum(extra[i]["step_reward"] for i in rows)
        assert first["episode_return"] == pytest.approx(episode_return)
        env = make_env("gridnav", max_steps=MAX_STEPS, key_mode="state")
        obs, info = env.reset(seed=first["seed"], options={"split": first["split"]})
        for i in rows:
            ef = extra[i]
            # the mask covers the generated tokens; the server's log-probs were kept
            assert response_mask[i].tolist() == [1] * len(responses[i])
            assert len(logprobs[i]) == len(responses[i]) and bool((logprobs[i] <= 0).all())
            # verl copied the final row's reward_score (the episode return) onto every row
            assert rm_scores[i][-1].item() == pytest.approx(episode_return, abs=1e-5)
            # replaying the decoded reply in a fresh environment gives the recorded key, validity and reward
            assert ef["anchor_key"] == info["anchor_key"]
            assert ef["observation"] == obs  # credit records on: the observation the action was chosen from
            action, valid = env.parse_action(tokenizer.decode(responses[i].tolist(), skip_special_tokens=True))
            assert valid == ef["action_valid"]
            if valid:
                assert ef["action"] == action
            obs, reward, terminated, truncated, info = env.step(action)
            assert ef["env_reward"] == reward
            assert ef["step_reward"] == pytest.approx(reward - (0.0 if valid else 0.1))
        assert terminated or truncated
        assert first["won"] == info["won"]


def test_the_agent_loop_writes_each_episode_as_transcript_records(rollout, tmp_path):
    """env.transcript_dir: the agent-loop worker (a Ray actor) writes every step of every episode it played, one
    record per training row with the row's group (uid), trajectory, step and rewards; the evaluation's report reads
    them (verl_gigpo.evaluate.report_from_transcripts, what an EVAL_ONLY launch ends with)."""
    from verl_gigpo.evaluate import report_from_transcripts
    from verl_gigpo.rollout.transcripts import episode_outcomes, read_transcripts

    folder = rollout["run_dir"] / "transcripts"
    [file] = list(folder.glob("transcripts_*.jsonl"))  # one worker process, one file
    records = read_transcripts(folder)
    extra = list(rollout["data"]["extra_fields"])
    uids = list(rollout["data"]["uid"])
    rows = {(str(u), ef["traj_id"], ef["step_id"]): ef for u, ef in zip(uids, extra, strict=True)}
    assert len(records) == len(rows)
    for r in records:
        ef = rows[(r["group"], r["traj"], r["step"])]
        assert (r["step_reward"], r["env_reward"], r["won"], r["action_valid"]) == (
            ef["step_reward"],
            ef["env_reward"],
            ef["won"],
            ef["action_valid"],
        )
    assert len(episode_outcomes(records)) == N_TASKS * GROUP
    shutil.copytree(folder, tmp_path / "transcripts")  # the report writes beside them: not into the run folder
    result = report_from_transcripts(
        tmp_path, settings={"engine": "verl", "env": "gridnav", "split": "train", "episodes_per_task": GROUP}
    )
    assert result.overall.episodes == N_TASKS * GROUP and result.overall.tasks == N_TASKS and result.k == GROUP
    assert result.overall.wins == sum(o.won for o in episode_outcomes(records))


def test_gigpo_advantage_step_matches_the_estimator_and_skips_padding(rollout):
    trainer, meta, data = rollout["trainer"], rollout["meta"], rollout["data"]
    eos = rollout["tokenizer"].eos_token_id
    padded = upsample_batch_to_divisible_size(meta, len(meta) + 5 - len(meta) % 5, eos)  # real verl padding rows
    n_pad = len(padded) - len(meta)
    assert n_pad > 0 and all(tag.get("is_padding") for tag in padded.tags[len(meta) :])

    metrics: dict = {}
    out = trainer._compute_advantage(padded, metrics)
    got = tq.kv_batch_get(keys=out.keys, partition_id=out.partition_id, select_fields=["advantages", "returns"])
    advantages = got["advantages"].to_padded_tensor(0.0)
    returns = got["returns"].to_padded_tensor(0.0)

    mask = data["response_mask"].to_padded_tensor(0)
    expected_adv, expected_ret = _expected_gigpo(data, mask)
    width = mask.shape[1]
    torch.testing.assert_close(advantages[: len(meta), :width], expected_adv, rtol=0, atol=0)
    torch.testing.assert_close(returns[: len(meta), :width], expected_ret, rtol=0, atol=0)
    assert torch.count_nonzero(advantages[len(meta) :]) == 0 and torch.count_nonzero(returns[len(meta) :]) == 0
    assert expected_adv.abs().sum() > 0  # the rollouts really differ (random tiny model), so this is not vacuous
    for name in ("gigpo/step_group_size_mean", "gigpo/frac_singleton_step_groups", "gigpo/step_adv_abs_mean"):
        assert name in metrics
    assert metrics["gigpo/num_masked_rows"] == n_pad
    assert metrics["episode/num_trajectories"] == N_TASKS * GROUP
    # the env/* metrics recomputed from the rows: trajectories won, steps whose reply held no valid action
    extra = list(data["extra_fields"])
    won = defaultdict(bool)
    for ef in extra:
        won[ef["traj_id"]] |= bool(ef["won"])
    assert metrics["env/success_rate"] == pytest.approx(sum(won.values()) / (N_TASKS * GROUP))
    invalid = sum(not ef["action_valid"] for ef in extra)
    assert metrics["env/invalid_action_rate"] == pytest.approx(invalid / len(extra))


def test_gigpo_advantage_step_writes_the_estimators_terms_as_credit_records(rollout):
    """trainer.credit_log_freq=1: the driver's advantage step writes one record per real row (padding left out)."""
    trainer, meta, data = rollout["trainer"], rollout["meta"], rollout["data"]
    credit = rollout["run_dir"] / "credit"
    assert not credit.exists()  # global_steps 0 (before training) is never logged
    padded = upsample_batch_to_divisible_size(meta, len(meta) + 5 - len(meta) % 5, rollout["tokenizer"].eos_token_id)
    trainer.global_steps = 1  # what verl's fit loop sets for the first iteration
    trainer._compute_advantage(padded, {})
    records = read_credit_records(credit / "iter_1.jsonl")
    assert len(records) == len(meta)

    extra = list(data["extra_fields"])
    terms = gigpo_advantage_terms(
        torch.tensor([ef["step_reward"] for ef in extra], dtype=torch.float64),  # as StepBatch passes them
        data["response_mask"].to_padded_tensor(0),
        np.array(list(data["uid"]), dtype=object),
        np.array([ef["traj_id"] for ef in extra], dtype=object),
        np.array([ef["step_id"] for ef in extra]),
        np.array([ef["anchor_key"] for ef in extra], dtype=object),
    )
    by_row = {(r["traj"], r["step"]): r for r in records}
    for i, ef in enumerate(extra):
        rec = by_row[(ef["traj_id"], ef["step_id"])]
        assert rec["group"] == list(data["uid"])[i] and rec["anchor_group_size"] == terms.anchor_group_size[i]
        for name in ("step_return", "episode_return", "episode_adv", "step_adv", "advantage"):
            assert rec[name] == getattr(terms, name)[i], name
        assert (rec["observation"], rec["action"]) == (ef["observation"], ef["action"])
        assert "walls:" in rec["observation"] and rec["task_id"] == ef["task_id"]
    assert any(r["step_adv"] != 0 for r in records)


def test_the_agent_loop_writes_the_logged_episodes_and_the_trainer_their_training_terms(rollout):
    """trainer.log_episodes=2: the agent-loop worker (a Ray actor) appends member 0 of tasks 0 and 1 to
    episodes_parts/ (rows without a draw field are validation rows); the trainer mode gathers them; every
    log_episodes_train_freq=2 iterations its advantage step logs the first trajectory of the first two groups with
    the estimator's terms, texts from the rows."""
    from verl_gigpo.rollout.episode_log import EpisodeLog, drain_parts

    trainer, meta, data = rollout["trainer"], rollout["meta"], rollout["data"]
    run_dir = rollout["run_dir"]
    parts = drain_parts(run_dir)
    assert [(r["kind"], r["iteration"], r["seed"]) for r in parts] == [("val", 1, 0), ("val", 1, 1)]
    assert all(r["traj"].endswith("_0") for r in parts)  # member 0 (verl's session_id)
    extra = list(data["extra_fields"])
    by_traj = defaultdict(list)
    for ef in extra:
        by_traj[ef["traj_id"]].append(ef)
    for record in parts:
        rows = sorted(by_traj[record["traj"]], key=lambda ef: ef["step_id"])
        assert [s["reward"] for s in record["steps"]] == [ef["step_reward"] for ef in rows]
        assert [s["observation"] for s in record["steps"]] == [ef["observation"] for ef in rows]
        assert all(s["reply"] for s in record["steps"])

    trainer.global_steps = 2  # due: 2 % log_episodes_train_freq == 0
    trainer._compute_advantage(meta, {})
    train = [r for r in map(json.loads, (run_dir / "episodes.jsonl").read_text().splitlines()) if r["iteration"] == 2]
    uids = list(data["uid"])
    first_trajs = list(dict.fromkeys(ef["traj_id"] for ef in extra))
    groups = list(dict.fromkeys(uids))[:2]
    assert [r["traj"] for r in train] == [next(t for t in first_trajs if t.startswith(g)) for g in groups]
    for record in train:
        rows = sorted(by_traj[record["traj"]], key=lambda ef: ef["step_id"])
        assert [s["action"] for s in record["steps"]] == [ef["action"] for ef in rows]
        assert all(s["advantage"] == pytest.approx(s["episode_adv"] + s["step_adv"]) for s in record["steps"])
    assert (run_dir / "episodes.html").is_file()
    EpisodeLog(run_dir).write(parts, step=1)  # what the trainer mode's _validate does with them
    assert "val: task1" in (run_dir / "episodes.html").read_text()


def test_the_health_checks_run_on_the_iterations_metrics_and_stop_ends_fit(rollout, caplog):
    """The trainer mode's health step (run by its ``_compute_metrics`` after verl's) on the metrics of a real
    advantage step: ``health/*`` and ``gigpo/frac_rows_nonzero_step_adv`` are there; with ``action=stop`` an alarm
    writes health.jsonl, logs the stop line and sets ``total_training_steps`` so that verl's ``fit`` loop ends."""
    trainer, meta = rollout["trainer"], rollout["meta"]
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)
    assert 0 < metrics["gigpo/frac_rows_nonzero_step_adv"] < 1  # some rows share no anchor group with another
    saved = trainer.health, trainer.config.trainer.save_freq
    trainer.total_training_steps = 5  # what verl's _init_dataloader sets before fit
    try:
        trainer._check_health(metrics, 1)  # the module's default options: warn, and nothing to warn about yet
        assert {f"health/{s}" for s in ("no_step_signal", "flat_groups", "success_drop")} <= set(metrics)
        assert metrics["health/alarms_total"] == 0.0 and trainer.total_training_steps == 5
        # a bound no batch passes (every row must have a step term), no warm-up: the alarm, then the stop
        trainer.health = HealthMonitor(
            HealthOptions(action="stop", window=1, warmup=0, step_signal_min=1.0),
            run_dir=trainer.config.trainer.default_local_dir,
        )
        with open_dict(trainer.config):
            trainer.config.trainer.save_freq = 1  # fit saved this iteration: no second checkpoint
        with caplog.at_level("INFO", logger="verl_gigpo.verl_glue.trainer"):
            trainer._check_health(metrics, 1)
        assert metrics["health/no_step_signal"] == 1.0 and trainer.total_training_steps == 1
        record = json.loads((rollout["run_dir"] / "health.jsonl").read_text().splitlines()[-1])
        assert (record["signal"], record["iteration"], record["action"]) == ("no_step_signal", 1, "stop")
        assert "stopped at iteration 1 by trainer.health.action=stop (no_step_signal)" in caplog.text
        assert "health: 1 alarm(s): no_step_signal (iteration 1)" in caplog.text
    finally:
        trainer.health = saved[0]
        with open_dict(trainer.config):
            trainer.config.trainer.save_freq = saved[1]


def _advantages(meta) -> torch.Tensor:
    """The batch's advantages as stored in TransferQueue, (N, L) right-padded."""
    stored = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["advantages"])
    return stored["advantages"].to_padded_tensor(0.0)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_grpo_and_rloo_score_each_trajectory_once(rollout, action_model_dir, tmp_path, estimator):
    """adv_estimator=grpo/rloo: one score per trajectory (its return) grouped by task, broadcast to its rows, as the
    local engine computes them; with no failed episode, grpo equals verl's own V1 step (the final row of each session)
    on the same rows."""
    from verl.trainer.ppo.v1 import PPOTrainerSync

    meta, data = rollout["meta"], rollout["data"]
    write_task_files("gridnav", tmp_path, train_size=N_TASKS, val_size=2)
    trainer = GiGPOTrainerSync(_config(action_model_dir, tmp_path, estimator))
    old_log_probs = tu.get_tensordict({"old_log_probs": data["rollout_log_probs"]})  # what the actor would write
    tq.kv_batch_put(keys=meta.keys, partition_id=meta.partition_id, fields=old_log_probs)
    mask = data["response_mask"].to_padded_tensor(0)  # (N, L)
    if estimator == "grpo":
        PPOTrainerSync._compute_advantage(trainer, meta, {})  # verl's own step, on the same rows
        verls = _advantages(meta)
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)
    ours = _advantages(meta)  # (N, L)
    torch.testing.assert_close(ours, ours[:, :1] * mask, rtol=0, atol=0)  # one value per row, on its response

    extra = list(data["extra_fields"])
    assert not any(ef["env_error"] for ef in extra)
    episode_return = {ef["traj_id"]: ef["episode_return"] for ef in extra}
    assert len(set(episode_return.values())) > 1  # the format-tuned model gives varied returns: a real test
    by_group = defaultdict(list)
    for traj, ret in episode_return.items():
        by_group[traj.rsplit("_", 1)[0]].append(ret)
    for i, ef in enumerate(extra):
        scores = torch.tensor(by_group[ef["traj_id"].rsplit("_", 1)[0]], dtype=torch.float64)
        if estimator == "grpo":
            expected = (ef["episode_return"] - scores.mean()) / (scores.std() + 1e-6)
        else:  # the return minus the mean of the group's other returns
            expected = ef["episode_return"] - (scores.sum() - ef["episode_return"]) / (len(scores) - 1)
        assert ours[i, 0].item() == pytest.approx(expected.item(), abs=1e-4)
    if estimator == "grpo":
        torch.testing.assert_close(ours, verls, rtol=0, atol=1e-5)
    assert "env/success_rate" in metrics and not any(k.startswith("gigpo/") for k in metrics)


def test_gigpo_applies_verls_rollout_correction(rollout, action_model_dir, tmp_path):
    """algorithm.rollout_correction on the GiGPO path: verl's IS weights and rejection mask, before the advantages."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    meta, data = rollout["meta"], rollout["data"]
    write_task_files("gridnav", tmp_path, train_size=N_TASKS, val_size=2)
    settings = {
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.8_1.25",
    }
    cfg = _config(
        action_model_dir, tmp_path, "gigpo", *(f"algorithm.rollout_correction.{k}={v}" for k, v in settings.items())
    )
    trainer = GiGPOTrainerSync(cfg)
    rollout_lp = data["rollout_log_probs"].to_padded_tensor(0.0)  # (N, L)
    mask = data["response_mask"].to_padded_tensor(0)  # (N, L)
    drift = torch.linspace(-0.4, 0.4, rollout_lp.numel()).reshape(rollout_lp.shape) * mask  # an actor that moved
    old_lp = rollout_lp + drift
    nested = data["rollout_log_probs"]
    tq.kv_batch_put(
        keys=meta.keys,
        partition_id=meta.partition_id,
        fields=tu.get_tensordict(
            {
                "old_log_probs": torch.nested.as_nested_tensor(
                    [row[: len(r)] for row, r in zip(old_lp, nested.unbind(), strict=True)], layout=torch.jagged
                )
            }
        ),
    )
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    got = tq.kv_batch_get(
        keys=out.keys,
        partition_id=out.partition_id,
        select_fields=["advantages", "response_mask", "rollout_is_weights"],
    )
    weights_verl, expected_mask, metrics_verl = compute_rollout_correction_and_rejection_mask(
        old_log_prob=old_lp, rollout_log_prob=rollout_lp, response_mask=mask, **settings
    )
    new_mask = got["response_mask"].to_padded_tensor(0)
    weights = got["rollout_is_weights"].to_padded_tensor(0.0)
    assert 0 < int(expected_mask.sum()) < int(mask.sum())  # some tokens rejected: the check is not vacuous
    torch.testing.assert_close(new_mask, expected_mask.to(new_mask.dtype), rtol=0, atol=0)
    torch.testing.assert_close(weights, weights_verl.batch["rollout_is_weights"] * mask, rtol=0, atol=1e-7)
    assert {k for k in metrics if k.startswith("rollout_corr/")} == set(metrics_verl)
    # the advantages are GiGPO's on the rejection-masked rows
    expected_adv, _ = _expected_gigpo(data, expected_mask)
    torch.testing.assert_close(got["advantages"].to_padded_tensor(0.0), expected_adv, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------- validation sampling
VAL_TASKS = 4


def _validation_replies(cfg, trainer, worker, dataset) -> dict[tuple[int, int, int], list[int]]:
    """One validation of every task of ``dataset``, as verl's ``PPOTrainer._validate`` submits it: the batch with
    ``validate`` set, prompt tags in the ``val`` partition, the replay buffer's sample, TransferQueue cleared after.

    Returns:
        {(task seed, session, step): the reply's token ids}.
    """
    batch_dict = collate_fn([dataset[i] for i in range(len(dataset))])
    uids = [str(uuid.uuid4()) for _ in range(len(dataset))]
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 0)
    tu.assign_non_tensor_data(batch, "validate", True)
    tq.kv_batch_put(
        keys=uids, partition_id="val", tags=[{"is_prompt": True, "status": "pending", "global_steps": 0}] * len(uids)
    )
    ray.get(worker.generate_sequences.remote(batch))
    meta, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="val", batch_size=len(uids))
    data = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["responses", "extra_fields"])
    tq.kv_clear(keys=meta.keys, partition_id=meta.partition_id)
    replies = {}
    for key, ef, reply in zip(meta.keys, data["extra_fields"], data["responses"].unbind(), strict=True):
        _, session, step = key.rsplit("_", 2)
        replies[(ef["seed"], int(session), int(step))] = reply.tolist()
    assert len({seed for seed, _, _ in replies}) == len(dataset)  # every task played
    return replies


def test_validation_with_do_sample_false_is_greedy_and_seeded_sampling_repeats(
    rollout, action_model_dir, tmp_path, caplog
):
    """val_kwargs.do_sample=false at val temperature 0.7 (the module's rollout): the trainer mode's construction
    writes greedy settings into the config that verl then gives its agent-loop workers (verl's TaskRunnerV1 builds
    both from one config object), so two validations of the same tasks through that AgentLoopWorkerTQ and the hf
    server give identical replies. do_sample=true at the same temperature samples: with the request seeds
    (env.seeded_sampling, the default) two validations still give identical replies (common random numbers); with
    env.seeded_sampling=false they differ (the server's own generator, drawn in arrival order). One server serves
    every worker, as verl's serves training and validation requests: the sampling settings and seeds travel with each
    request. The local engine, playing the same tasks from the same model with the same rollout seed, sends the same
    seeds and gets the same replies."""
    greedy_cfg, greedy_trainer = rollout["cfg"], rollout["trainer"]
    val_kwargs = greedy_cfg.actor_rollout_ref.rollout.val_kwargs
    assert (val_kwargs.temperature, val_kwargs.top_p, val_kwargs.top_k) == (0.0, 1.0, -1)
    assert greedy_trainer.validation_sampling.greedy
    assert any("temperature=0.7 ignored" in message for message in rollout["trainer_log"]), rollout["trainer_log"]

    write_task_files("gridnav", tmp_path, train_size=N_TASKS, val_size=VAL_TASKS)
    sampled = "actor_rollout_ref.rollout.val_kwargs.do_sample=true"
    configs = {"seeded": _config(action_model_dir, tmp_path, "gigpo", *GREEDY_AT_0_7, sampled)}
    configs["unseeded"] = _config(
        action_model_dir, tmp_path, "gigpo", *GREEDY_AT_0_7, sampled, "env.seeded_sampling=false"
    )
    with caplog.at_level("INFO", logger="verl_gigpo.verl_glue.trainer"):
        trainers = {name: GiGPOTrainerSync(cfg) for name, cfg in configs.items()}
    cfg = configs["seeded"]
    assert (cfg.actor_rollout_ref.rollout.val_kwargs.temperature, trainers["seeded"].validation_sampling.greedy) == (
        0.7,
        False,
    )
    assert "greedily" not in caplog.text
    dataset = create_rl_dataset([str(tmp_path / "val.parquet")], cfg.data, rollout["tokenizer"], None, is_train=False)

    def worker(config):
        client = LLMServerClient(
            config, load_balancer_handle=get_router_handle(servers={"hf://test-server": rollout["server"]})
        )
        return AgentLoopWorkerTQ.remote(config, client)

    workers = {"greedy": (greedy_cfg, greedy_trainer, rollout["worker"])}
    workers.update({name: (configs[name], trainers[name], worker(configs[name])) for name in configs})
    agree, replies = {}, {}
    try:
        for name, (config, owner, actor) in workers.items():
            replies[name] = _validation_replies(config, owner, actor, dataset)
            agree[name] = replies[name] == _validation_replies(config, owner, actor, dataset)
    finally:
        for name in configs:
            ray.kill(workers[name][2])
    # the same server and tasks, each worker twice: greedy decoding or the request seeds make them agree
    assert agree == {"greedy": True, "seeded": True, "unseeded": False}
    assert replies["seeded"] != replies["greedy"]  # sampled, not greedy

    local = LocalRollout(
        load_config(
            [
                f"actor_rollout_ref.model.path={action_model_dir}",
                f"actor_rollout_ref.rollout.seed={cfg.actor_rollout_ref.rollout.seed}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
                "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
                "env.name=gridnav",
                f"env.max_steps={MAX_STEPS}",
                "env.history_length=2",
                "env.val_split=test",
                f"data.val_size={VAL_TASKS}",
                "data.max_prompt_length=256",
                "local.constrain_to_actions=false",
            ]
        )
    )
    try:
        episodes = local.validation_episodes()
    finally:
        local.close()
    members = defaultdict(int)
    local_replies = {}
    for episode in episodes:
        member = members[episode.task.seed]
        members[episode.task.seed] += 1
        for step in episode.steps:
            local_replies[(episode.task.seed, member, step.step_id)] = list(step.response_ids)
    assert local_replies == replies["seeded"]
