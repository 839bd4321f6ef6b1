"""The local engine's command line: ``python -m verl_gigpo.local.train [key=value ...] [--resume] [--overwrite]``.

    python -m verl_gigpo.local.train algorithm.adv_estimator=grpo trainer.default_local_dir=runs/grpo
    python -m verl_gigpo.local.train trainer.total_training_steps=300 --resume      # continue a run
    python -m verl_gigpo.local.train --overwrite                                    # delete the run, start over

Overrides are OmegaConf dotlist items over ``verl_gigpo/config/local_trainer.yaml``; more: docs/local-engine.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from pathlib import Path

from verl_gigpo.config.keys import check_argv
from verl_gigpo.local.config import DEFAULT_CONFIG, load_config
from verl_gigpo.rollout.summary import launch_summary

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    """The command line: config overrides and the flags that set ``trainer.resume/overwrite/allow_config_change``."""
    parser = argparse.ArgumentParser(
        description="Train a causal LM on a text environment with GiGPO/GRPO/RLOO, in one process",
        epilog="overrides: key=value items, e.g. algorithm.adv_estimator=grpo trainer.total_training_steps=50",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides (OmegaConf dotlist)")
    parser.add_argument("--config", default=None, help=f"defaults file (default: {DEFAULT_CONFIG})")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint (trainer.resume)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in trainer.default_local_dir and start over (trainer.overwrite)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume although keys that change the computation differ from the saved run (allow_config_change)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring); returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.config is None:  # a typo'd key of local_trainer.yaml: one line and exit 2, before torch loads
        args.overrides = check_argv(args.overrides, local=True)
    from verl_gigpo.local.train import LocalTrainer  # the training stack (torch, transformers) loads here

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # verl warns at import about training engines it cannot load (megatron, torchtitan, ...); none is used here
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    overrides = list(args.overrides) + (["trainer.resume=true"] if args.resume else [])
    overrides += (["trainer.overwrite=true"] if args.overwrite else []) + (
        ["trainer.allow_config_change=true"] if args.allow_config_change else []
    )
    try:
        cfg = load_config(overrides, args.config)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        trainer = LocalTrainer(cfg)
    except ValueError as exc:  # a run already in the folder, a resume with a changed config, a missing model
        parser.error(str(exc))
    try:
        history = trainer.fit()
    except OSError as exc:  # the run folder became unwritable mid-run (permissions, full disk): one line
        if exc.filename is None or not Path(os.path.abspath(exc.filename)).is_relative_to(trainer.out_dir.absolute()):
            raise
        parser.exit(1, f"{parser.prog}: error: cannot write {exc.filename}: {exc.strerror or exc}\n")
    finally:
        trainer.close()
    val = [m for m in history if "val/success_rate" in m]
    if val:
        print(
            f"validation success: {val[0]['val/success_rate']:.3f} (iteration {int(val[0]['training_step'])}) -> "
            f"{val[-1]['val/success_rate']:.3f} (iteration {int(val[-1]['training_step'])})"
        )
    out = trainer.out_dir
    print(f"metrics: {out / 'metrics.jsonl'}")
    if cfg.local.plot:
        print(f"plot: {out / 'learning_curve.png'}")
    print(f"checkpoint: {out / 'checkpoints'}")
    if cfg.trainer.log_episodes:
        print(f"episodes: {out / 'episodes.html'}")
    ckpt = trainer.last_checkpoint
    summary = launch_summary(
        history,
        run_dir=out,
        iterations=trainer.iteration,
        checkpoint=ckpt,
        evaluate=["python", "-m", "verl_gigpo.evaluate", str(out)],
        export=["python", "-m", "verl_gigpo.export", str(out), "--out", f"exported/{out.name}"],
    )
    print("\n".join(summary))
    return 0
