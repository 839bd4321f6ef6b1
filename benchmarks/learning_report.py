"""The learning benchmark's report (``benchmarks/learning.py``): curves from the runs' metric rows
(:func:`learning_run.read_run`, verl's run-level names on both engines), the summary table, the plot, and the
RESULTS.md sections (:func:`markdown` for the local benchmark, :func:`markdown_verl` for the side-by-side runs).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from kept_data import shown
from learning_run import episodes_per_iteration, load_run, val_success
from learning_settings import (
    ACTION_MODEL,
    ACTION_MODEL_COMMAND,
    ENGINES,
    IMITATE_ARGS,
    IMITATE_COMMAND,
    IMITATE_MODEL,
    SECTION_VERL,
    SUITES,
    TASK,
    TASK_TITLES,
    TASKS,
    shared_settings,
)
from paired import format_difference, paired_difference, paired_table


def model_description(model_dir: str | Path) -> str:
    """What the start model in ``model_dir`` is, from the ``tiny_model_info.json`` its builder wrote (``imitate``:
    the expert-imitation fine-tuning and its settings; ``sft_actions``: random action words, the command
    ``ACTION_MODEL_COMMAND``); a folder without that record is named as given. :data:`IMITATE_MODEL` is described by
    its command, so a fresh clone without the folder rebuilds the same text."""
    if str(model_dir) == IMITATE_MODEL:
        return (
            "the tiny model fine-tuned to imitate gridnav's shortest-path expert on the key task: the expert's action "
            f"with probability {IMITATE_ARGS[1].split(':')[1]}, a random one otherwise; `{IMITATE_COMMAND}`"
        )
    info_path = Path(model_dir) / "tiny_model_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    if "imitate" in info:
        im = info["imitate"]
        kwargs = json.dumps(im.get("env_kwargs") or {})
        return (
            f"the tiny model fine-tuned to imitate {im['env']}'s shortest-path expert: the expert's action with "
            f"probability {im['p_expert']}, a random one otherwise, {im['steps']} steps on {im['examples']} examples "
            f"of the task {kwargs}, {im['max_steps']} steps, history {im['history_length']}: `python -m "
            f"verl_gigpo.dev.tiny_model --out {model_dir} --imitate {im['env']}:{im['p_expert']} --imitate-kwargs "
            f"'{kwargs}' --imitate-max-steps {im['max_steps']} --imitate-history {im['history_length']}`"
        )
    if "sft_actions" in info or str(model_dir) == ACTION_MODEL:
        return (
            f"`{ACTION_MODEL_COMMAND}`: the random tiny model taught to answer a gridnav prompt with a uniformly "
            "random action word + EOS"
        )
    return "a model folder given with --model"


def load_curves(
    runs: Path,
    names: list[str],
    seeds: list[int],
    *,
    engine: str = "local",
    label: str = "{name}",
    data: Path | None = None,
    expect: argparse.Namespace | None = None,
) -> dict[str, dict[str, Any]]:
    """Per configuration (keyed ``label.format(name=...)``, also its kept files' label in ``data``): ``steps`` (V,),
    ``val`` (S, V) validation success, ``train`` (S, T) train success, ``seconds`` (S,) summed iteration time,
    ``seeds``, ``rows`` (the runs' metric lines) and ``launches`` (verl's launch records; None for the local engine).
    Each run is read from its kept file (refused when made with other options than ``expect``), else its run folder
    (:func:`learning_run.load_run`)."""
    out = {}
    for name in names:
        vals, trains, secs, steps, found, lines_per_seed, launches, played = [], [], [], None, [], [], [], []
        for seed in seeds:
            lines, launch = load_run(runs, data, label.format(name=name), seed, engine, expect)
            val = [m for m in lines if val_success(m) is not None]
            if not val:
                continue
            steps = np.array([m["step"] for m in val])
            vals.append([val_success(m) for m in val])
            played.append(episodes_at(lines, steps))
            trains.append([m["env/success_rate"] for m in lines if "env/success_rate" in m])
            secs.append(sum(m["timing_s/step"] + m.get("timing_s/testing", 0.0) for m in lines if "timing_s/step" in m))
            found.append(seed)
            lines_per_seed.append(lines)
            launches.append(launch)
        if vals:
            width = min(len(v) for v in vals)
            out[label.format(name=name)] = {
                "steps": steps[:width],
                "val": np.array([v[:width] for v in vals]),
                "episodes": np.array([e[:width] for e in played]),
                "train": np.array([t[: min(len(t) for t in trains)] for t in trains]),
                "seconds": np.array(secs),
                "seeds": found,
                "rows": lines_per_seed,
                "launches": launches,
            }
    return out


def episodes_at(lines: list[dict], steps: np.ndarray) -> list[float]:
    """Training episodes played before each validation step (V,): the run's ``rollout/episodes_played_total`` at that
    iteration (the local engine), else the sum of its iterations' :func:`~learning_run.episodes_per_iteration`
    (verl); 0 at step 0, nan where a run logs neither."""
    total = {int(m["step"]): m["rollout/episodes_played_total"] for m in lines if "rollout/episodes_played_total" in m}
    if not total:
        running = 0.0
        for m in lines:
            if "episode/num_trajectories" in m:
                running += episodes_per_iteration(m)
                total[int(m["step"])] = running
    return [0.0 if s == 0 else float(total.get(int(s), float("nan"))) for s in steps]


def first_reach(steps: np.ndarray, curve: np.ndarray, threshold: float) -> float:
    """First validation step whose success is >= threshold (nan when never)."""
    hit = np.flatnonzero(curve >= threshold)
    return float(steps[hit[0]]) if hit.size else float("nan")


def train_window(iters: int) -> int:
    """Iterations averaged for 'train success at the end': 20, fewer for short runs."""
    return max(1, min(20, iters // 4))


def summarise(curves: dict, threshold: float, window: int = 20) -> list[dict]:
    """One row per configuration: final / best / mean-over-curve validation success and iterations to threshold."""
    rows = []
    for name, c in curves.items():
        val = c["val"]  # (S, V)
        reach = np.array([first_reach(c["steps"], v, threshold) for v in val])
        rows.append(
            {
                "name": name,
                "seeds": val.shape[0],
                "start": (val[:, 0].mean(), val[:, 0].std()),
                "final": (val[:, -1].mean(), val[:, -1].std()),
                "final_per_seed": val[:, -1].tolist(),
                "auc": (val[:, 1:].mean(axis=1).mean(), val[:, 1:].mean(axis=1).std()),
                "train_last": (
                    c["train"][:, -window:].mean(axis=1).mean(),
                    c["train"][:, -window:].mean(axis=1).std(),
                ),
                "reached": int(np.isfinite(reach).sum()),
                "reach_median": float(np.nanmedian(reach)) if np.isfinite(reach).any() else float("nan"),
                "seconds": c["seconds"].mean(),
                # training episodes a run played in all (nan where a run logs no count)
                "episodes": float(np.nanmean(c["episodes"][:, -1]))
                if np.isfinite(c["episodes"][:, -1]).any()
                else float("nan"),
            }
        )
    return rows


def x_of(curve: dict, episodes_per_step: int) -> np.ndarray:
    """The x of a curve's validations (V,): training episodes played (mean over seeds), or ``step x
    episodes_per_step`` where a run does not log them (verl's path without dynamic sampling)."""
    played = curve.get("episodes")
    if played is None or not np.isfinite(played).all():
        return curve["steps"] * episodes_per_step
    return played.mean(axis=0)


def plot(curves: dict, path: Path, threshold: float, title: str, episodes_per_step: int = 1) -> None:
    """Validation success against training episodes played (mean line, min-max band over seeds) and smoothed train
    success per iteration, per configuration.

    Labels ``engine/config`` (the side-by-side runs): one colour per configuration, solid for verl, dashed for
    the local engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours: dict[str, str] = {}
    window = 1
    for name, c in curves.items():
        engine, _, config = name.rpartition("/")
        style = {"color": colours[config]} if config in colours else {}
        ls = "--" if engine == "local" else "-"
        mean = c["val"].mean(axis=0)
        x = x_of(c, episodes_per_step)
        (line,) = ax1.plot(x, mean, "o", ls=ls, ms=3, label=f"{name} (n={c['val'].shape[0]})", **style)
        colours.setdefault(config, line.get_color())
        ax1.fill_between(x, c["val"].min(axis=0), c["val"].max(axis=0), color=line.get_color(), alpha=0.12)
        train = c["train"].mean(axis=0)
        window = max(1, len(train) // 15)
        smooth = np.convolve(train, np.ones(window) / window, mode="valid")
        ax2.plot(np.arange(window, len(train) + 1), smooth, color=line.get_color(), ls=ls, label=name)
    ax1.axhline(threshold, color="grey", lw=0.8, ls=":")
    xlabel = "training episodes played" if episodes_per_step > 1 else "iteration"
    ax1.set(xlabel=xlabel, ylabel="validation success (sampled)", title=title, ylim=(-0.02, 1.02))
    ax2.set(xlabel="iteration", ylabel=f"train success ({window}-iteration mean)", ylim=(-0.02, 1.02))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pm(x: tuple[float, float]) -> str:
    return f"{x[0]:.2f} ± {x[1]:.2f}"


def _result_rows(
    rows: list[dict], threshold: float, window: int, *, engine_column: bool, played: bool = False
) -> list[str]:
    """The results table (one row per configuration); ``played``: also the training episodes a run played
    (dynamic sampling plays more per iteration)."""
    head = "| engine | config " if engine_column else "| config "
    lines = [
        f"{head}| seeds | val success at start | final val success | mean val success over training | "
        f"train success, last {window} it. | seeds reaching {threshold:.2f} | median it. to {threshold:.2f} | "
        + ("training episodes per run | " if played else "")
        + "s per run |",
        "|---|" + "---|" * (8 + engine_column + played),
    ]
    for r in rows:
        reach = "-" if np.isnan(r["reach_median"]) else f"{r['reach_median']:.0f}"
        engine, _, config = r["name"].rpartition("/")
        first = f"| {engine} | {config} " if engine_column else f"| {r['name']} "
        lines.append(
            f"{first}| {r['seeds']} | {_pm(r['start'])} | {_pm(r['final'])} | {_pm(r['auc'])} | "
            f"{_pm(r['train_last'])} | {r['reached']}/{r['seeds']} | {reach} | "
            + ((f"{r['episodes']:.0f} | " if np.isfinite(r["episodes"]) else "- | ") if played else "")
            + f"{r['seconds']:.0f} |"
        )
    return lines


def markdown(
    curves: dict, rows: list[dict], args: argparse.Namespace, command: str, wall: float | None, load: str
) -> str:
    """The RESULTS.md section of the local benchmark from its curves (:func:`load_curves`) and their summary rows
    (:func:`summarise`); with ``--suite successors`` also a table per seed."""
    lines = [
        SUITES[args.suite]["section"],
        "",
        f"Command: {command}",
        "",
        f"Task: gridnav with a key ({' '.join(o for o in TASK if o.startswith('env.'))}); tiny model "
        f"`{args.model}`; {args.iters} iterations x ({args.tasks} tasks x {args.group} episodes); validation on "
        f"{args.val_size} fixed test-split tasks every {args.test_freq} iterations (sampled, temperature 1); seeds "
        f"{', '.join(str(s) for s in range(args.seeds))}. Mean ± std over seeds (population std, ddof 0); "
        f"'reaching' = some validation point at or above the threshold.",
        "",
        *_result_rows(rows, args.threshold, train_window(args.iters), engine_column=False),
    ]
    if args.suite == "successors":
        lines += ["", *per_seed_rows(rows, args.seeds)]
    lines += ["", *paired_lines(curves, args.baseline), kept_line(args.data), ""]
    lines += [f"![learning curves]({SUITES[args.suite]['png']})", ""]
    if wall is not None:
        lines.append(f"Wall time of the whole benchmark: {wall / 60:.0f} min ({args.jobs} runs in parallel). {load}")
        lines.append("")
    return "\n".join(lines)


def per_seed_rows(rows: list[dict], seeds: int) -> list[str]:
    """Markdown: final validation success of every configuration per seed (the same seeds for all)."""
    lines = [
        "Final validation success per seed:",
        "",
        "| config | " + " | ".join(f"seed {s}" for s in range(seeds)) + " |",
    ]
    lines.append("|---|" + "---|" * seeds)
    for r in rows:
        lines.append(f"| {r['name']} | " + " | ".join(f"{v:.2f}" for v in r["final_per_seed"]) + " |")
    return lines


#: (label, local engine key, verl key) of the seconds per training iteration; None = the engine has no such phase
PHASES: tuple[tuple[str, str | None, str | None], ...] = (
    ("rollout: generation + environments", "timing_s/rollout", "timing_s/gen"),
    ("old log-probs (local: in the update's forward)", None, "timing_s/old_log_prob"),
    ("reference log-probs (KL off)", None, "timing_s/ref"),
    ("advantages", "timing_s/adv", "timing_s/adv"),
    ("actor update", "timing_s/update", "timing_s/update_actor"),
    ("weight sync to the rollout server", None, "timing_s/update_weights"),
)


def phase_table(curves: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: mean seconds per training iteration and phase, per engine (over every run and iteration)."""
    engines = sorted({name.rpartition("/")[0] for name in curves}, key=ENGINES.index)
    rows = {
        e: [m for n, c in curves.items() if n.rpartition("/")[0] == e for r in c["rows"] for m in r] for e in engines
    }
    train = {e: [m for m in rows[e] if "env/success_rate" in m and "timing_s/step" in m] for e in engines}
    lines = [
        "| phase | " + " | ".join(f"{e} (s per iteration)" for e in engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    accounted = {e: np.zeros(len(train[e])) for e in engines}
    for label, *keys in PHASES:
        cells = []
        for e in engines:
            key = keys[ENGINES.index(e)]
            if key is None:
                cells.append("–")
                continue
            values = np.array([m.get(key, 0.0) for m in train[e]])
            accounted[e] += values
            cells.append(f"{values.mean():.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = {e: np.array([m["timing_s/step"] for m in train[e]]) for e in engines}
    rest = " | ".join(f"{(totals[e] - accounted[e]).mean():.2f}" for e in engines)
    lines.append(f"| rest (verl: Ray calls, TransferQueue, batch balancing, padding) | {rest} |")
    lines.append("| **training iteration** | " + " | ".join(f"**{totals[e].mean():.2f}**" for e in engines) + " |")
    val = []
    for e in engines:
        values = [m["timing_s/testing"] for m in rows[e] if "timing_s/testing" in m]
        val.append(f"{np.mean(values):.2f}" if values else "–")
    lines.append("| one validation (not in the iteration) | " + " | ".join(val) + " |")
    return lines


def diagnostics_table(curves: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """Markdown: what each engine's update saw, per engine and configuration (means over runs and iterations)."""
    lines = [
        "| engine | config | step rows per iteration | optimizer steps per iteration | max rollout-vs-actor gap | "
        "entropy: first → last logged | PPO clip fraction | grad norm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in curves.items():
        engine, _, config = name.rpartition("/")
        train = [[m for m in r if "env/success_rate" in m] for r in c["rows"]]
        flat = [m for t in train for m in t]
        if engine == "verl":
            rows_key, gap_key, gap_unit = "update/rows", "training/rollout_probs_diff_max", "in p"
            steps = f"{np.mean([m.get('update/num_mini_batches', np.nan) for m in flat]):.2f}"
        else:
            rows_key, gap_key, gap_unit = "rollout/rows", "rollout/logprob_diff_max", "in log p"
            steps = f"{args.opt_steps} ({args.tasks // args.opt_steps} task(s) each)"
        gap = max((m.get(gap_key, 0.0) for m in flat), default=float("nan"))
        # the local engine compares rollout and actor log-probs only when it updates in one optimizer step
        gap_text = f"{gap:.1e} {gap_unit}" if engine == "verl" or args.opt_steps == 1 else "– (1 step only)"
        # verl in bypass mode logs the entropy on its checked iterations only (trainer.v1.gigpo_sync.logprob_check_freq)
        logged = [[m["actor/entropy"] for m in t if "actor/entropy" in m] for t in train]
        first = np.mean([e[0] for e in logged if e]) if any(logged) else np.nan
        last = np.mean([e[-1] for e in logged if e]) if any(logged) else np.nan
        lines.append(
            f"| {engine} | {config} | {np.mean([m.get(rows_key, np.nan) for m in flat]):.0f} | {steps} | "
            f"{gap_text} | {first:.3f} → {last:.3f} | "
            f"{np.mean([m.get('actor/pg_clipfrac', np.nan) for m in flat]):.4f} | "
            f"{np.mean([m.get('actor/grad_norm', np.nan) for m in flat]):.3f} |"
        )
    return lines


def launch_seconds(curves: dict[str, dict[str, Any]]) -> list[float]:
    """Per verl launch: wall seconds minus the seconds inside its iterations and validations (start-up, shutdown)."""
    out = []
    for c in curves.values():
        for rows, launch in zip(c["rows"], c["launches"], strict=True):
            if launch is not None:
                inside = sum(m.get("timing_s/step", 0.0) + m.get("timing_s/testing", 0.0) for m in rows)
                out.append(launch["wall_s"] - inside)
    return out


def within_budget(curve: dict[str, Any], budget: float) -> dict[int, float]:
    """Per seed, the validation success of the last validation after at most ``budget`` training episodes (a run
    that logs no episode count played ``budget`` in its iterations: its last validation)."""
    out = {}
    for i, seed in enumerate(curve["seeds"]):
        played = curve["episodes"][i]  # (V,)
        ok = np.flatnonzero(~np.isfinite(played) | (played <= budget))
        out[seed] = float(curve["val"][i, ok[-1]])
    return out


def paired_lines(curves: dict[str, dict[str, Any]], baseline: str, budget: float | None = None) -> list[str]:
    """Markdown: each configuration's paired difference from ``baseline`` (the same engine's, for labels
    ``engine/config``) in final validation success and in validation success averaged over training (the
    validations after the start), seed by seed (:func:`paired.paired_table`); with ``budget`` (the training episodes
    of a run without dynamic sampling), when some run played more, also at that budget (:func:`within_budget`); a
    line saying so when the baseline was not run."""
    more = budget is not None and any(
        np.isfinite(c["episodes"]).any() and np.nanmax(c["episodes"]) > budget for c in curves.values()
    )
    per_seed = {
        name: {
            "final": dict(zip(c["seeds"], c["val"][:, -1].tolist(), strict=True)),
            "mean": dict(zip(c["seeds"], c["val"][:, 1:].mean(axis=1).tolist(), strict=True)),
            **({"budget": within_budget(c, budget)} if more else {}),
        }
        for name, c in curves.items()
        if c["val"].shape[1] > 1
    }
    base = {name: f"{name.rpartition('/')[0]}/{baseline}".lstrip("/") for name in per_seed}
    metrics = {"final": "final val success", "mean": "mean val success over training"}
    if more:
        metrics["budget"] = f"val success within {budget:.0f} training episodes"
    table = paired_table(per_seed, base, metrics)
    if not table:
        return [
            f"No paired comparison: the baseline `{baseline}` has no run with validations after the start here.",
            "",
        ]
    return [
        f"Paired differences from `{baseline}` (`--baseline`), seed by seed (same seed, same validation tasks): "
        "mean and 95 % interval from the paired t with seeds − 1 degrees of freedom.",
        "",
        *table,
        "",
        "What these data support (an interval that excludes 0; else no difference shown at this number of seeds):",
        "",
        *verdicts(per_seed, base, budget if more else None),
        "",
    ]


#: the fewest paired seeds a verdict is drawn from
VERDICT_SEEDS = 3


def verdicts(
    per_seed: dict[str, dict[str, dict[int, float]]], base: dict[str, str], budget: float | None = None
) -> list[str]:
    """One markdown bullet per (configuration, metric) with a baseline: 'higher' / 'lower' than the baseline when the
    paired 95 % interval excludes 0, else 'no difference shown'; no verdict from fewer than :data:`VERDICT_SEEDS`
    seeds (two seeds whose differences happen to be equal give an interval of width 0). ``budget``: also the
    validation success within that many training episodes (``per_seed[...]["budget"]``)."""
    titles = {"final": "final validation success", "mean": "validation success averaged over training"}
    if budget is not None:
        titles["budget"] = f"validation success within {budget:.0f} training episodes"
    lines = []
    for name, values in per_seed.items():
        ref = base.get(name)
        if ref is None or ref == name or ref not in per_seed:
            continue
        for metric, title in titles.items():
            d = paired_difference(values[metric], per_seed[ref][metric])
            if d["n"] < VERDICT_SEEDS:
                said = f"too few paired seeds to say ({format_difference(d)}, {d['n']} seed(s))"
            elif d["low"] > 0:
                said = f"higher than `{ref}` ({format_difference(d)}, {d['n']} seeds)"
            elif d["high"] < 0:
                said = f"lower than `{ref}` ({format_difference(d)}, {d['n']} seeds)"
            else:
                said = f"no difference shown from `{ref}` ({format_difference(d)}, {d['n']} seeds)"
            lines.append(f"- `{name}`, {title}: {said}.")
    return lines


def kept_line(data: Path) -> str:
    """The line of a section that says where its kept data are."""
    return (
        f"Kept data: `{shown(data)}/` (every run's metrics, command, commit and config; `--report-only` rebuilds "
        "this section from them)."
    )


def markdown_verl(curves: dict, args: argparse.Namespace, command: str, wall: float | None, load: str, png: str) -> str:
    """The RESULTS.md section of the side-by-side benchmark (``--engine verl``)."""
    rows = summarise(curves, args.threshold, train_window(args.iters))
    settings = shared_settings(args)
    lines = [
        SECTION_VERL,
        "",
        f"Command: {command}",
        "",
        f"Model: `{args.model}` ({model_description(args.model)}; both engines start from it and sample over its "
        "whole vocabulary). "
        f"Task: {TASK_TITLES[args.task]} ({' '.join(TASKS[args.task])}); {args.iters} iterations x "
        f"({args.tasks} tasks x {args.group} episodes); validation on {args.val_size} fixed test-split tasks every "
        f"{args.test_freq} iterations (sampled, temperature 1); seeds {', '.join(str(s) for s in range(args.seeds))}. "
        "verl: `python -m verl_gigpo.main platform=cpu` per (configuration, seed), one FSDP rank, the `hf` rollout "
        "backend, verl's own metrics (file logger); local: `python -m verl_gigpo.local.train`, one torch thread. "
        "Mean ± std over seeds (population std); 'reaching' = some validation point at or above the threshold.",
        "",
        "Settings both engines share (one table in `benchmarks/learning_settings.py`, `shared_settings`):",
        "",
        "| setting | local engine | verl (`python -m verl_gigpo.main platform=cpu ...`) |",
        "|---|---|---|",
    ]
    for s in settings:
        local = "<br>".join(f"`{o}`" for o in s.local) or "–"
        verl = "<br>".join(f"`{o}`" for o in s.verl) or "(always the full vocabulary)"
        lines.append(f"| {s.what} | {local} | {verl} |")
    if args.extra:
        said = "<br>".join(f"`{o}`" for o in args.extra)
        lines.append(f"| given last on both engines (wins over the rows above) | {said} | {said} |")
    lines += [
        "| seed | `trainer.seed=S` | `data.seed=S` (order of the training tasks) |",
        "| training tasks | fresh seeds of the train split every iteration | train-split tasks 0 .. "
        f"{args.tasks * args.iters - 1} (`train.parquet`), each once, shuffled |",
        "",
        "Only on verl (plumbing and speed): `trainer.val_before_train=true trainer.save_freq=-1 "
        "trainer.resume_mode=disable trainer.logger=[console,file]`, micro-batches of "
        f"{args.micro_batch} rows (`ppo_micro_batch_size_per_gpu`, `log_prob_micro_batch_size_per_gpu`); "
        f"GiGPO runs on both engines write credit records every {args.credit_freq} iterations "
        "(`trainer.credit_log_freq`).",
        "",
        *_result_rows(
            rows,
            args.threshold,
            train_window(args.iters),
            engine_column=True,
            played=True,
        ),
        "",
        "Final validation success per seed:",
        "",
    ]
    for r in rows:
        engine, _, config = r["name"].rpartition("/")
        seeds = curves[r["name"]]["seeds"]
        per_seed = ", ".join(f"s{s} {v:.2f}" for s, v in zip(seeds, r["final_per_seed"], strict=True))
        lines.append(f"- {engine} {config}: {per_seed}")
    lines += [
        "",
        *paired_lines(curves, args.baseline, budget=args.iters * args.tasks * args.group),
        kept_line(args.data),
        "",
        f"![learning curves, verl (solid) and the local engine (dashed)]({png})",
        "",
        "Seconds per training iteration by phase (means over every run and iteration):",
        "",
        *phase_table(curves),
        "",
    ]
    startup = launch_seconds(curves)
    if startup:
        lines += [
            f"Per verl launch, outside iterations and validations (process and Ray start-up, model loading, "
            f"shutdown): {np.mean(startup):.0f} s (min {min(startup):.0f}, max {max(startup):.0f}).",
            "",
        ]
    lines += [
        "What the updates saw (gap: verl logs the largest |p_rollout − p_actor| of a token, "
        "`training/rollout_probs_diff_max`; the local engine the largest |log p| difference, "
        "`rollout/logprob_diff_max`, when it updates in one step; entropy: verl's `actor/entropy` is the policy's "
        "before each update, the local engine's the mean over the update's passes):",
        "",
        *diagnostics_table(curves, args),
        "",
    ]
    if wall is not None:
        lines.append(f"Wall time of the whole benchmark: {wall / 60:.0f} min. {load}")
        lines.append("")
    return "\n".join(lines)


def machine_load() -> tuple[float, float, float]:
    """The machine's load average over 1, 5 and 15 minutes."""
    return os.getloadavg()


def load_line(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    """The RESULTS.md line on the machine's load before and after the benchmark."""
    return (
        f"Machine load average (1/5/15 min) before: {', '.join(f'{x:.1f}' for x in before)}; "
        f"after: {', '.join(f'{x:.1f}' for x in after)} (2 cores, shared with other work)."
    )
