"""Training-health alarms: signals that a run is going wrong, one line each with what to try (``health/*`` metrics,
``health.jsonl`` in the run folder). Both engines feed each iteration's metrics to :class:`HealthMonitor`;
options ``trainer.health.*`` (:class:`HealthOptions`). Signals, noise rules and remedies: docs/metrics.md#health.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verl_gigpo.config.trainer import HEALTH_ACTIONS, HEALTH_SIGNALS, HealthOptions

__all__ = ["ACTIONS", "SIGNALS", "Alarm", "HealthMonitor", "HealthOptions", "replay", "validation_fall"]

logger = logging.getLogger(__name__)

ACTIONS = HEALTH_ACTIONS

# signal -> (what it saw, what to try)
_SIGNALS: dict[str, tuple[str, str]] = {
    "success_drop": (
        "training success fell from its best",
        "look at which health/* signal rose first; resume from a checkpoint before it with a lower "
        "actor_rollout_ref.actor.optim.lr",
    ),
    "invalid_rise": (
        "invalid replies are climbing",
        "a lower actor_rollout_ref.actor.optim.lr or a KL loss (actor_rollout_ref.actor.use_kl_loss=true)",
    ),
    "entropy_collapse": (
        "the policy's entropy collapsed",
        "a lower actor_rollout_ref.actor.optim.lr, actor_rollout_ref.actor.entropy_coeff > 0 or a KL loss",
    ),
    "entropy_explode": (
        "the policy's entropy exploded",
        "a lower actor_rollout_ref.actor.optim.lr or a KL loss; check the rollout temperature",
    ),
    "kl_spike": (
        "the KL to the reference (or old) policy spiked",
        "a lower actor_rollout_ref.actor.optim.lr or a larger actor_rollout_ref.actor.kl_loss_coef",
    ),
    "clipfrac_spike": (
        "the PPO clip fraction spiked",
        "a lower actor_rollout_ref.actor.optim.lr or fewer ppo_epochs",
    ),
    "logprob_gap": (
        "the rollout's and the actor's log-probs disagree",
        "check the weight sync and the rollout's dtype, or enable algorithm.rollout_correction",
    ),
    "grad_norm_nonfinite": (
        "the gradient norm is not finite",
        "look for NaN rewards or log-probs; a lower actor_rollout_ref.actor.optim.lr",
    ),
    "grad_norm_spike": (
        "the gradient norm spiked",
        "a lower actor_rollout_ref.actor.optim.lr or actor_rollout_ref.actor.grad_clip",
    ),
    "length_limit": (
        "replies hit the length limit",
        "a larger data.max_response_length, or a prompt that asks for shorter replies",
    ),
    "no_step_signal": (
        "almost no row gets a step term (GiGPO's step credit is gone)",
        "check the anchor key mode with `python -m verl_gigpo.probe`; a larger actor_rollout_ref.rollout.n",
    ),
    "singleton_anchors": (
        "almost every anchor group has one member",
        "the key mode does not fit this environment's states: run `python -m verl_gigpo.probe`",
    ),
    "flat_groups": (
        "almost every episode group has equal returns",
        "dynamic sampling (algorithm.filter_groups.enable=true, docs/dynamic-sampling.md) or easier tasks",
    ),
}
SIGNALS = HEALTH_SIGNALS

_GAP_KEYS = ("training/rollout_probs_diff_max", "rollout/logprob_diff_max")  # verl's path, the local engine


@dataclass(frozen=True)
class Alarm:
    """One raised alarm: ``signal`` (:data:`SIGNALS`) seen at ``iteration``, active since ``since``; ``message`` is
    the one line logged."""

    signal: str
    iteration: int
    since: int
    value: float
    threshold: float
    message: str

    def record(self, action: str) -> dict[str, Any]:
        """The ``health.jsonl`` line of this alarm."""
        return {
            "iteration": self.iteration,
            "signal": self.signal,
            "since": self.since,
            "value": self.value,
            "threshold": self.threshold,
            "action": action,
            "message": self.message,
        }


@dataclass
class _State:
    since: int | None = None
    last_raised: int | None = None


@dataclass
class HealthMonitor:
    """Checks each iteration's metrics (:meth:`observe`) against :class:`HealthOptions`.

    Args:
        options: the ``trainer.health`` options.
        kl_key: the KL metric: ``actor/kl_loss`` when a KL loss is configured, else ``actor/ppo_kl``.
        run_dir: where ``health.jsonl`` goes (None: not written).
    """

    options: HealthOptions
    kl_key: str = "actor/ppo_kl"
    run_dir: Path | str | None = None
    series: dict[str, list[float]] = field(default_factory=dict)
    alarms: list[Alarm] = field(default_factory=list)
    _states: dict[str, _State] = field(default_factory=dict)
    _best_success: tuple[float, float] | None = None  # (windowed mean, episodes) at its best
    _low_invalid: tuple[float, float] | None = None  # (windowed mean, steps) at its lowest
    stop_requested: bool = False

    def observe(self, iteration: int, metrics: Mapping[str, float], *, replay: bool = False) -> dict[str, float]:
        """Check one iteration; returns ``health/<signal>`` (1.0 while active), ``health/alarms`` (raised now) and
        ``health/alarms_total``. New alarms are logged, appended to ``health.jsonl`` and, with ``action=stop``, set
        :attr:`stop_requested`. ``replay`` (a resumed run re-reading its history) restores the state silently.
        Metrics absent this iteration leave their signal as it was."""
        opts = self.options
        if not opts.enable:
            return {}
        for key, value in metrics.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                self.series.setdefault(key, []).append(float(value))
        raised = []
        out: dict[str, float] = {}
        for signal, check in self._checks(metrics).items():
            if signal in opts.ignore:
                continue
            state = self._states.setdefault(signal, _State())
            if check is not None:
                active, value, threshold, detail = check
                if not active:
                    state.since = None
                else:
                    state.since = iteration if state.since is None else state.since
                    due = state.last_raised is None or iteration - state.last_raised >= opts.cooldown
                    if due:
                        state.last_raised = iteration
                        what, remedy = _SIGNALS[signal]
                        message = (
                            f"health alarm {signal}: {what} since iteration {state.since} ({detail}); "
                            f"what to try: {remedy}"
                        )
                        raised.append(Alarm(signal, iteration, state.since, value, threshold, message))
            out[f"health/{signal}"] = float(state.since is not None)
        self.alarms += raised
        if raised and not replay:
            for alarm in raised:
                logger.warning(alarm.message)
            if self.run_dir is not None:
                path = Path(self.run_dir) / "health.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as fh:
                    fh.writelines(json.dumps(a.record(opts.action)) + "\n" for a in raised)
            self.stop_requested = opts.action == "stop"
        out["health/alarms"] = float(len(raised))
        out["health/alarms_total"] = float(len(self.alarms))
        return out

    def summary(self) -> str:
        """One line: the alarms raised in the run (signal and iteration), or that there were none."""
        if not self.options.enable:
            return "health: checks off (trainer.health.enable=false)"
        if not self.alarms:
            return "health: no alarm"
        raised = ", ".join(f"{a.signal} (iteration {a.iteration})" for a in self.alarms)
        return f"health: {len(self.alarms)} alarm(s): {raised}"

    # ------------------------------------------------------------------ signals
    def _recent(self, key: str, k: int) -> list[float]:
        return self.series.get(key, [])[-k:]

    def _checks(self, metrics: Mapping[str, float]) -> dict[str, tuple[bool, float, float, str] | None]:
        """signal -> (active, value, threshold, detail), or None when its metric is absent this iteration."""
        opts = self.options
        present = set(metrics)
        checks: dict[str, tuple[bool, float, float, str] | None] = dict.fromkeys(SIGNALS)
        if "env/success_rate" in present:
            checks["success_drop"] = self._success_drop()
            checks["invalid_rise"] = self._invalid_rise()
        if "actor/entropy" in present:
            early, now = self._early("actor/entropy"), self._smoothed("actor/entropy")
            if early is not None and now is not None and early > 0:
                low, high = opts.entropy_low * early, opts.entropy_high * early
                detail = f"actor/entropy {now:.3g}, mean of the last {opts.baseline} values; early value {early:.3g}"
                checks["entropy_collapse"] = (now < low, now, low, detail + f", alarm below {low:.3g}")
                checks["entropy_explode"] = (now > high, now, high, detail + f", alarm above {high:.3g}")
        if self.kl_key in present:
            now = self._smoothed(self.kl_key) or 0.0
            detail = f"{self.kl_key} {now:.3g}, mean of the last {opts.baseline} values, above {opts.kl_max:g}"
            checks["kl_spike"] = (now > opts.kl_max, now, opts.kl_max, detail)
        if "actor/pg_clipfrac" in present:
            now = self._smoothed("actor/pg_clipfrac") or 0.0
            detail = (
                f"actor/pg_clipfrac {now:.3g}, mean of the last {opts.baseline} values, above {opts.clipfrac_max:g}"
            )
            checks["clipfrac_spike"] = (now > opts.clipfrac_max, now, opts.clipfrac_max, detail)
        gap_key = next((key for key in _GAP_KEYS if key in present), None)
        if gap_key is not None:
            now = float(metrics[gap_key])
            detail = f"{gap_key} {now:.3g} above {opts.logprob_gap_max:g}"
            checks["logprob_gap"] = (now > opts.logprob_gap_max, now, opts.logprob_gap_max, detail)
        if "actor/grad_norm" in present:
            last = float(metrics["actor/grad_norm"])
            checks["grad_norm_nonfinite"] = (not math.isfinite(last), last, 0.0, f"actor/grad_norm = {last}")
            early, now = self._early_grad_norm(), self._smoothed("actor/grad_norm", finite=True)
            if early is not None and now is not None:
                bound = opts.grad_norm_ratio * max(early, opts.grad_norm_floor)
                detail = (
                    f"actor/grad_norm {now:.3g}, mean of the last {opts.baseline} values; {opts.grad_norm_ratio:g} x "
                    f"its early value {early:.3g} (floor {opts.grad_norm_floor:g}) = {bound:.3g}"
                )
                checks["grad_norm_spike"] = (now > bound, now, bound, detail)
        if "response_length/clip_ratio" in present:
            checks["length_limit"] = self._length_limit()
        anchored = (
            ("no_step_signal", "gigpo/frac_rows_nonzero_step_adv", lambda v: v < opts.step_signal_min, "below"),
            ("singleton_anchors", "gigpo/frac_singleton_step_groups", lambda v: v > opts.singleton_max, "above"),
            ("flat_groups", "gigpo/frac_zero_std_episode_groups", lambda v: v > opts.flat_max, "above"),
        )
        bounds = {"no_step_signal": opts.step_signal_min, "singleton_anchors": opts.singleton_max}
        bounds["flat_groups"] = opts.flat_max
        for signal, key, bad, side in anchored:
            values = self.series.get(key, [])
            if key in present:
                # warm-up, then persistence: the whole window of logged values is past the bound
                full = len(values) >= max(opts.window, opts.warmup + 1)
                now = float(np.mean(values[-opts.window :]))
                active = full and all(bad(v) for v in values[-opts.window :])
                detail = f"{key} {now:.3g} over the last {opts.window} iterations, every one {side} {bounds[signal]:g}"
                checks[signal] = (active, now, bounds[signal], detail)
        return checks

    def _early(self, key: str, *, finite: bool = False) -> float | None:
        """Mean of the first ``baseline`` values, once ``2 x baseline`` are logged (so early and now do not
        overlap); None before."""
        values = [v for v in self.series.get(key, []) if not finite or math.isfinite(v)]
        n = self.options.baseline
        return float(np.mean(values[:n])) if len(values) >= 2 * n else None

    def _early_grad_norm(self) -> float | None:
        """Median of the first ``window`` finite nonzero grad norms (0 is an iteration without signal, not a small
        norm), once ``window + baseline`` are logged; None before."""
        values = [v for v in self.series.get("actor/grad_norm", []) if math.isfinite(v) and v > 0]
        w = self.options.window
        return float(np.median(values[:w])) if len(values) >= w + self.options.baseline else None

    def _smoothed(self, key: str, *, finite: bool = False) -> float | None:
        """Mean of the last ``baseline`` logged values (None when there is none)."""
        values = [v for v in self.series.get(key, []) if not finite or math.isfinite(v)]
        tail = values[-self.options.baseline :]
        return float(np.mean(tail)) if tail else None

    def _rate_window(self, rate_key: str, count_key: str, per_step: bool) -> tuple[float, float] | None:
        """(pooled rate, trials) over the last ``window`` logged iterations; None before a full window."""
        w = self.options.window
        rates = self._recent(rate_key, w)
        counts = self._recent(count_key, w)
        if len(rates) < w or len(counts) < w:
            return None
        if per_step:  # trials = steps = trajectories x mean length
            lengths = self._recent("env/episode_length", w)
            counts = [c * length for c, length in zip(counts, lengths, strict=False)] if len(lengths) == w else counts
        trials = float(sum(counts))
        if trials <= 0:
            return None
        return float(sum(r * c for r, c in zip(rates, counts, strict=True)) / trials), trials

    def _length_limit(self) -> tuple[bool, float, float, str] | None:
        """Mean share of replies at the length limit over the last ``window`` logged values above the mean of the first
        ``window`` by more than ``length_limit_rise`` plus 2 standard errors of the difference (from the values'
        spread); None before ``2 x window`` values."""
        values = self.series.get("response_length/clip_ratio", [])
        w = self.options.window
        if len(values) < 2 * w:
            return None
        early, recent = np.asarray(values[:w]), np.asarray(values[-w:])
        se = math.sqrt((early.var(ddof=1) + recent.var(ddof=1)) / w) if w > 1 else 0.0
        now, rise = float(recent.mean()), self.options.length_limit_rise
        bound = float(early.mean()) + rise + 2 * se
        detail = (
            f"response_length/clip_ratio {now:.3g} over the last {w} iterations, early {early.mean():.3g}; alarm "
            f"above early + {rise:g} + 2 SE = {bound:.3g}"
        )
        return now > bound, now, bound, detail

    def _success_drop(self) -> tuple[bool, float, float, str] | None:
        """Windowed success below ``(1 - success_drop)`` x its best windowed value by more than 2 binomial standard
        errors of the difference (the best is biased upwards; the errors widen the margin)."""
        window = self._rate_window("env/success_rate", "episode/num_trajectories", per_step=False)
        if window is None:
            return None
        p, n = window
        if self._best_success is None or p > self._best_success[0]:
            self._best_success = (p, n)
        best, n_best = self._best_success
        se = math.sqrt(best * (1 - best) / n_best + p * (1 - p) / n)
        keep = 1 - self.options.success_drop
        bound = keep * best - 2 * se
        detail = (
            f"env/success_rate {p:.3f} over the last {self.options.window} iterations ({n:.0f} episodes), best "
            f"{best:.3f}; alarm below {keep:g} x best - 2 binomial SE = {bound:.3f}"
        )
        return p < bound, p, bound, detail

    def _invalid_rise(self) -> tuple[bool, float, float, str] | None:
        """Windowed invalid replies per step above their lowest windowed value by more than ``invalid_rise`` plus 2
        binomial standard errors of the difference, and above ``invalid_ratio`` x that lowest value."""
        window = self._rate_window("env/invalid_action_rate", "episode/num_trajectories", per_step=True)
        if window is None:
            return None
        p, n = window
        if self._low_invalid is None or p < self._low_invalid[0]:
            self._low_invalid = (p, n)
        low, n_low = self._low_invalid
        se = math.sqrt(low * (1 - low) / n_low + p * (1 - p) / n)
        opts = self.options
        bound = max(low + opts.invalid_rise + 2 * se, opts.invalid_ratio * low)
        detail = (
            f"env/invalid_action_rate {p:.4f} over the last {opts.window} iterations ({n:.0f} steps), lowest "
            f"{low:.4f}; alarm above lowest + {opts.invalid_rise:g} + 2 binomial SE and {opts.invalid_ratio:g} x "
            f"lowest = {bound:.4f}"
        )
        return p > bound, p, bound, detail


def replay(lines: Iterable[Mapping[str, Any]], options: HealthOptions | None = None, **monitor: Any) -> HealthMonitor:
    """A run's metrics lines (``metrics.jsonl``, a kept run's rows) through a fresh monitor, offline and silently: the
    training lines (those with ``training/global_step``) in order, without their logged ``health/*`` keys. Returns
    the monitor (:attr:`HealthMonitor.alarms`); ``monitor`` are its other arguments (``kl_key``)."""
    health = HealthMonitor(options or HealthOptions(), **monitor)
    for line in lines:
        if "training/global_step" in line:
            metrics = {k: v for k, v in line.items() if not k.startswith("health/")}
            health.observe(int(line["training/global_step"]), metrics, replay=True)
    return health


def _val_success(line: Mapping[str, Any]) -> float | None:
    """Validation success in a metrics line: ``val/success_rate`` (local engine) or ``val-core/<env>/acc/mean@1``."""
    if "val/success_rate" in line:
        return float(line["val/success_rate"])
    key = next((k for k in line if k.startswith("val-core/") and k.endswith("/acc/mean@1")), None)
    return None if key is None else float(line[key])


def validation_fall(lines: Iterable[Mapping[str, Any]], pool: int = 2) -> int | None:
    """The iteration at which validation success has fallen by half: its mean over the last ``pool`` validations is
    below half of the best such mean so far (pooling, as one validation of 64 tasks moves by +-0.06 on its own).
    None when it never falls. Iterations: ``step`` of the lines with a validation success."""
    vals = [(int(x["step"]), v) for x in lines if (v := _val_success(x)) is not None]
    best = 0.0
    for i in range(pool - 1, len(vals)):
        mean = float(np.mean([v for _, v in vals[i - pool + 1 : i + 1]]))
        if mean < best / 2:
            return vals[i][0]
        best = max(best, mean)
    return None
