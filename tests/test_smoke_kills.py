"""The e2e smoke's kills (verl_gigpo.dev.smoke), without verl: the processes of a launch are found by session in
/proc (a real process tree started in a new session), and the smoke's check of a launch that a killed Ray actor
must stop accepts only a stop by itself, with one ``error:`` line naming that process and the relaunch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from verl_gigpo.dev.smoke import KillRecord, RunResult, check_runs, session_processes


def test_the_processes_of_a_launch_are_found_by_its_session():
    child = "[sys.executable, '-c', 'import time; time.sleep(60)', 'child-mark']"
    script = f"import subprocess, sys, time; subprocess.Popen({child}); time.sleep(60)"
    launch = subprocess.Popen([sys.executable, "-c", script, "parent-mark"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        found = []
        while len(found) < 2 and time.monotonic() < deadline:
            found = [(pid, cmd) for pid, cmd in session_processes(launch.pid) if "-mark" in cmd]
            time.sleep(0.05)
        assert [cmd.split()[-1] for _, cmd in found] == ["parent-mark", "child-mark"]
        assert found[0][0] == launch.pid
    finally:
        os.killpg(launch.pid, signal.SIGKILL)
        launch.wait()


def _grpo(returncode: int, output: str, *, hung: bool = False, kill: bool = True) -> RunResult:
    run = RunResult("grpo", Path("unused"), returncode, 60.0, output=output, hung=hung)
    base = {"env/success_rate": 0.5, "episode/num_step_rows": 10, "actor/pg_loss": 0.1, "actor/grad_norm": 1.0}
    # iterations 1 and 2 (checkpointed) before the kill in iteration 3, each with the gap (LoRA: the pass every time)
    run.metrics = [
        {"step": step, **base, "training/global_step": step, "training/rollout_probs_diff_max": 1e-7} for step in (1, 2)
    ]
    if kill:
        run.kills = [KillRecord("rollout server", 4242, "ray::HFGenerationServer", 30.0, None if hung else 2.0)]
    return run


STOP = (
    "error: a process of the run died: the hf rollout server (Ray actor HFGenerationServer gigpo_hf_server_0, pid "
    "4242, node 10.0.0.1) (...). verl does not replace a dead process, so the run stopped. Relaunch the same command "
    "with trainer.resume_mode=auto (the default): ..."
)


def test_the_smoke_check_wants_a_killed_actor_to_stop_its_launch_with_one_line_naming_it():
    assert check_runs({"grpo": _grpo(1, f"...\n{STOP}\n")}, Path("unused")) == []
    [hang] = check_runs({"grpo": _grpo(124, "...", hung=True)}, Path("unused"))
    assert "still running 300 s after the SIGKILL of its rollout server (a hang)" in hang
    [other] = check_runs({"grpo": _grpo(1, f"{STOP.replace('pid 4242', 'pid 7')}\n")}, Path("unused"))
    assert "does not name the rollout server (pid 4242)" in other
    [traceback] = check_runs({"grpo": _grpo(1, "Traceback ...\nRuntimeError: ...\n")}, Path("unused"))
    assert "exit 1, error lines []" in traceback
    [never] = check_runs({"grpo": _grpo(0, "", kill=False)}, Path("unused"))
    assert "the rollout server was never killed" in never
    early = _grpo(1, f"...\n{STOP}\n")
    early.metrics = early.metrics[:1]  # killed before iteration 2 was logged
    [short] = check_runs({"grpo": early}, Path("unused"))
    assert "grpo: expected iterations 1 and 2 before the kill, got [1]" in short
    unchecked = _grpo(1, f"...\n{STOP}\n")
    del unchecked.metrics[1]["training/rollout_probs_diff_max"]  # the LoRA launch checks the gap on every iteration
    [gap] = check_runs({"grpo": unchecked}, Path("unused"))
    assert "grpo (LoRA): iteration 2: rollout-vs-actor gap None" in gap
