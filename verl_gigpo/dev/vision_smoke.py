"""The vision smoke launch: a tiny Qwen2.5-VL trains 2 iterations on Sokoban seen as images, through verl's pipeline.

    python -m verl_gigpo.dev.vision_smoke --out runs/e2e-vision      (``make e2e`` runs it after the text launches)

``python -m verl_gigpo.main platform=cpu`` with the ``hf`` rollout backend, ``env.kwargs.observation=image`` and the
tiny vision-language model of :mod:`verl_gigpo.dev.tiny_vl_model` (built if missing). Checks (:func:`check_vision_run`):
both iterations are logged with every episode played (no environment or agent-loop error), the rollout-vs-actor
log-prob gap of each iteration is at most :data:`~verl_gigpo.dev.smoke.ROLLOUT_GAP_LIMIT` (verl's old-log-prob pass
runs every iteration: the actor's forward pass takes the images, so a rollout that saw them and an actor that did not
would differ by far more), the anchor keys of every transcribed image episode equal those of the same actions
played on the text Sokoban (the same GiGPO groups), and the driver's credit records of both iterations name each
step's drawing, a PNG in ``credit/images/`` equal to the transcript's. Evidence and limits: docs/vision.md.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from verl_gigpo.dev.smoke import ROLLOUT_GAP_LIMIT, RunResult, emptied, pipeline_overrides, run_pipeline

__all__ = [
    "DEFAULT_VL_MODEL",
    "VISION_SETTINGS",
    "check_vision_run",
    "credit_image_problems",
    "main",
    "run_vision_smoke",
    "text_replay",
]

DEFAULT_VL_MODEL = "artifacts/tiny-vl"

#: the launch's settings on top of :data:`~verl_gigpo.dev.smoke.SMOKE_SETTINGS` (Sokoban 6x6 drawn 8 px a cell, so
#: each observation is 4 image tokens; no history, as the reference's visual Sokoban prompt)
VISION_SETTINGS: tuple[str, ...] = (
    "env.name=sokoban",
    "+env.kwargs.observation=image",
    "+env.kwargs.tile_size=8",
    "env.max_steps=3",
    "env.history_length=0",
    "data.max_prompt_length=512",
    "actor_rollout_ref.model.trust_remote_code=true",  # the model folder's images-only processor class
    "data.trust_remote_code=true",
    "trainer.v1.gigpo_sync.logprob_check_freq=1",  # verl's old-log-prob pass every iteration: the gap is logged
    "trainer.credit_log_freq=1",  # the driver's credit records, each step naming the drawing the agent loop stored
)


def run_vision_smoke(out_dir: str | Path, model_dir: str | Path = DEFAULT_VL_MODEL) -> RunResult:
    """Build the tiny VL model if missing, write Sokoban task files and run the 2-iteration launch under ``out_dir``."""
    from verl_gigpo.data.prepare import write_task_files
    from verl_gigpo.dev.tiny_vl_model import build_tiny_vl_model

    out_dir, model_dir = Path(out_dir).resolve(), Path(model_dir).resolve()
    if not (model_dir / "config.json").exists():
        build_tiny_vl_model(model_dir)
    data_dir = out_dir / "data"
    write_task_files("sokoban", data_dir, train_size=16, val_size=4)
    run_dir = out_dir / "vision"
    extra = [*VISION_SETTINGS, f"env.transcript_dir={run_dir / 'transcripts'}"]
    overrides = pipeline_overrides(
        model_dir=model_dir,
        data_dir=data_dir,
        run_dir=run_dir,
        estimator="gigpo",
        total_steps=2,
        val_before_train=False,
        save_freq=100,
        extra=extra,
    )
    return run_pipeline("vision", run_dir, overrides, timeout=900)


def _transcripts(folder: Path) -> list[dict[str, Any]]:
    """The transcript records in ``folder`` (:func:`~verl_gigpo.rollout.transcripts.read_transcripts`); [] without
    any, which the checks then report (nothing compared, no image matched)."""
    from verl_gigpo.rollout.transcripts import read_transcripts

    try:
        return read_transcripts(folder)
    except FileNotFoundError:
        return []


def text_replay(transcript_dir: Path) -> tuple[int, list[str]]:
    """Replay every transcribed training episode's actions on the text Sokoban; ``(steps compared, mismatches)``
    where a mismatch is a step whose anchor key differs from the text episode's."""
    from environments import make_env
    from verl_gigpo.rollout.transcripts import anchor_key_hash

    steps: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in _transcripts(transcript_dir):
        if not record.get("env_error"):
            steps[record["traj"]].append(record)
    env = make_env("sokoban", max_steps=3)
    compared, bad = 0, []
    for traj, records in steps.items():
        records.sort(key=lambda r: r["step"])
        _, info = env.reset(seed=int(records[0]["seed"]), options={"split": records[0]["split"]})
        for record in records:
            compared += 1
            if anchor_key_hash(info["anchor_key"]) != record["anchor_key"]:  # transcripts keep the key's hash
                bad.append(f"{traj} step {record['step']}")
            # an invalid reply is the invalid-action step (the launch's rule: admissible)
            _, _, terminated, truncated, info = env.step(record["action"] if record["action_valid"] else None)
            if terminated or truncated:
                break
    return compared, bad


def credit_image_problems(credit_dir: Path, transcript_dir: Path, iterations: list[int]) -> list[str]:
    """The problems of the credit records ``<credit_dir>/iter_<k>.jsonl`` of ``iterations`` (empty: none): each
    record must name one image, a PNG under ``credit_dir`` whose name is its pixels' hash, and the same one as the
    transcript record of its trajectory and step."""
    from PIL import Image

    from environments.images import pixel_key
    from verl_gigpo.credit.records import read_credit_records

    shown = {(r["traj"], r["step"]): r.get("images") for r in _transcripts(transcript_dir)}
    problems = []
    for k in iterations:
        path = credit_dir / f"iter_{k}.jsonl"
        records = read_credit_records(path) if path.is_file() else []
        if not records:
            problems.append(f"no credit records in {path}")
        for r in records:
            where = f"{path.name} {r['traj']} step {r['step']}"
            refs = r.get("images") or []
            if len(refs) != 1:
                problems.append(f"{where}: names {len(refs)} images, expected 1")
            elif not (credit_dir / refs[0]).is_file():
                problems.append(f"{where}: {refs[0]} is missing from {credit_dir}")
            elif refs[0] != f"images/{pixel_key(Image.open(credit_dir / refs[0]))}.png":
                problems.append(f"{where}: {refs[0]} does not hold the pixels its name hashes")
            elif refs != shown.get((r["traj"], r["step"])):
                problems.append(f"{where}: {refs} but the transcript shows {shown.get((r['traj'], r['step']))}")
    return problems


def check_vision_run(run: RunResult) -> list[str]:
    """The problems of the vision launch (empty: it passed); see the module docstring for what is checked."""
    problems = [] if run.returncode == 0 else [f"the launch exited {run.returncode}: {run.error_lines()[-3:]}"]
    rows = [row for row in run.metrics if "training/rollout_probs_diff_max" in row]
    if [row.get("step") for row in rows] != [1, 2]:
        problems.append(
            f"expected iterations 1 and 2 with the rollout-vs-actor gap, got {[r.get('step') for r in rows]}"
        )
    for row in rows:
        gap = row["training/rollout_probs_diff_max"]
        if not gap <= ROLLOUT_GAP_LIMIT:
            problems.append(f"iteration {row['step']}: rollout-vs-actor gap {gap} > {ROLLOUT_GAP_LIMIT}")
        if row.get("env/env_error_rate", 1.0) != 0.0 or row.get("episode/num_trajectories") != 16:
            problems.append(
                f"iteration {row['step']}: {row.get('episode/num_trajectories')} of 16 episodes, env errors "
                f"{row.get('env/env_error_rate')}"
            )
    if "Error in _run_prompt" in run.log.read_text():
        problems.append("an agent loop failed (Error in _run_prompt in the log)")
    compared, bad = text_replay(run.run_dir / "transcripts")
    if compared == 0 or bad:
        problems.append(f"anchor keys of image vs text episodes: {compared} steps compared, mismatches {bad[:3]}")
    images = credit_image_problems(run.run_dir / "ckpt" / "credit", run.run_dir / "transcripts", [1, 2])
    if images:
        problems.append(f"credit records' images ({len(images)} problems): {images[:3]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description="verl's pipeline on CPU with a tiny vision-language model")
    parser.add_argument(
        "--out", default="runs/e2e-vision", help="output folder (default runs/e2e-vision; emptied first)"
    )
    parser.add_argument(
        "--model", default=DEFAULT_VL_MODEL, help=f"tiny VL model (built if missing: {DEFAULT_VL_MODEL})"
    )
    args = parser.parse_args(argv)
    run = run_vision_smoke(emptied(args.out), args.model)  # a kept checkpoint would be resumed: no iterations
    for row in run.metrics:
        print(
            f"[vision] iteration {row.get('step')}: rollout-vs-actor gap {row.get('training/rollout_probs_diff_max')}"
            f", episodes {row.get('episode/num_trajectories')}, success {row.get('env/success_rate')}"
        )
    problems = check_vision_run(run)
    if problems:
        print("FAILED:\n  - " + "\n  - ".join(problems))
        return 1
    print("OK: a tiny Qwen2.5-VL trained 2 iterations on Sokoban images through verl's pipeline (checks above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
