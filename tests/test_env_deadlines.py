"""CPU tests of environment deadlines (verl_gigpo.rollout.execution.envcalls / threads / procpool): a hanging
environment ends its episode as a failed one in bounded time, the stuck instance is never reused, hung threads are
written off and replaced, hung worker processes are killed and replaced. Real gridnav episodes, a tiny real model, real
threads and processes; the hang is a real blocked call (tests/helpers/gigpo_hanging_env.py)."""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import gigpo_hanging_env
import pytest
from episode_play import play_episodes
from transformers import AutoModelForCausalLM, AutoTokenizer

from environments import list_envs, register_env
from verl_gigpo.local.server import LocalGenerationServer
from verl_gigpo.rollout import EnvPool, EpisodeConfig, TaskSpec
from verl_gigpo.rollout.execution import EnvDeadlineError, EnvExecution
from verl_gigpo.rollout.execution.threads import CallAbandoned, EnvThreadPool, TurnLock
from verl_gigpo.rollout.metrics import episode_metrics, summaries_from_episodes

CONFIG = EpisodeConfig(max_steps=5, max_prompt_length=512, max_response_length=3, key_mode="state")
DEADLINE = EnvExecution(step_timeout_s=1.0, reset_timeout_s=1.0)
#: a hung call blocks until gigpo_hanging_env.RELEASE, so a test returning at all shows its deadline fired; if a
#: deadline ever fails to fire, this guard releases the hang instead of stalling the suite, and the test then fails
#: on its assertions (the episodes played instead of failing). No test asserts how long anything took.
STALL_GUARD_S = 300.0
#: how long a test waits for a released thread or a killed process to finish (the waits end as soon as it has)
SETTLE_S = 60.0


@pytest.fixture(autouse=True)
def stall_guard():
    fired = threading.Event()

    def release():
        fired.set()
        gigpo_hanging_env.RELEASE.set()

    timer = threading.Timer(STALL_GUARD_S, release)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()
    if fired.is_set():
        gigpo_hanging_env.RELEASE.clear()
        pytest.fail(f"a hung call was still blocked after {STALL_GUARD_S:.0f} s: its deadline never fired")


@pytest.fixture(autouse=True, scope="module")
def hanging_envs():
    """Register the hanging gridnavs (in a fixture: at import they would join tests/test_env_registry.py's
    parametrisation over every registered environment)."""
    for name, cls in (("gridnav_hang", "HangingGridNav"), ("gridnav_hang_proc", "HangingGridNavProc")):
        if name not in list_envs():
            register_env(name, f"gigpo_hanging_env:{cls}")


@pytest.fixture(scope="module")
def served(action_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(action_model_dir)
    model = AutoModelForCausalLM.from_pretrained(action_model_dir)
    return tokenizer, LocalGenerationServer(model, tokenizer, seed=0)


def _play(served, tasks, **kwargs):
    return play_episodes(served, tasks, CONFIG, **kwargs)


def _tasks(env_name: str, **hang) -> list[TaskSpec]:
    """Task seed 0 hangs (``hang``: hang_at / hang_step), seeds 1 and 2 play normally; two episodes each."""
    kwargs = {"min_path": 4, "hang_seed": 0, **hang}
    return [TaskSpec(env_name, seed=s, env_kwargs=kwargs) for s in (0, 1, 2) for _ in range(2)]


# ------------------------------------------------------------------------------------------------ the thread pool
def test_an_abandoned_call_gets_its_thread_replaced_and_closes_late():
    pool = EnvThreadPool(1)
    release = threading.Event()
    stuck = pool.submit(release.wait)
    while stuck.started_at is None:
        time.sleep(0.001)
    late = []
    assert pool.abandon(stuck) and stuck.abandoned
    stuck.add_done_callback(lambda f: late.append(threading.current_thread().name))
    assert (pool.abandoned_running, pool.abandoned_total) == (1, 1)
    # the one-thread pool still serves calls while the abandoned one blocks
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    release.set()
    stuck.result(timeout=5)
    assert late and late[0] != threading.current_thread().name  # the callback ran in the abandoned thread
    deadline = time.monotonic() + SETTLE_S
    while pool.abandoned_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (pool.abandoned_running, pool.abandoned_total) == (0, 1)
    assert not pool.abandon(stuck)  # finished calls cannot be abandoned
    pool.shutdown()


def test_turns_go_in_arrival_order_and_pass_on_when_a_call_is_abandoned():
    pool, turn = EnvThreadPool(4), TurnLock()
    release, order = threading.Event(), []
    stuck = pool.submit(release.wait, turn=turn)
    while stuck.started_at is None:
        time.sleep(0.001)
    waiting = []
    for i in range(3):
        waiting.append(pool.submit(order.append, i, turn=turn))
        time.sleep(0.05)  # arrival order 0, 1, 2
    time.sleep(0.2)
    assert all(f.started_at is None for f in waiting)  # queued for the turn: their deadline clocks have not started
    assert pool.abandon(stuck)  # the hung holder's turn passes on
    for f in waiting:
        f.result(timeout=5)
    assert order == [0, 1, 2]
    release.set()
    stuck.result(timeout=5)
    pool.submit(order.append, 3, turn=turn).result(timeout=5)  # the late return did not hand out a second turn
    assert order == [0, 1, 2, 3]
    pool.shutdown()


def test_inline_pool_abandons_a_call_past_its_deadline():
    pool = EnvThreadPool(0)
    release = threading.Event()
    with pytest.raises(CallAbandoned) as info:
        pool.call_inline(release.wait, (), 0.3)
    # the call was given its full time before being written off (less a few ms: a timed wait may return that early)
    assert info.value.waited_s >= 0.29
    assert pool.abandoned_running == 1
    assert pool.call_inline(lambda x: x + 1, (1,), 1.0).result() == 2  # a fresh helper thread serves the next call
    assert pool.call_inline(lambda x: x + 1, (2,), None).result() == 3  # no deadline: on the caller's thread
    release.set()
    info.value.future.result(timeout=5)
    deadline = time.monotonic() + SETTLE_S
    while pool.abandoned_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.abandoned_running == 0


def test_deadline_settings_are_checked_with_the_config_key():
    assert EnvExecution.from_config({"step_timeout_s": None}).step_timeout_s is None
    assert EnvExecution.from_config({}).reset_timeout_s == 300.0
    with pytest.raises(ValueError, match="env.step_timeout_s"):
        EnvExecution.from_config({"step_timeout_s": 0})
    with pytest.raises(ValueError, match="env.reset_timeout_s"):
        EnvExecution.from_config({"reset_timeout_s": "soon"})
    with pytest.raises(ValueError, match="env.num_workers"):
        EnvExecution.from_config({"num_workers": -1})
    assert EnvExecution(num_workers="auto").resolve_workers(engine_processes=8, cpus=64) == 8
    assert EnvExecution(num_workers="auto").resolve_workers(engine_processes=8, cpus=4) == 1
    assert EnvExecution(num_workers=3).resolve_workers(engine_processes=8, cpus=64) == 3


# ------------------------------------------------------------------------------------------------ episodes
def _check_failed_episodes(episodes, caplog, *, call: str, step: int):
    """Seed 0's episodes failed with a deadline error naming the environment, task, step and seconds; each logged one
    warning line; the others played normally."""
    for ep in episodes:
        if ep.task.seed == 0:
            assert ep.env_error.startswith("EnvDeadlineError") and f"{call}() gave no answer" in ep.env_error
            assert f"step={step}" in ep.env_error and "env=gridnav_hang" in ep.env_error
            assert "_timeout_s=1 s" in ep.env_error and gigpo_hanging_env.waited_seconds(ep.env_error) >= 1.0
            assert ep.length == step - 1 if call == "step" else ep.length == 0
        else:
            assert ep.env_error is None and ep.length >= 1
    lines = [r for r in caplog.records if r.levelno == logging.WARNING and "gave no answer" in r.getMessage()]
    assert len(lines) == 2 and {r.getMessage().split(":")[0] for r in lines} == {"episode traj0", "episode traj1"}


@pytest.mark.parametrize(
    ("threads", "env_name"),
    [(4, "gridnav_hang"), (0, "gridnav_hang"), (4, "gridnav_hang_proc")],
    ids=["threads", "inline", "threads-taking-turns"],  # the last: thread_parallel=False run in threads
)
def test_a_hanging_step_fails_its_episode_and_the_thread_is_abandoned(served, caplog, threads, env_name):
    pool, executor = EnvPool(), EnvThreadPool(threads)
    gigpo_hanging_env.CLOSED.clear()
    with caplog.at_level(logging.WARNING):
        episodes = _play(served, _tasks(env_name), executor=executor, env_pool=pool, execution=DEADLINE)
    _check_failed_episodes(episodes, caplog, call="step", step=2)
    assert [ep.abandoned_threads for ep in episodes] == [1, 1, 0, 0, 0, 0]
    metrics = episode_metrics(summaries_from_episodes(episodes))
    assert metrics["env/env_error_rate"] == pytest.approx(2 / 6) and metrics["env/abandoned_threads"] == 2.0
    assert executor.abandoned_running == 2
    # the stuck instances were not given back: the pool holds the four good ones only
    assert len(pool) == 4 and not any(env.hung for group in pool._idle.values() for env in group)
    gigpo_hanging_env.RELEASE.set()  # the hung calls return: their threads close the instances and leave
    try:
        deadline = time.monotonic() + SETTLE_S
        while executor.abandoned_running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert executor.abandoned_running == 0
        assert sum(env.hung for env in gigpo_hanging_env.CLOSED) == 2
    finally:
        gigpo_hanging_env.RELEASE.clear()
    pool.close()


def test_a_hanging_reset_fails_its_episode(served, caplog):
    executor = EnvThreadPool(4)
    with caplog.at_level(logging.WARNING):
        episodes = _play(
            served, _tasks("gridnav_hang", hang_at="reset"), executor=executor, env_pool=EnvPool(), execution=DEADLINE
        )
    _check_failed_episodes(episodes, caplog, call="reset", step=0)
    assert all("env.reset_timeout_s=1 s" in ep.env_error for ep in episodes if ep.task.seed == 0)
    gigpo_hanging_env.RELEASE.set()
    gigpo_hanging_env.RELEASE.clear()


def test_a_hanging_step_in_a_worker_process_kills_and_replaces_it(served, caplog):
    """One worker process hosts all six episodes: seed 0's hung step kills it; the other episodes in it are rebuilt
    in the fresh worker by replaying their steps and finish normally."""
    pool = EnvPool(num_workers=1, execution=DEADLINE)
    try:
        with caplog.at_level(logging.WARNING):
            episodes = _play(served, _tasks("gridnav_hang_proc"), env_pool=pool, execution=DEADLINE)
        host = pool.host
        for ep in episodes:
            if ep.task.seed == 0:  # each member of the hanging task reaches step 2 and kills its worker
                assert ep.env_error.startswith("EnvDeadlineError") and "step() gave no answer" in ep.env_error
                assert "killed and is replaced" in ep.env_error and "env=gridnav_hang_proc" in ep.env_error
                assert ep.length == 1 and ep.abandoned_threads == 0
            else:
                assert ep.env_error is None and ep.length >= 1
        assert host.replaced == 2 and host.started == 3 and host.restored >= 1
        killed = [int(ep.env_error.split("worker process ")[1].split()[0]) for ep in episodes if ep.task.seed == 0]
        for pid in killed:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        # the fresh worker serves the next episodes
        again = _play(served, _tasks("gridnav_hang_proc", hang_seed=-1), env_pool=pool, execution=DEADLINE)
        assert all(ep.env_error is None for ep in again)
        pids = host.worker_pids()
        assert len(pids) == 1
    finally:
        pool.close()
    for pid in pids:  # no orphan: the worker ended with the pool
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_deadline_errors_are_environment_errors():
    error = EnvDeadlineError(
        "alfworld", "pick/trial_1", 3, call="step", waited_s=60.2, key="env.step_timeout_s=60 s", remedy="dropped"
    )
    assert str(error) == (
        "[env=alfworld task=pick/trial_1 step=3] step() gave no answer within env.step_timeout_s=60 s "
        "(waited 60.2 s); dropped"
    )


# ------------------------------------------------------------------------------------------------ both engines' keys
def test_local_engine_run_with_a_hanging_environment_finishes(tiny_model_dir, tmp_path, caplog):
    """A short local-engine run whose validation task seed 0 hangs at step 2 (inline environment calls, the default):
    each validation fails that episode after env.step_timeout_s and the run goes on."""
    from verl_gigpo.local.train import LocalTrainer, load_config

    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.default_local_dir={tmp_path}",
            "env.name=gridnav_hang",
            "env.kwargs.hang_seed=0",
            "env.kwargs.min_path=4",
            "env.max_steps=5",
            "env.step_timeout_s=1",
            "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=2",
            "data.val_size=2",
            "trainer.total_training_steps=1",
            "local.progress=false",
            "local.plot=false",
        ]
    )
    trainer = LocalTrainer(cfg)
    try:
        with caplog.at_level(logging.WARNING):
            history = trainer.fit()
    finally:
        trainer.close()
        gigpo_hanging_env.RELEASE.set()
        gigpo_hanging_env.RELEASE.clear()
    first, last = history[0], history[-1]
    for metrics in (first, last):  # validation before and after the iteration: seed 0 hung, seed 1 played
        assert metrics["val/env_error_rate"] == 0.5 and metrics["val/abandoned_threads"] == 1.0
    assert last["env/abandoned_threads"] == 0.0 and last["training_step"] == 1.0
    lines = [r.getMessage() for r in caplog.records if "gave no answer" in r.getMessage()]
    assert len(lines) == 2 and all("env.step_timeout_s=1 s" in line and "step=2" in line for line in lines)


def test_the_local_engine_checks_the_execution_keys():
    from verl_gigpo.local.train import load_config

    assert load_config(["env.step_timeout_s=null"]).env.step_timeout_s is None
    with pytest.raises(ValueError, match=r"env\.step_timeout_s=-1 .*> 0.*null"):
        load_config(["env.step_timeout_s=-1"])
    with pytest.raises(ValueError, match=r"env\.num_workers='many' .*>= 0.*'auto'"):
        load_config(["env.num_workers=many"])


def test_preflight_checks_the_execution_keys():
    from hydra import compose, initialize_config_dir

    from verl_gigpo.verl_glue.preflight import config_problems

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with initialize_config_dir(config_dir=os.path.join(root, "verl_gigpo", "config"), version_base=None):
        good = compose(config_name="gigpo_trainer", overrides=["env.step_timeout_s=null", "env.num_workers=0"])
        bad = compose(config_name="gigpo_trainer", overrides=["env.reset_timeout_s=0", "env.num_workers=-2"])
    assert config_problems(good) == []
    problems = config_problems(bad)
    assert len(problems) == 1 and re.match(r"env\.reset_timeout_s=0 .*> 0", problems[0])
