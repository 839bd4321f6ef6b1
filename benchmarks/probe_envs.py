"""The step-credit probe (``python -m verl_gigpo.probe``) on every registered environment with random valid actions:
the tables of docs/environments.md, "Will step credit help here? The probe".

    python benchmarks/probe_envs.py                        # 16 groups x 8 episodes per environment (prints the tables)
    python benchmarks/probe_envs.py --groups 4 -n 4 --envs gridnav,sokoban --out runs/probe/quick

Each environment is probed with its own defaults (step limit, split ``train``) and the probe's default key modes; its
report goes to ``--out/<env>`` (default ``runs/probe/envs``). ALFWorld plays the train games of ``ALFWORLD_DATA`` when
it is set, else synthetic games generated into ``--out/alfworld-data`` (3 per task type, alfworld's own generator).
An environment that cannot be built here (``webshop_real`` without a WebShop installation) gets a row saying why.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from environments import list_envs
from verl_gigpo.probe import ProbeOptions, ProbeResult, run_probe, write_report
from verl_gigpo.probe.report import COLUMNS, HTML_PAGE, PLOT_PNG, SUMMARY_JSON, TABLE_MD
from verl_gigpo.probe.stats import percent


def _alfworld_data(out: Path) -> str:
    """``ALFWORLD_DATA``, else synthetic games under ``out/alfworld-data`` (generated once)."""
    if os.environ.get("ALFWORLD_DATA"):
        return os.environ["ALFWORLD_DATA"]
    folder = out / "alfworld-data"
    if not (folder / "json_2.1.1" / "train").is_dir():
        from environments.alfworld.synth import generate

        generate(folder, games_per_type={"train": 3, "valid_seen": 1, "valid_unseen": 1}, seed=0)
    return str(folder)


def _clear(folder: Path) -> None:
    """Remove the report files an earlier run of this script left in ``folder`` (this script owns the folder)."""
    for name in (SUMMARY_JSON, TABLE_MD, PLOT_PNG, HTML_PAGE):
        if (folder / name).exists():
            (folder / name).unlink()
            print(f"replacing {folder / name}")


def _summary_rows(done: list[tuple[str, ProbeResult, float]], failed: list[tuple[str, str]]) -> list[str]:
    lines = [
        "| environment | max_steps | step rows | mean length | success | groups with equal returns | verdict | "
        "seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r, seconds in done:
        flat = percent(r.stats[0].flat_groups)
        verdict = f"{r.recommendation.verdict}: `{r.recommendation.key}`"
        lines.append(
            f"| {name} | {r.max_steps} | {r.rows} | {r.mean_length:.1f} | {percent(r.success)} | {flat} | {verdict} | "
            f"{seconds:.0f} |"
        )
    for name, reason in failed:
        lines.append(f"| {name} | | | | | | cannot run here: {reason} | |")
    return lines


def _key_rows(done: list[tuple[str, ProbeResult, float]]) -> list[str]:
    lines = ["| environment | key mode | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for name, r, _ in done:
        for i, s in enumerate(r.stats):
            cells = [
                name if i == 0 else "",
                f"`{s.key}`",
                f"{s.anchor_groups_per_group:.1f}",
                f"{s.shared_groups_per_group:.1f}",
                percent(s.singleton_rows),
                percent(s.signal_rows),
                percent(s.merged_rows),
                percent(s.signal_only_groups),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16, help="episode groups per environment (default 16)")
    parser.add_argument("-n", type=int, default=8, help="episodes per group (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random actions (default 0)")
    parser.add_argument("--envs", default=",".join(list_envs()), help="comma-separated (default: every registered)")
    parser.add_argument("--out", default="runs/probe/envs", help="reports go to OUT/<env> (default runs/probe/envs)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    done: list[tuple[str, ProbeResult, float]] = []
    failed: list[tuple[str, str]] = []
    for name in [e for e in args.envs.split(",") if e]:
        kwargs = {"data_path": _alfworld_data(out)} if name == "alfworld" else {}
        options = ProbeOptions(env=name, groups=args.groups, n=args.n, seed=args.seed, env_kwargs=kwargs)
        start = time.perf_counter()
        try:
            result = run_probe(options, progress=True)
        except (ImportError, ValueError) as exc:  # an environment that cannot be built here: its row says why
            reason = re.split(r" \(|; |\. ", str(exc))[0]  # its first clause
            print(f"{name}: cannot run here: {exc}")
            failed.append((name, reason))
            continue
        seconds = time.perf_counter() - start
        command = f"python benchmarks/probe_envs.py --groups {args.groups} -n {args.n} --seed {args.seed}"
        _clear(out / name)
        write_report(result, out / name, command=command)
        print(f"{name}: {result.recommendation.line}")
        done.append((name, result, seconds))
    print(f"\nCommand: `python benchmarks/probe_envs.py --groups {args.groups} -n {args.n} --seed {args.seed}`\n")
    print("\n".join(_summary_rows(done, failed)))
    print()
    print("\n".join(_key_rows(done)))
    print()
    for name, r, _ in done:
        print(f"- **{name}**: {r.recommendation.line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
