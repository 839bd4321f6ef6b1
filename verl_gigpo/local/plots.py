"""The local engine's learning-curve plot (``learning_curve.png``) from the ``metrics.jsonl`` lines of a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import DictConfig

__all__ = ["plot_metrics", "run_title"]


def plot_metrics(history: list[dict[str, float]], path: Path, *, title: str = "") -> Path:
    """Learning curves (train and validation success, episode length) as a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    train = [m for m in history if "env/success_rate" in m]
    val = [m for m in history if "val/success_rate" in m]
    if train:
        xs = [m["training_step"] for m in train]
        ys = [m["env/success_rate"] for m in train]
        ax1.plot(xs, ys, alpha=0.35, label="train (sampled)")
        window = max(1, len(ys) // 20)
        smooth = np.convolve(ys, np.ones(window) / window, mode="valid")
        ax1.plot(xs[window - 1 :], smooth, label=f"train, {window}-iteration mean")
        ax2.plot(xs, [m["env/episode_length"] for m in train], label="train episode length")
    if val:
        ax1.plot([m["training_step"] for m in val], [m["val/success_rate"] for m in val], "o-", label="validation")
        ax2.plot([m["training_step"] for m in val], [m["val/episode_length"] for m in val], "o-", label="validation")
    ax1.set(xlabel="iteration", ylabel="success rate", ylim=(-0.02, 1.02), title=title)
    ax2.set(xlabel="iteration", ylabel="steps per episode")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_title(cfg: DictConfig) -> str:
    """The plot's title: environment, estimator (with GiGPO's w and normalisation) and seed."""
    est = cfg.algorithm.adv_estimator
    if est == "gigpo":
        est += f" (w={cfg.algorithm.gigpo.step_advantage_w}, {cfg.algorithm.gigpo.norm})"
    return f"{cfg.env.name}: {est}, seed {cfg.trainer.seed}"
