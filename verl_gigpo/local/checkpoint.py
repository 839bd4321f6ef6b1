"""The local engine's checkpoints: ``checkpoints/iter_K/state.pt``, one ``torch.save`` dict with ``iteration``, the
model and optimizer states, every RNG state (:func:`rng_states`), ``history`` (metrics lines) and ``config``.

    write_checkpoint(out_dir / "checkpoints", iteration, state)      # state.pt, then the pointer, both atomic
    found = read_checkpoint(out_dir / "checkpoints", cfg, device=device)   # (state, path) or None

Which checkpoint is read and which config changes a resume accepts: :mod:`verl_gigpo.local.run_folder`.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from verl_gigpo.config.resume import LOCAL_RESUME, LR_KEY, describe
from verl_gigpo.local.config import DEFAULT_CONFIG
from verl_gigpo.local.run_folder import checkpoint_candidates, write_latest

__all__ = ["read_checkpoint", "restore_rng_states", "rng_states", "set_learning_rate", "write_checkpoint"]

logger = logging.getLogger(__name__)


def rng_states(task_rng: np.random.Generator, server_generator: torch.Generator) -> dict[str, Any]:
    """Every random state a run draws from: the task sampler's, the server's and the global ones."""
    return {
        "task_rng": task_rng.bit_generator.state,
        "server_rng": server_generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }


def restore_rng_states(state: dict[str, Any], task_rng: np.random.Generator, server_generator: torch.Generator) -> None:
    """Set the random states saved by :func:`rng_states` (the CUDA ones only where CUDA is available)."""
    task_rng.bit_generator.state = state["task_rng"]
    server_generator.set_state(state["server_rng"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def write_checkpoint(checkpoints_dir: Path, iteration: int, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``iter_K/state.pt`` and point the latest-iteration file at it (atomic); returns its folder."""
    ckpt_dir = checkpoints_dir / f"iter_{iteration}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_dir / "state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, ckpt_dir / "state.pt")
    write_latest(checkpoints_dir, iteration)
    logger.info("checkpoint written to %s", ckpt_dir)
    return ckpt_dir


def read_checkpoint(
    checkpoints_dir: Path, cfg: DictConfig, *, device: torch.device
) -> tuple[dict[str, Any], Path] | None:
    """``(state, path of state.pt)`` of the checkpoint to resume from, its config checked against ``cfg``; None: none.

    Raises:
        ValueError: the config differs in keys that may not change on resume.
    """
    for iteration, path in checkpoint_candidates(checkpoints_dir):
        try:
            state = torch.load(path, map_location=device, weights_only=False)
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
            logger.warning("checkpoint %s cannot be read (%s); trying the next newest", path, exc)
            continue
        changes, refused = LOCAL_RESUME.check(
            state["config"],
            OmegaConf.to_container(cfg, resolve=True),
            allow=bool(cfg.trainer.allow_config_change),
            resuming=f"{checkpoints_dir.parent} from iteration {iteration}",
            source=str(path),
            start_over="start a new run in another trainer.default_local_dir",
            defaults=OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG), resolve=True),
        )
        if refused:
            logger.warning("resuming with a changed config (--allow-config-change): %s", describe(refused))
        if changes:
            logger.info("resuming iteration %d with changed settings: %s", iteration, describe(changes))
        return state, path
    return None


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Give every parameter group the config's ``lr`` (it may change on resume, with a warning)."""
    for group in optimizer.param_groups:
        if group["lr"] != lr:
            logger.warning("%s: %g in the checkpoint, %g from now on", LR_KEY, group["lr"], lr)
            group["lr"] = lr
