"""Smoke-test verl's own pipeline end to end on this machine's CPU (``make e2e``).

    make e2e                                            # = python -m verl_gigpo.dev.smoke
    python -m verl_gigpo.dev.smoke --out runs/e2e --model artifacts/tiny-model-actions
    python -m verl_gigpo.dev.smoke --ranks 2            # 2 FSDP ranks over gloo (slower)

Runs ``python -m verl_gigpo.main platform=cpu`` on gridnav with a tiny model four times: ``gigpo`` (its agent-loop
worker killed in iteration 3), ``gigpo_changed`` (a changed training key, refused before Ray), ``gigpo_resume``
(resumes, trains to iteration 4) and ``grpo`` with LoRA (its rollout server killed in iteration 3). Then it checks
the launches' files (:func:`check_runs`) and exits 1 if a check fails. What runs and what is checked:
docs/cpu-smoke.md ("make e2e").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gigpo.config.resume import POINTER
from verl_gigpo.rollout.seeding import HOLD_STREAM_ENV
from verl_gigpo.verl_glue.metrics_file import METRICS_NAME, iteration_gaps, read_metrics, training_steps

__all__ = [
    "DEFAULT_MODEL",
    "RunResult",
    "check_runs",
    "emptied",
    "ensure_model",
    "pipeline_overrides",
    "read_metrics",
    "run_pipeline",
    "run_smoke",
    "val_metric",
    "weight_sync_report",
]

#: the training key the ``gigpo_changed`` launch changes (it must stop before Ray, naming it)
CHANGED_KEY = "algorithm.gigpo.step_advantage_w"

#: the model ``make e2e`` builds when missing
DEFAULT_MODEL = "artifacts/tiny-model-actions"

#: metrics every training iteration must log (``gigpo/*`` in addition for GiGPO runs)
ITERATION_METRICS = ("env/success_rate", "episode/num_step_rows", "actor/pg_loss", "actor/grad_norm")

#: largest |p_rollout - p_actor| of a token (``training/rollout_probs_diff_max``) allowed at a launch's first
#: iteration: the rollout server holds the actor's exact fp32 weights (measured <= 1.1e-6)
ROLLOUT_GAP_LIMIT = 1e-4


def val_metric(row: dict[str, Any]) -> str | None:
    """The key of verl's core validation metric in a logged row (``val-core/<data source>/acc/mean@1``), or None."""
    keys = sorted(k for k in row if k.startswith("val-core/") and k.endswith("/acc/mean@1"))
    return keys[0] if keys else None


#: what the three runs use besides the model and the data; small enough for ~1 minute of training per run
SMOKE_SETTINGS: tuple[str, ...] = (
    "algorithm.gigpo.key_mode=state",
    "env.name=gridnav",
    "env.max_steps=6",
    "env.history_length=2",
    "data.train_batch_size=4",
    "data.max_prompt_length=256",
    "data.max_response_length=3",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    # a KL loss makes verl build the reference worker, so the smoke test covers it
    "actor_rollout_ref.actor.use_kl_loss=true",
    "trainer.total_epochs=100",
    "trainer.test_freq=100",
    "trainer.logger=[console,file]",
    "trainer.project_name=verl_gigpo_smoke",
)


#: the ``grpo`` launch's LoRA settings (verl's keys; the recipes' ``LORA_RANK=8 LORA_ALPHA=16``): an adapter on every
#: linear layer, the reference policy as the actor with its adapter disabled, verl's unmerged sync (the base weights
#: once, then the adapter after every update); verl's old-log-prob pass on every iteration, so that every iteration
#: logs the rollout-vs-actor gap (the adapter the server merged against the actor's)
LORA_RANK, LORA_ALPHA = 8, 16
LORA_SETTINGS = (
    f"actor_rollout_ref.model.lora_rank={LORA_RANK}",
    f"actor_rollout_ref.model.lora_alpha={LORA_ALPHA}",
    "actor_rollout_ref.model.target_modules=all-linear",
    "trainer.v1.gigpo_sync.logprob_check_freq=1",
)

#: seconds a launch may take to end by itself after one of its processes was killed (a stop, not a hang)
STOP_BOUND_S = 300.0

#: the request-seed stream of the iteration the gigpo launch is killed in and the resumed launch plays again
RESUMED_STREAM = "train:3:"

#: what each kill targets: the title Ray gives an actor's process (``ray::<class>``), or our worker's command line
AGENT_LOOP_WORKER = "ray::AgentLoopWorkerTQ"
ROLLOUT_SERVER = "ray::HFGenerationServer"
ENV_WORKER = "verl_gigpo.rollout.execution.procworker"


@dataclass
class Kill:
    """A SIGKILL, once ``when()`` is true, of the first process of the launch whose command line contains ``target``.
    ``fatal``: the launch must then stop by itself within :data:`STOP_BOUND_S`, else go on."""

    label: str
    target: str
    when: Callable[[], bool]
    fatal: bool = False


@dataclass
class KillRecord:
    """A kill as it happened: ``pid``, command line, second of the launch, and for a fatal kill the seconds until the
    launch ended (``stopped_after_s``; None: a hang)."""

    label: str
    pid: int
    cmdline: str
    at_s: float
    stopped_after_s: float | None = None


def session_processes(session: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the live processes of session ``session``, read from ``/proc`` (Ray workers show
    ``ray::<actor class>...``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state ppid pgrp session ...
        if fields[0] != "Z" and int(fields[3]) == session:
            found.append((int(entry.name), cmdline))
    return sorted(found)


@dataclass
class RunResult:
    """One launch: name, folder, exit status, seconds, the metrics rows it logged, the experiment's whole metrics file
    after it (``history``), whether it was killed, its output, its start time and start-up timeline."""

    name: str
    run_dir: Path
    returncode: int
    seconds: float
    metrics: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    killed: bool = False
    output: str = ""
    started: float = 0.0
    timeline: Path | None = None
    kills: list[KillRecord] = field(default_factory=list)
    hung: bool = False

    def kill(self, label: str) -> KillRecord | None:
        """The kill named ``label`` that happened in this launch, or None."""
        return next((k for k in self.kills if k.label == label), None)

    def error_lines(self) -> list[str]:
        """The lines of this launch's output that start with ``error: `` (the one-line refusals and stops)."""
        return [line for line in self.output.splitlines() if line.startswith("error: ")]

    @property
    def log(self) -> Path:
        """The run's console output (all launches in the folder append to it)."""
        return self.run_dir / "train.log"

    @property
    def metrics_file(self) -> Path:
        """The experiment's metrics file (``trainer.default_local_dir/metrics.jsonl``)."""
        return self.run_dir / "ckpt" / METRICS_NAME


def ensure_model(model_dir: str | Path) -> Path:
    """Build the gridnav tiny model with the action format at ``model_dir`` unless a model is already there."""
    model_dir = Path(model_dir)
    if (model_dir / "config.json").exists():
        return model_dir
    from verl_gigpo.dev.tiny_model import build_tiny_model, sft_action_format

    print(f"building the tiny model in {model_dir} (random weights + 40 supervised steps on the action format)")
    build_tiny_model(model_dir, envs=("gridnav",))
    return sft_action_format(model_dir)


def pipeline_overrides(
    *,
    model_dir: Path,
    data_dir: Path,
    run_dir: Path,
    estimator: str,
    total_steps: int,
    ranks: int = 1,
    val_before_train: bool = True,
    save_freq: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The Hydra overrides of one smoke run of ``python -m verl_gigpo.main`` (``platform=cpu`` first)."""
    return [
        "platform=cpu",
        f"algorithm.adv_estimator={estimator}",
        *SMOKE_SETTINGS,
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        f"trainer.n_gpus_per_node={ranks}",
        f"trainer.total_training_steps={total_steps}",
        f"trainer.save_freq={save_freq}",
        f"trainer.val_before_train={str(val_before_train).lower()}",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        f"trainer.experiment_name={run_dir.name}",
        *extra,
    ]


def run_pipeline(
    name: str,
    run_dir: Path,
    overrides: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    stop_when: Callable[[], bool] | None = None,
    kills: Sequence[Kill] = (),
    timeline: bool = False,
) -> RunResult:
    """Launch ``python -m verl_gigpo.main OVERRIDES`` in its own process group, output appended to ``train.log``.

    When ``stop_when()`` (polled every 0.5 s) turns true the group is killed (``killed``); each of ``kills`` fires at
    its moment, and a launch that does not end within :data:`STOP_BOUND_S` of a fatal one is killed as ``hung``.
    With ``timeline``, every process records its start-up phases in ``run_dir/timeline_<name>.jsonl``.
    """
    from verl_gigpo.dev.timeline import ENV as TIMELINE_ENV

    run_dir.mkdir(parents=True, exist_ok=True)
    timeline_path = run_dir / f"timeline_{name}.jsonl" if timeline else None
    if timeline_path is not None:
        timeline_path.write_text("")
    child_env = {
        **{k: v for k, v in os.environ.items() if k not in ("VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT")},
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "GIGPO_HF_DUMP_WEIGHTS_DIR": str(run_dir / "synced_weights"),
        TIMELINE_ENV: str(timeline_path or ""),
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "verl_gigpo.main", *overrides]
    print(f"[{name}] python -m verl_gigpo.main ... (log: {run_dir / 'train.log'})", flush=True)
    launches_before = len(list((run_dir / "ckpt" / "launches").glob("launch_*.json")))
    log_start = (run_dir / "train.log").stat().st_size if (run_dir / "train.log").exists() else 0
    started = time.time()
    start = time.perf_counter()
    killed = hung = False
    pending, done = list(kills), []
    stop_by: float | None = None  # after a fatal kill: the launch must have ended by then
    with open(run_dir / "train.log", "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        while True:
            try:
                returncode = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            for kill in [k for k in pending if k.when()]:
                target = next((p for p in session_processes(proc.pid) if kill.target in p[1]), None)
                if target is None:
                    continue  # not started yet: next poll
                os.kill(target[0], signal.SIGKILL)
                pending.remove(kill)
                done.append((kill, KillRecord(kill.label, target[0], target[1], time.perf_counter() - start)))
                log.write(f"\n[smoke] SIGKILL to the {kill.label}, pid {target[0]} ({target[1]})\n")
                log.flush()
                if kill.fatal:
                    stop_by = time.perf_counter() + STOP_BOUND_S
            hang = stop_by is not None and time.perf_counter() > stop_by
            over_time = time.perf_counter() - start > timeout
            if hang or over_time or (stop_when is not None and stop_when()):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                hung, killed = hang, not (over_time or hang)
                returncode = -signal.SIGKILL if killed else 124
                why = f"no stop {STOP_BOUND_S:.0f} s after a fatal kill" if hang else f"killed after {timeout:.0f} s"
                log.write(f"\n[smoke] {'killed on purpose' if killed else why}\n")
                break
    seconds = time.perf_counter() - start
    for kill, record in done:
        if kill.fatal and not hung:
            record.stopped_after_s = seconds - record.at_s
            print(f"[{name}] ended by itself {record.stopped_after_s:.1f} s after the SIGKILL of its {kill.label}")
    print(f"[{name}] {'killed on purpose' if killed else f'exit {returncode}'} after {seconds:.0f} s", flush=True)
    result = RunResult(name, run_dir, returncode, seconds, killed=killed, started=started, timeline=timeline_path)
    result.kills, result.hung = [record for _, record in done], hung
    with open(run_dir / "train.log", "rb") as log:
        log.seek(log_start)
        result.output = log.read().decode(errors="replace")
    result.history = read_metrics(result.metrics_file)
    records = sorted((run_dir / "ckpt" / "launches").glob("launch_*.json"))
    if len(records) > launches_before:  # this launch got past the checks: its rows follow the ones it kept
        kept = json.loads(records[-1].read_text()).get("metrics_rows", 0)
        result.metrics = result.history[kept:]
    return result


def emptied(folder: str | Path) -> Path:
    """``folder``, deleted if it exists: a smoke's launches start from no checkpoint (a kept one would be resumed)."""
    import shutil

    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    return folder


def checkpointed_and_logged(run_dir: Path, step: int) -> Callable[[], bool]:
    """A ``stop_when``: true once verl's pointer names ``step`` and the metrics file holds iteration ``step``."""
    pointer = run_dir / "ckpt" / POINTER

    def done() -> bool:
        if not pointer.exists() or pointer.read_text().strip() != str(step):
            return False
        return step in training_steps(read_metrics(run_dir / "ckpt" / METRICS_NAME))

    return done


def logged(run_dir: Path, step: int) -> Callable[[], bool]:
    """A :class:`Kill` moment: true once the metrics file holds a row of ``step`` (0: the first validation)."""
    path = run_dir / "ckpt" / METRICS_NAME
    return lambda: any(row.get("step") == step for row in read_metrics(path))


def all_of(*moments: Callable[[], bool]) -> Callable[[], bool]:
    """A :class:`Kill` moment: true once every one of ``moments`` is (checked in order)."""
    return lambda: all(moment() for moment in moments)


def transcribed(run_dir: Path, stream_prefix: str) -> Callable[[], bool]:
    """A :class:`Kill` moment: true once the transcripts hold a step of an unfailed episode whose seed stream starts
    with ``stream_prefix`` (``train:3:``: an episode of iteration 3 was played to its end)."""
    folder = run_dir / "transcripts"

    def done() -> bool:
        for path in folder.glob("transcripts_*.jsonl") if folder.is_dir() else []:
            for line in path.read_text().splitlines():
                if f'"stream": "{stream_prefix}' not in line:
                    continue
                try:
                    if not json.loads(line)["env_error"]:
                        return True
                except ValueError:  # a line still being written
                    continue
        return False

    return done


def resume_replay(run_dir: Path, stream_prefix: str = RESUMED_STREAM) -> tuple[int, list[str]]:
    """``(steps compared, problems)``: the killed launch's steps in streams ``stream_prefix*`` that the resumed launch
    played again (keyed by stream, member, step), which must give the same replies; failed episodes are skipped."""
    from verl_gigpo.rollout.transcripts import read_transcripts

    plays: dict[tuple, list[tuple]] = {}
    for r in read_transcripts(run_dir / "transcripts"):
        # an episode whose environment failed is left out: the e2e's faulty environment fails every n-th reset of a
        # process, so which episodes fail depends on the launch, not on the seeds
        if str(r.get("stream", "")).startswith(stream_prefix) and not r["env_error"]:
            key = (r["stream"], r["member"], r["step"])
            plays.setdefault(key, []).append((r["seed"], r["response"], r["action"], r["step_reward"]))
    twice = {key: p for key, p in plays.items() if len(p) == 2}
    problems = [
        f"gigpo_resume: {key} was played {p[0]} by the killed launch, {p[1]} after the resume"
        for key, p in twice.items()
        if p[0] != p[1]
    ]
    return len(twice), problems


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def weight_sync_report(run_dir: Path, model_dir: Path) -> list[dict[str, Any]]:
    """One entry per weight sync in ``run_dir/synced_weights/``, compared with what the actor held then (the initial
    model at step 0, else the checkpoint of that step): ``file``, ``step``, ``reference``, ``same_names``,
    ``max_abs_diff`` (server vs reference) and ``moved`` (reference vs initial model)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from verl_gigpo.export import fsdp_full_state_dict

    # the model's own state dict (tied weights such as lm_head appear under both names, as the actor sends them)
    initial = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}
    report = []
    dumps = (run_dir / "synced_weights").glob("sync*_step*_replica*.safetensors")
    for dump in sorted(dumps, key=lambda p: (p.stat().st_mtime, p.name)):  # in the order the syncs happened
        step = int(dump.stem.split("_step", 1)[1].split("_", 1)[0])
        ckpt = run_dir / "ckpt" / f"global_step_{step}"
        if step == 0:
            reference, name = initial, "initial"
        elif ckpt.is_dir():
            reference, name = fsdp_full_state_dict(ckpt / "actor"), ckpt.name
        else:
            report.append({"file": dump.name, "step": step, "reference": None})
            continue
        server = load_file(dump)
        report.append(
            {
                "file": dump.name,
                "step": step,
                "reference": name,
                "same_names": set(server) == set(reference),
                "max_abs_diff": max(float((server[k].float() - reference[k].float()).abs().max()) for k in server),
                "moved": max(float((reference[k].float() - initial[k].float()).abs().max()) for k in initial),
            }
        )
    return report


def check_runs(runs: dict[str, RunResult], model_dir: Path) -> list[str]:
    """What is wrong with a smoke run (empty when everything holds; the checks of docs/cpu-smoke.md)."""
    problems = []
    for name, run in runs.items():
        if name == "gigpo_changed":
            continue  # refused on purpose: checked below
        if name in STOPPING_KILLS:
            label, role = STOPPING_KILLS[name]
            problems += _stop_problems(run, label, role)
        elif run.returncode != 0:
            problems.append(f"{name}: exit status {run.returncode} (see {run.log})")
            continue
        train_rows = [m for m in run.metrics if "actor/pg_loss" in m]
        needed = [*ITERATION_METRICS, *(["gigpo/step_group_size_mean"] if name.startswith("gigpo") else [])]
        for row in train_rows:
            missing = [k for k in needed if not _finite(row.get(k))]
            if missing:
                problems.append(f"{name}: iteration {row['step']} lacks finite {missing}")
        if not train_rows:
            problems.append(f"{name}: no training iteration was logged")
        elif not _finite(gap := train_rows[0].get("training/rollout_probs_diff_max")):
            # the launch's first iteration recomputes the old log-probs even in bypass mode (logprob_check_freq)
            problems.append(
                f"{name}: iteration {train_rows[0]['step']} logged no rollout-vs-actor gap "
                "(training/rollout_probs_diff_max); with algorithm.rollout_correction.bypass_mode=true keep "
                "trainer.v1.gigpo_sync.logprob_check_freq >= 1"
            )
        elif not gap <= ROLLOUT_GAP_LIMIT:
            problems.append(
                f"{name}: iteration {train_rows[0]['step']}: the rollout server's and the actor's token probabilities "
                f"differ by {gap:.3g} (allowed {ROLLOUT_GAP_LIMIT}): the served weights are not the actor's"
            )
    lora = runs.get("grpo")
    if lora is not None and lora.kill(STOPPING_KILLS["grpo"][0]) is not None:
        rows = [m for m in lora.metrics if "actor/pg_loss" in m]
        if training_steps(lora.metrics) != [1, 2]:
            problems.append(f"grpo: expected iterations 1 and 2 before the kill, got {training_steps(lora.metrics)}")
        for row in rows:  # the old-log-prob pass on every iteration: the adapter the server merged, checked
            gap = row.get("training/rollout_probs_diff_max")
            if not (_finite(gap) and gap <= ROLLOUT_GAP_LIMIT):
                problems.append(f"grpo (LoRA): iteration {row['step']}: rollout-vs-actor gap {gap}")
    first, changed, resumed = runs.get("gigpo"), runs.get("gigpo_changed"), runs.get("gigpo_resume")
    crashed = first is not None and first.kill(STOPPING_KILLS["gigpo"][0]) is not None
    if crashed:
        if training_steps(first.metrics) != [1, 2]:
            problems.append(f"gigpo: expected iterations 1 and 2 before the kill, got {training_steps(first.metrics)}")
        env_kill = first.kill("environment worker")
        if env_kill is not None and f"process {env_kill.pid} died" not in first.output:
            problems.append(f"gigpo: the killed environment worker process {env_kill.pid} was not reported replaced")
        if not any(val_metric(m) and m["step"] == 0 for m in first.metrics):
            problems.append("gigpo: no validation before training (val-core/*/acc/mean@1 at step 0)")
    if changed is not None:
        if changed.returncode == 0 or "cannot resume" not in changed.output or CHANGED_KEY not in changed.output:
            problems.append(f"gigpo_changed: a changed {CHANGED_KEY} was not refused by name (see {changed.log})")
        if "ray init kwargs" in changed.output:  # verl's run_ppo prints this just before ray.init
            problems.append("gigpo_changed: Ray started although the launch had to stop before it")
    if resumed is not None and resumed.returncode == 0:
        if "[verl_gigpo] resuming experiment" not in resumed.output:
            problems.append("gigpo_resume: the launch did not say that it resumes, and from where")
        missing, repeated = iteration_gaps(resumed.history)
        if sorted(training_steps(resumed.history)) != [1, 2, 3, 4] or missing or repeated:
            problems.append(
                f"gigpo_resume: {resumed.metrics_file} should hold iterations 1-4 once each after the resume, holds "
                f"{training_steps(resumed.history)}"
            )
        if not any(val_metric(m) and m["step"] == 4 for m in resumed.metrics):
            problems.append("gigpo_resume: no final validation (val-core/*/acc/mean@1 at step 4)")
        if not any(val_metric(m) and m["step"] == 0 for m in resumed.history):
            problems.append(f"gigpo_resume: the validation before training is gone from {resumed.metrics_file}")
        compared, differing = resume_replay(resumed.run_dir)
        problems += differing
        if compared == 0:
            problems.append("gigpo_resume: no episode of iteration 3 was played by both launches to compare")
    if crashed:
        report = weight_sync_report(first.run_dir, model_dir)
        synced_steps = sorted({e["step"] for e in report})
        expected = {0, 1, 2, 3, 4} if resumed is not None and resumed.returncode == 0 else {0, 1, 2}
        if not expected <= set(synced_steps):
            problems.append(
                f"gigpo: the rollout server received weights at steps {synced_steps}, expected {sorted(expected)}"
            )
        for entry in report:
            if entry["reference"] is None:
                problems.append(f"gigpo: no actor checkpoint of step {entry['step']} to compare {entry['file']} with")
            elif not entry["same_names"] or entry["max_abs_diff"] != 0.0:
                problems.append(
                    f"gigpo: {entry['file']}: the rollout server's weights differ from the actor's "
                    f"({entry['reference']}; max |diff| {entry['max_abs_diff']:.3g})"
                )
            elif entry["step"] > 0 and not entry["moved"] > 0.0:
                problems.append(f"gigpo: the actor's weights at step {entry['step']} still equal the initial model's")
    return problems


#: the launches that a SIGKILL of one of their Ray actors stops: the kill's label and how the stop line names it
STOPPING_KILLS = {
    "gigpo": ("agent-loop worker", "agent-loop worker (Ray actor AgentLoopWorkerTQ"),
    "grpo": ("rollout server", "hf rollout server (Ray actor HFGenerationServer"),
}


def _stop_problems(run: RunResult, label: str, role: str) -> list[str]:
    """What is wrong with a launch the SIGKILL of its ``label`` process had to stop: it must end in time with exit
    status 1 and one ``error:`` line naming the process and the relaunch."""
    kill = run.kill(label)
    if kill is None:
        return [f"{run.name}: the {label} was never killed (no such process found; see {run.log})"]
    if run.hung:
        return [f"{run.name}: still running {STOP_BOUND_S:.0f} s after the SIGKILL of its {label} (a hang)"]
    errors = run.error_lines()
    if run.returncode != 1 or len(errors) != 1:
        return [f"{run.name}: after the SIGKILL of its {label}: exit {run.returncode}, error lines {errors}"]
    if f"{role}" not in errors[0] or f"pid {kill.pid}" not in errors[0] or "trainer.resume_mode=auto" not in errors[0]:
        return [f"{run.name}: the stop line does not name the {label} (pid {kill.pid}) and the relaunch: {errors[0]}"]
    return []


def _iteration_line(name: str, row: dict[str, Any]) -> str:
    keys = (
        "env/success_rate",
        "episode/num_step_rows",
        "gigpo/step_group_size_mean",
        "gigpo/num_masked_rows",
        "actor/pg_loss",
        "actor/grad_norm",
        "timing_s/step",
        val_metric(row),
    )
    parts = [f"{k}={row[k]:.4g}" for k in keys if k and _finite(row.get(k))]
    return f"[{name}] step {row['step']}: " + " ".join(parts)


def run_smoke(
    out_dir: str | Path,
    model_dir: str | Path = DEFAULT_MODEL,
    *,
    ranks: int = 1,
    env_name: str = "gridnav",
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    estimators: Sequence[str] = ("gigpo", "grpo"),
    kill_env_worker: bool = False,
    timeline: bool = False,
) -> dict[str, RunResult]:
    """Run the smoke runs under ``out_dir``; return them by name (``gigpo``, ``gigpo_changed``, ``gigpo_resume``,
    ``grpo``). ``env_name`` must be registered here and, through ``extra``, in the workers; ``kill_env_worker`` kills an
    environment worker of ``gigpo`` in iteration 1; ``timeline`` records start-up phases."""
    from verl_gigpo.data.prepare import write_task_files

    out_dir = Path(out_dir).resolve()
    model_dir = ensure_model(model_dir).resolve()
    data_dir = out_dir / "data"
    write_task_files(env_name, data_dir, train_size=64, val_size=8)
    runs: dict[str, RunResult] = {}
    common = {"model_dir": model_dir, "data_dir": data_dir, "ranks": ranks}
    if "gigpo" in estimators:
        gigpo_dir = out_dir / "gigpo"
        transcripts = [f"env.transcript_dir={gigpo_dir / 'transcripts'}"]  # both launches: what each played
        extra = [*extra, *transcripts]
        first = pipeline_overrides(run_dir=gigpo_dir, estimator="gigpo", total_steps=4, extra=extra, **common)
        # mid-iteration 3: the step-2 row is logged after the step-2 checkpoint, then iteration 3 starts its rollout;
        # the kill waits for its first finished episode, which the resumed launch must play again (resume_replay).
        # Iteration 3's episodes are held after their transcript is written (HOLD_STREAM_ENV; this launch only):
        # its rollout takes under a second here, so without the hold the kill could land after the rollout ended
        mid_third = all_of(checkpointed_and_logged(gigpo_dir, 2), transcribed(gigpo_dir, RESUMED_STREAM))
        kills = [Kill("agent-loop worker", AGENT_LOOP_WORKER, mid_third, fatal=True)]
        if kill_env_worker:  # iteration 1: the validation before training is logged, the rollout starts
            kills.insert(0, Kill("environment worker", ENV_WORKER, logged(gigpo_dir, 0)))
        held = {**(env or {}), HOLD_STREAM_ENV: RESUMED_STREAM}
        runs["gigpo"] = run_pipeline("gigpo", gigpo_dir, first, env=held, kills=kills, timeline=timeline)
        if runs["gigpo"].kill("agent-loop worker") is not None:
            resume = {"run_dir": gigpo_dir, "estimator": "gigpo", "total_steps": 4, "val_before_train": False}
            changed = pipeline_overrides(**resume, extra=[*extra, f"{CHANGED_KEY}=0.5"], **common)
            runs["gigpo_changed"] = run_pipeline(
                "gigpo_changed", gigpo_dir, changed, env=env, timeout=300, timeline=timeline
            )
            overrides = pipeline_overrides(**resume, extra=extra, **common)
            runs["gigpo_resume"] = run_pipeline("gigpo_resume", gigpo_dir, overrides, env=env, timeline=timeline)
    if "grpo" in estimators:
        grpo_dir = out_dir / "grpo"
        overrides = pipeline_overrides(
            run_dir=grpo_dir, estimator="grpo", total_steps=3, extra=[*extra, *LORA_SETTINGS], **common
        )
        # mid-iteration 3: the step-2 checkpoint and row are written (after the step-2 sync), iteration 3 starts
        server = Kill("rollout server", ROLLOUT_SERVER, checkpointed_and_logged(grpo_dir, 2), fatal=True)
        runs["grpo"] = run_pipeline("grpo", grpo_dir, overrides, env=env, kills=[server], timeline=timeline)
    return runs


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description="Smoke-test verl's own pipeline with GiGPO on this CPU")
    parser.add_argument("--out", default="runs/e2e", help="output folder (default runs/e2e; emptied first)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"tiny model folder (built if missing: {DEFAULT_MODEL})")
    parser.add_argument("--ranks", type=int, default=1, help="FSDP ranks (gloo) of the actor/reference (default 1)")
    args = parser.parse_args(argv)
    if args.ranks < 1:
        parser.error(f"--ranks must be >= 1, got {args.ranks}")
    out = emptied(args.out)
    start = time.perf_counter()
    runs = run_smoke(out, args.model, ranks=args.ranks)
    for name, run in runs.items():
        for row in run.metrics:
            print(_iteration_line(name, row))
    for run in runs.values():
        for kill in run.kills:
            stop = (
                f"; the launch stopped {kill.stopped_after_s:.0f} s later" if kill.stopped_after_s is not None else ""
            )
            print(f"[{run.name}] SIGKILL to the {kill.label} (pid {kill.pid}) at {kill.at_s:.0f} s{stop}")
        for line in run.error_lines():
            print(f"[{run.name}] {line}")
    first = runs.get("gigpo")
    if first is not None and first.kill("agent-loop worker") is not None:
        for entry in weight_sync_report(first.run_dir, Path(args.model)):
            if entry["reference"] is not None:
                print(
                    f"[weight sync] {entry['file']}: rollout server vs actor ({entry['reference']}) max |diff| "
                    f"{entry['max_abs_diff']:.3g}; actor vs initial model {entry['moved']:.3g}"
                )
    problems = check_runs(runs, Path(args.model))
    print(f"smoke test of verl's pipeline on CPU: {time.perf_counter() - start:.0f} s in all")
    if problems:
        print("FAILED:\n  - " + "\n  - ".join(problems))
        return 1
    print(
        "OK: validation, GiGPO and GRPO (LoRA) training, weight sync, checkpoints, a killed agent-loop worker and "
        "rollout server (each stopped its launch with one line), the resume (metrics kept), and a refused change of "
        "a training key all ran through verl's main_ppo"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
