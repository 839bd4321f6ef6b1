"""CPU tests of environments hosted in worker processes (verl_gigpo.rollout.execution.procpool): a hosted ALFWorld
instance answers exactly as one in this process (reset, step, and the local view's parse_action / render_prompt),
episodes of one task share a worker, a crashed worker is replaced, and no worker outlives its host or its parent
process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from environments import list_envs, make_env, register_env
from environments.base import INVALID_ACTION_RULES
from verl_gigpo.rollout import EnvPool, EpisodeConfig, TaskSpec
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.execution.procpool import ProcessEnvHost, RemoteEnv

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def hanging_env():
    """Register the process-hosted gridnav of tests/helpers (in a fixture: see tests/test_env_deadlines.py)."""
    if "gridnav_hang_proc" not in list_envs():
        register_env("gridnav_hang_proc", "gigpo_hanging_env:HangingGridNavProc")


def _replies(info, rng) -> list[str]:
    """Replies to parse: admissible commands in odd spellings, an inadmissible one, broken formats."""
    actions = info["admissible_actions"]
    pick = actions[int(rng.integers(len(actions)))]
    return [
        f"<think>plan</think><action>{pick}</action>",
        f"<action>  {pick.upper()} </action>",
        pick,
        "<action>fly to the moon</action>",
        f"<action>{pick}</action><action>{pick}</action>",
        "<action>unclosed",
        "",
    ]


def test_a_hosted_alfworld_instance_answers_as_a_local_one(alfworld_data, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(alfworld_data))  # inherited by the worker process
    config = EpisodeConfig(max_steps=6, key_mode="state")
    pool = EnvPool(num_workers=1)
    local = make_env("alfworld", max_steps=6, key_mode="state")
    try:
        for seed, steps in ((0, 4), (3, 1)):
            task = TaskSpec("alfworld", seed=seed, split="train")
            assert pool.in_process(task)
            remote = pool.acquire(task, config)
            assert isinstance(remote, RemoteEnv) and remote.thread_parallel is False
            rng = np.random.default_rng(seed)
            observation, info = remote.reset(seed=seed, options={"split": "train"})
            assert (observation, info) == local.reset(seed=seed, options={"split": "train"})
            history = []
            for _ in range(steps):
                assert remote.render_prompt(observation, info, history[-2:]) == local.render_prompt(
                    observation, info, history[-2:]
                )
                for reply in _replies(info, rng):
                    for rule in INVALID_ACTION_RULES:  # the episode runner passes env.invalid_action as rule=
                        assert remote.parse_action(reply, rule=rule) == local.parse_action(reply, rule=rule), reply
                    assert remote.parse_action(reply) == local.parse_action(reply), reply
                action, _ = remote.parse_action(_replies(info, rng)[0])
                result = remote.step(action)
                assert result == local.step(action)
                history.append((observation, action))
                observation, info = result[0], result[-1]
                if result[2] or result[3]:
                    break
            pool.release(task, config, remote)
        assert pool.host.created == 1 and pool.host.reused == 1  # the second task reused the first instance
    finally:
        local.close()
        pool.close()


def test_members_of_a_task_share_a_worker_and_load_spreads():
    host = ProcessEnvHost(2, EnvExecution())
    config = EpisodeConfig(max_steps=4, key_mode="state")
    try:
        key = EnvPool.key(TaskSpec("gridnav_hang_proc", 0), config)
        envs = {
            seed: [host.acquire(TaskSpec("gridnav_hang_proc", seed), config, key).result()[0] for _ in range(3)]
            for seed in (1, 2)
        }
        workers = {seed: {env._slot.index for env in members} for seed, members in envs.items()}
        assert workers[1] != workers[2] and all(len(w) == 1 for w in workers.values())
        for members in envs.values():
            for env in members:
                host.release(env)
    finally:
        host.close()


def test_a_crashed_worker_is_replaced():
    config = EpisodeConfig(max_steps=4, key_mode="state")
    host = ProcessEnvHost(1, EnvExecution(step_timeout_s=10))
    crash = {"hang_at": "exit", "hang_seed": 0, "hang_step": 1}
    key = EnvPool.key(TaskSpec("gridnav_hang_proc", 0, env_kwargs=crash), config)
    try:
        env, _ = host.acquire(TaskSpec("gridnav_hang_proc", 0, env_kwargs=crash), config, key).result()
        host.call(env, "reset", (0, None)).result()
        pid = host.worker_pids()[0]
        with pytest.raises(Exception, match="worker process .* died .exit code 3") as info:
            host.call(env, "step", ("up",)).result()
        assert type(info.value).__name__ == "EnvError" and "env=gridnav_hang_proc" in str(info.value)
        assert not env.alive and host.replaced == 1
        other, _ = host.acquire(TaskSpec("gridnav_hang_proc", 1, env_kwargs=crash), config, key).result()
        (_, next_info), _ = host.call(other, "reset", (1, None)).result()
        assert next_info["step"] == 0 and host.worker_pids()[0] != pid
    finally:
        host.close()


def _wait_exited(pid: int) -> None:
    """Wait until child ``pid`` has exited and can be reaped (left unreaped: its host's ``poll()`` sees it then; a
    zombie leader whose threads are still exiting is not reapable yet)."""
    deadline = time.monotonic() + 30
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"process {pid} still runs after SIGKILL"
        time.sleep(0.05)


def test_a_worker_killed_during_a_call_fails_that_episode_at_once_not_at_its_deadline():
    """SIGKILL of a worker whose step never returns: the call fails as soon as its pipe closes (the 600 s deadline
    is not waited for), naming the process and the signal; the worker is replaced and the next episode plays."""
    config = EpisodeConfig(max_steps=4, key_mode="state")
    host = ProcessEnvHost(1, EnvExecution(step_timeout_s=600))
    hang = {"hang_at": "step", "hang_seed": 0, "hang_step": 1}
    key = EnvPool.key(TaskSpec("gridnav_hang_proc", 0, env_kwargs=hang), config)
    try:
        env, _ = host.acquire(TaskSpec("gridnav_hang_proc", 0, env_kwargs=hang), config, key).result()
        host.call(env, "reset", (0, None)).result()
        pid = host.worker_pids()[0]
        stuck = host.call(env, "step", ("up",))
        while not stuck.running():
            time.sleep(0.01)
        time.sleep(1.0)  # the request is on the wire and the step hangs in the worker
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception, match=f"worker process {pid} died .exit code -9") as info:
            stuck.result(timeout=60)  # a hang until the deadline would fail here
        assert type(info.value).__name__ == "EnvError" and "env=gridnav_hang_proc" in str(info.value)
        assert not env.alive and (host.replaced, host.died_idle, host.restored) == (1, 0, 0)
        other, _ = host.acquire(TaskSpec("gridnav_hang_proc", 1, env_kwargs=hang), config, key).result()
        (_, next_info), _ = host.call(other, "reset", (1, None)).result(timeout=60)
        assert next_info["step"] == 0 and host.worker_pids()[0] != pid
    finally:
        host.close()


def test_a_worker_killed_between_calls_is_replaced_and_its_episodes_go_on_by_replay():
    """SIGKILL of an idle worker holding two episodes: the next request finds it dead, starts a fresh worker and
    rebuilds each instance there by replaying its episode; both episodes go on where they were, none fails."""
    config = EpisodeConfig(max_steps=6, key_mode="state")
    host = ProcessEnvHost(1, EnvExecution(step_timeout_s=60))
    tasks = [TaskSpec("gridnav_hang_proc", seed) for seed in (3, 4)]
    try:
        envs = [host.acquire(task, config, EnvPool.key(task, config)).result()[0] for task in tasks]
        for env, task in zip(envs, tasks, strict=True):
            host.call(env, "reset", (task.seed, None)).result()
            host.call(env, "step", ("up",)).result()
        before = [env.last_anchor_key for env in envs]
        pid = host.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        _wait_exited(pid)
        steps = [host.call(env, "step", ("left",)).result(timeout=60)[0][-1]["step"] for env in envs]
        assert steps == [2, 2]  # each replayed its reset and first step, then took the second
        assert (host.replaced, host.died_idle, host.restored) == (1, 1, 2)
        assert all(env.alive and not env.dead for env in envs) and host.worker_pids()[0] != pid
        assert [env.replay[1] for env in envs] == [("step", ("up",))] * 2 and before[0] is not None
    finally:
        host.close()


def test_no_worker_outlives_a_killed_parent(tmp_path):
    """SIGKILL the process that owns a host: its worker processes end with it (PR_SET_PDEATHSIG / watchdog)."""
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from verl_gigpo.rollout import EnvPool, EpisodeConfig, TaskSpec
            import environments
            environments.register_env("gridnav_hang_proc", "gigpo_hanging_env:HangingGridNavProc")
            pool = EnvPool(num_workers=2)
            config = EpisodeConfig(max_steps=4)
            envs = [pool.acquire(TaskSpec("gridnav_hang_proc", seed), config) for seed in (1, 2)]
            print(" ".join(str(pid) for pid in pool.host.worker_pids()), flush=True)
            time.sleep(600)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers")])}
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 60  # ends as soon as both are gone
        alive = list(pids)
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _alive(pid)]
            time.sleep(0.1)
        assert alive == []
    finally:
        owner.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, already dead but not reaped by its init parent, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
