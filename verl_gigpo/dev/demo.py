"""``make demo``: a tiny model learns gridnav from scratch with GiGPO, on a CPU, in a few minutes.

    make demo                                   # = python -m verl_gigpo.dev.demo
    DEMO_ITERS=2 make demo                      # shortened run (what tests/test_demo.py does)
    python -m verl_gigpo.dev.demo --seed 3 --out runs/demo-3 algorithm.adv_estimator=grpo

Builds the tiny model when it is missing, trains it with the local engine (:data:`DEMO_OVERRIDES`; extra arguments
are config overrides applied last), prints the validation success before and after, and writes the credit report.
Two starts (``DEMO_START`` / ``--start``): ``random`` (random weights, decoding restricted to the action tokens) and
``imitate`` (a start model that reads its observation, on gridnav with a key). The environment variables and what
each start measured: docs/local-engine.md ("The CPU demo").
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

__all__ = [
    "DEMO_ITERS",
    "DEMO_OVERRIDES",
    "IMITATE_TASK",
    "START_ITERS",
    "START_OVERRIDES",
    "credit_log_freq",
    "main",
    "run_demo",
]

#: Iterations of the full demo.
DEMO_ITERS = 200

#: The demo's settings on top of ``local_trainer.yaml`` (whose defaults are already the gridnav demo).
DEMO_OVERRIDES: tuple[str, ...] = (
    "algorithm.adv_estimator=gigpo",
    "env.name=gridnav",
    "trainer.device=cpu",
)


#: Gridnav with a key (the door opens once the agent has stepped on the key; the observation gives the offset to the
#: key, then to the goal; 15 steps): the imitation start's task, and the learning benchmark's
#: (``benchmarks/learning_settings.py`` takes it from here).
KEY_TASK: tuple[str, ...] = (
    "env.name=gridnav",
    "env.kwargs.key=true",
    "env.kwargs.observe=target",
    "env.kwargs.size=5",
    "env.kwargs.walls=[2,4]",
    "env.kwargs.min_path=5",
    "env.max_steps=15",
)

#: The starts (``DEMO_START``): default model directory and the overrides each start adds.
START_OVERRIDES: dict[str, tuple[str, tuple[str, ...]]] = {
    "random": ("artifacts/tiny-model", ()),
    "imitate": (
        "artifacts/tiny-model-imitate",
        (
            *KEY_TASK,
            "env.history_length=0",
            "local.constrain_to_actions=false",
            "actor_rollout_ref.rollout.response_length=3",
        ),
    ),
}

#: The imitation start's task (``env.kwargs`` of its overrides), on which its model imitates the expert.
IMITATE_TASK = {"key": True, "observe": "target", "size": 5, "walls": [2, 4], "min_path": 5}

#: Iterations of the full demo per start (``DEMO_ITERS`` overrides).
START_ITERS = {"random": DEMO_ITERS, "imitate": 100}


def build_start_model(start: str, model_dir: Path) -> None:
    """Build the model of ``start`` into ``model_dir`` (random weights; for ``imitate`` then the expert imitation
    on the demo's task)."""
    from verl_gigpo.dev.tiny_model import build_tiny_model, imitate_expert

    print(f"building the tiny model into {model_dir} ...", flush=True)
    build_tiny_model(model_dir)
    if start == "imitate":
        print("teaching it to imitate the shortest-path expert now and then (about a minute) ...", flush=True)
        imitate_expert(model_dir, env_name="gridnav", env_kwargs=IMITATE_TASK, max_steps=15, history_length=0)


def credit_log_freq(iters: int) -> int:
    """The demo's ``trainer.credit_log_freq``: four logged iterations per run (every iteration when shorter)."""
    return max(1, iters // 4)


def run_demo(
    *,
    iters: int,
    seed: int,
    out_dir: str | Path,
    model_dir: str | Path,
    extra: list[str] = (),
    start: str = "random",
) -> dict:
    """Build the model of ``start`` if needed, train, write the credit report; return ``{"val_start", "val_end",
    "seconds", "metrics", "plot", "credit_report"}`` (report None without credit records, e.g. with grpo).

    Raises:
        ValueError: ``start`` is not one of :data:`START_OVERRIDES`.
    """
    from verl_gigpo.local.train import LocalTrainer, load_config

    if start not in START_OVERRIDES:
        raise ValueError(f"unknown demo start {start!r}; use one of {sorted(START_OVERRIDES)}")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        build_start_model(start, model_dir)
    overrides = [
        *DEMO_OVERRIDES,
        *START_OVERRIDES[start][1],
        f"actor_rollout_ref.model.path={model_dir}",
        f"trainer.total_training_steps={iters}",
        f"trainer.seed={seed}",
        f"trainer.default_local_dir={out_dir}",
        "trainer.overwrite=true",  # each demo is a fresh run: the previous demo run in out_dir is replaced
        f"trainer.credit_log_freq={credit_log_freq(iters)}",
        "trainer.credit_log_groups=-1",  # all 8 tasks: about 100 KB per logged iteration
        *extra,
    ]
    cfg = load_config(overrides)
    start = time.perf_counter()
    trainer = LocalTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    val = [m for m in history if "val/success_rate" in m]
    seconds = time.perf_counter() - start
    report = None
    if (Path(out_dir) / "credit").is_dir():
        from verl_gigpo.credit.report import make_report

        report = make_report(out_dir)
    return {
        "val_start": val[0]["val/success_rate"] if val else float("nan"),
        "val_end": val[-1]["val/success_rate"] if val else float("nan"),
        "seconds": seconds,
        "metrics": Path(out_dir) / "metrics.jsonl",
        "plot": Path(out_dir) / "learning_curve.png",
        "credit_report": report,
    }


def inspect_command(out_dir: str | Path, iteration: int, group: str) -> str:
    """The command that draws ``group`` of ``iteration`` again, pasteable into a fresh shell (absolute paths)."""
    args = [sys.executable, "-m", "verl_gigpo.inspect", str(Path(out_dir).resolve()), "--iter", str(iteration)]
    return shlex.join([*args, "--group", str(group)])


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description="Train a tiny model on gridnav with GiGPO (CPU demo)")
    parser.add_argument("--iters", type=int, default=None, help="iterations (DEMO_ITERS; 200, or 100 for imitate)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("DEMO_SEED") or 0))
    parser.add_argument("--out", default=os.environ.get("DEMO_OUT") or "runs/demo")
    parser.add_argument(
        "--start",
        default=os.environ.get("DEMO_START") or "random",
        help="random (random weights, action-token constrained decoding; default) or imitate (a start model that "
        "reads its observation, full-vocabulary sampling)",
    )
    parser.add_argument("--model", default=os.environ.get("DEMO_MODEL") or None, help="model directory")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (key=value)")
    args = parser.parse_args(argv)
    if args.iters is None:
        env_iters = os.environ.get("DEMO_ITERS")
        args.iters = int(env_iters) if env_iters else START_ITERS.get(args.start, DEMO_ITERS)
    if args.iters < 1:
        parser.error(f"--iters / DEMO_ITERS must be >= 1, got {args.iters}")
    if args.start not in START_OVERRIDES:
        parser.error(f"--start / DEMO_START must be one of {', '.join(START_OVERRIDES)}, got {args.start!r}")
    args.model = args.model or START_OVERRIDES[args.start][0]
    args.out = str(Path(args.out).resolve())  # the paths printed are absolute, as the evaluation's of both engines
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # verl warns at import about training engines it cannot load (megatron, torchtitan, ...); none is used here
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    print(f"gridnav demo: GiGPO, {args.iters} iterations, seed {args.seed}, start {args.start}, CPU", flush=True)
    result = run_demo(
        iters=args.iters,
        seed=args.seed,
        out_dir=args.out,
        model_dir=args.model,
        extra=args.overrides,
        start=args.start,
    )
    print(f"validation success before training: {result['val_start']:.3f}")
    print(f"validation success after training:  {result['val_end']:.3f}")
    print(f"wall time: {result['seconds']:.0f} s")
    print(f"metrics: {result['metrics']}")
    print(f"plot: {result['plot']}")
    report = result["credit_report"]
    if report is None:
        print("credit report: none (credit records hold GiGPO's terms: algorithm.adv_estimator=gigpo writes them)")
    else:
        print(f"\n{report.summary}\n")
        print(f"credit graph: {report.graph_png}")
        print(f"credit report: {report.html}")
        print(f"another iteration or group: {inspect_command(args.out, report.iteration, report.group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
