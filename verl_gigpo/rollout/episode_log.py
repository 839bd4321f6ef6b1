"""Whole episodes where users look: ``episodes.jsonl`` and ``episodes.html`` in the run folder, a ``wandb.Table``,
tensorboard text (``trainer.log_episodes``; docs/episode-table.md).

    options = EpisodeLogOptions.from_trainer(cfg.trainer)
    records = [episode_record(ep, kind="val", iteration=k, max_chars=options.max_chars) for ep in chosen]
    EpisodeLog(run_dir, options, loggers=["tensorboard"]).write(records, step=k)

Both engines log the same episodes (:func:`logged_validation`, :func:`training_records`); on verl's path the agent
loop writes them to ``episodes_parts/`` (:class:`PartWriter`) and the trainer mode gathers them (:func:`drain_parts`).
"""

from __future__ import annotations

import html
import json
import logging
import os
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from verl_gigpo.config.rules import check_settings, whole
from verl_gigpo.rollout.rows import action_text
from verl_gigpo.rollout.types import Episode

__all__ = [
    "EPISODES_HTML",
    "EPISODES_JSONL",
    "PAGE_STYLE",
    "PARTS_DIR",
    "EpisodeLog",
    "EpisodeLogOptions",
    "PartWriter",
    "drain_parts",
    "episode_record",
    "logged_validation",
    "logger_names",
    "pick_validation",
    "sign_colour",
    "tensorboard_dir",
    "training_records",
    "truncate",
]

logger = logging.getLogger(__name__)

EPISODES_JSONL = "episodes.jsonl"
EPISODES_HTML = "episodes.html"
#: where verl's agent-loop workers append the chosen validation episodes, one file per process
PARTS_DIR = "episodes_parts"
#: the marker that ends a cut text
CUT_MARKER = " …[cut]"
#: the page style shared with the credit report (:mod:`verl_gigpo.credit.report`)
PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1400px;margin:auto;padding:1em} pre{background:#f6f6f6;padding:1em;"
    "overflow-x:auto} table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:3px 6px;"
    "text-align:left;vertical-align:top}"
)


@dataclass(frozen=True)
class EpisodeLogOptions:
    """``trainer.log_episodes`` (N episodes per validation; 0 = off), ``trainer.log_episodes_train_freq`` (also N
    training episodes every K iterations; 0 = never) and ``trainer.log_episodes_max_chars`` (text cap)."""

    episodes: int = whole(0, "whole episodes logged per validation; 0 = off", low=0, key="log_episodes")
    train_freq: int = whole(
        0, "also log training episodes every K iterations; 0 = never", low=0, key="log_episodes_train_freq"
    )
    max_chars: int = whole(1000, "characters kept of each logged text", low=20, key="log_episodes_max_chars")

    def __post_init__(self) -> None:
        check_settings(self, "trainer")

    @classmethod
    def from_trainer(cls, trainer: Mapping[str, Any] | None) -> EpisodeLogOptions:
        """Read and validate the ``trainer.log_episodes*`` keys (missing keys take the defaults); raises
        ``ValueError`` naming the key."""
        trainer = trainer or {}
        return cls(**{f.name: trainer[f.metadata["key"]] for f in fields(cls) if f.metadata["key"] in trainer})

    @property
    def enabled(self) -> bool:
        """Whether any episode is logged."""
        return self.episodes > 0

    def train_due(self, iteration: int) -> bool:
        """Whether training iteration ``iteration`` (1, 2, ...) logs its episodes."""
        return self.enabled and self.train_freq > 0 and iteration >= 1 and iteration % self.train_freq == 0


def truncate(text: Any, max_chars: int) -> str:
    """``str(text)`` cut to ``max_chars`` characters followed by :data:`CUT_MARKER` when longer; None -> ""."""
    text = "" if text is None else str(text)
    return text if len(text) <= max_chars else text[:max_chars] + CUT_MARKER


def logged_validation(seed: int, member: int, n: int) -> bool:
    """Whether a validation episode is logged: member 0 of tasks (seeds) ``0..n-1`` (validation tasks are seeds
    ``0..val_size-1`` on both engines), so every validation logs the same tasks."""
    return member == 0 and 0 <= int(seed) < n


def pick_validation(episodes: Sequence[Episode], n: int) -> list[Episode]:
    """The logged episodes of one validation (the first episode of each task ``0..n-1``), by task seed."""
    first: dict[int, Episode] = {}
    for episode in episodes:
        first.setdefault(int(episode.task.seed), episode)
    return [first[seed] for seed in sorted(first) if logged_validation(seed, 0, n)]


def _outcome(won: bool, env_error: str | None) -> str:
    return f"env error: {env_error}" if env_error else "won" if won else "lost"


def episode_record(episode: Episode, *, kind: str, iteration: int, max_chars: int) -> dict[str, Any]:
    """One logged episode: task, outcome and each step's observation, reply, action, validity and reward."""
    steps = [
        {
            "step": int(step.step_id),
            "observation": truncate(step.observation, max_chars),
            "reply": truncate(step.response_text, max_chars),
            "action": truncate(action_text(step.action, step.response_text, step.action_valid), max_chars),
            "valid": bool(step.action_valid),
            "reward": float(step.step_reward),
        }
        for step in episode.steps
    ]
    return {
        "kind": kind,
        "iteration": int(iteration),
        "env_name": episode.task.env_name,
        "split": episode.task.split,
        "seed": int(episode.task.seed),
        "task_id": None if episode.task_id is None else str(episode.task_id),
        "task_type": None if episode.task_type is None else str(episode.task_type),
        "traj": str(episode.traj_id),
        "outcome": _outcome(episode.won, episode.env_error),
        "episode_return": float(episode.episode_return),
        "length": int(episode.length),
        "num_invalid": int(episode.num_invalid),
        "steps": steps,
    }


def training_records(
    steps: Any, *, n: int, iteration: int, max_chars: int, terms: Any = None, advantages: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """The logged training episodes of ``steps`` (a StepBatch with texts): the first finished trajectory of each
    of the first ``n`` groups, each step with ``terms``' ``episode_adv``/``step_adv`` or ``advantages`` (N,)."""
    real = ~np.asarray(steps.padding, dtype=bool)  # (N,)
    chosen: dict[Any, Any] = {}  # group -> its first trajectory (the first whose environment did not fail, if any)
    for i in np.flatnonzero(real):
        group = steps.group_ids[i]
        if (group not in chosen and len(chosen) < n) or (
            group in chosen and chosen[group][1] and not steps.env_error[i]
        ):
            chosen[group] = (steps.traj_ids[i], bool(steps.env_error[i]))
    records = []
    for traj, _ in chosen.values():
        rows = [int(i) for i in np.flatnonzero(real & (steps.traj_ids == traj))]
        rows.sort(key=lambda i: int(steps.step_ids[i]))
        first = rows[0]
        env_error = bool(steps.env_error[first])
        out_steps = []
        for i in rows:
            step = {
                "step": int(steps.step_ids[i]),
                "observation": truncate(steps.observations[i], max_chars),
                "reply": None,
                "action": truncate(steps.actions[i], max_chars),
                "valid": bool(steps.action_valid[i]),
                "reward": float(steps.step_rewards[i]),
            }
            if terms is not None:
                step.update(
                    episode_adv=float(terms.episode_adv[i]),
                    step_adv=float(terms.step_adv[i]),
                    advantage=float(terms.advantage[i]),
                )
            elif advantages is not None:
                step["advantage"] = float(advantages[i])
            out_steps.append(step)
        length = int(steps.episode_lengths[first]) if int(steps.episode_lengths[first]) >= 0 else len(rows)
        records.append(
            {
                "kind": "train",
                "iteration": int(iteration),
                "env_name": None,
                "split": None,
                "seed": None,
                "task_id": None if steps.task_ids[first] is None else str(steps.task_ids[first]),
                "task_type": None if steps.task_types[first] is None else str(steps.task_types[first]),
                "traj": str(traj),
                "outcome": _outcome(bool(steps.won[first]), "failed" if env_error else None),
                "episode_return": float(sum(steps.step_rewards[i] for i in rows)),
                "length": length,
                "num_invalid": int(sum(not steps.action_valid[i] for i in rows)),
                "steps": [] if env_error and length == 0 else out_steps,
            }
        )
    return records


# ---------------------------------------------------------------------------------------------------- verl's parts
class PartWriter:
    """Appends episode records to ``<run>/episodes_parts/part_<host>_<pid>.jsonl`` (one file per agent-loop
    process, thread-safe); :func:`drain_parts` gathers them in the trainer."""

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = Path(run_dir) / PARTS_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"part_{socket.gethostname()}_{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record as a JSON line."""
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)


def drain_parts(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record the agent loops appended to ``episodes_parts/`` since the last call (the files are emptied),
    sorted by (iteration, seed)."""
    folder = Path(run_dir) / PARTS_DIR
    records = []
    for path in sorted(folder.glob("part_*.jsonl")) if folder.is_dir() else []:
        taken = path.with_name(path.name + ".taking")
        os.replace(path, taken)  # a writer appending now creates a fresh file, read next time
        records += [json.loads(line) for line in taken.read_text(encoding="utf-8").splitlines() if line.strip()]
        taken.unlink()
    return sorted(records, key=lambda r: (r["iteration"], r.get("seed") or 0, r["traj"]))


# ---------------------------------------------------------------------------------------------------- outputs
def logger_names(value: Any) -> list[str]:
    """``trainer.logger`` (a name or a list of names, verl accepts both; None) as a list of names."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(name) for name in value]


def tensorboard_dir(project: str, experiment: str) -> str:
    """Where verl's tensorboard logger writes (``TENSORBOARD_DIR``, else ``tensorboard_log/<project>/<experiment>``,
    the rule of ``verl.utils.tracking._TensorboardAdapter``)."""
    return os.environ.get("TENSORBOARD_DIR", f"tensorboard_log/{project}/{experiment}")


class EpisodeLog:
    """Writes logged episodes to the run folder (``episodes.jsonl``, ``episodes.html``) and to the loggers of
    ``trainer.logger``: a ``wandb.Table`` per kind, tensorboard text per task (docs/episode-table.md)."""

    def __init__(
        self, run_dir: str | Path, *, loggers: Iterable[str] = (), project: str = "verl_gigpo", experiment: str = "run"
    ) -> None:
        self.run_dir = Path(run_dir)
        self.loggers = {str(name) for name in loggers}
        self.project, self.experiment = project, experiment
        self._tensorboard = None

    @property
    def jsonl(self) -> Path:
        return self.run_dir / EPISODES_JSONL

    @property
    def html(self) -> Path:
        return self.run_dir / EPISODES_HTML

    def write(self, records: Sequence[Mapping[str, Any]], *, step: int) -> None:
        """Append ``records`` (logged at ``step``) to ``episodes.jsonl``, rewrite ``episodes.html`` from the whole
        file, and send them to wandb / tensorboard."""
        if not records:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.jsonl.open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        all_records = [json.loads(line) for line in self.jsonl.read_text(encoding="utf-8").splitlines() if line]
        self.html.write_text(episodes_page(all_records), encoding="utf-8")
        if "tensorboard" in self.loggers:
            self._write_tensorboard(records, step)
        if "wandb" in self.loggers:
            self._write_wandb(records, step)

    def _write_tensorboard(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        if self._tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter

            folder = tensorboard_dir(self.project, self.experiment)
            os.makedirs(folder, exist_ok=True)
            self._tensorboard = SummaryWriter(folder)
        for record in records:
            tag = f"episodes/{record['kind']}/{_task_label(record)}"
            self._tensorboard.add_text(tag, _markdown(record), global_step=step)
        self._tensorboard.flush()

    def _write_wandb(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        import wandb

        if wandb.run is None:
            logger.warning("trainer.logger has wandb but no wandb run is open: the episode table is not logged")
            return
        by_kind: dict[str, list[list[Any]]] = {}
        for record in records:
            by_kind.setdefault(record["kind"], []).extend(_table_rows(record))
        wandb.log(
            {f"episodes/{kind}": wandb.Table(columns=list(TABLE_COLUMNS), data=rows) for kind, rows in by_kind.items()},
            step=step,
        )

    def close(self) -> None:
        """Close the tensorboard writer (if one was opened)."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


#: the columns of the wandb table: one row per step
TABLE_COLUMNS = (
    "iteration",
    "task",
    "task_type",
    "outcome",
    "step",
    "observation",
    "reply",
    "action",
    "valid",
    "reward",
    "episode_adv",
    "step_adv",
    "advantage",
)


def _task_label(record: Mapping[str, Any]) -> str:
    if record.get("seed") is not None:
        return f"task{record['seed']}"
    return str(record.get("task_id") or record["traj"])


def _table_rows(record: Mapping[str, Any]) -> list[list[Any]]:
    return [
        [
            record["iteration"],
            _task_label(record),
            record.get("task_type"),
            record["outcome"],
            s["step"],
            s["observation"],
            s.get("reply"),
            s["action"],
            s["valid"],
            s["reward"],
            s.get("episode_adv"),
            s.get("step_adv"),
            s.get("advantage"),
        ]
        for s in record["steps"]
    ]


def _terms_text(step: Mapping[str, Any]) -> str:
    if "episode_adv" in step:
        return f"A_E {step['episode_adv']:+.3f}, A_S {step['step_adv']:+.3f}"
    return f"A {step['advantage']:+.3f}" if "advantage" in step else ""


def _markdown(record: Mapping[str, Any]) -> str:
    """One episode as tensorboard markdown: a header line, then a table of its steps."""
    head = (
        f"**{record['kind']} iteration {record['iteration']}, {_task_label(record)}** ({record.get('task_type')}): "
        f"{record['outcome']}, return {record['episode_return']:.3f}, {record['length']} steps, "
        f"{record['num_invalid']} invalid\n\n| step | observation | reply | action | valid | reward | advantage |\n"
        "|---|---|---|---|---|---|---|\n"
    )

    def cell(text: Any) -> str:
        return str(text or "").replace("|", "\\|").replace("\n", "<br>")

    rows = "".join(
        f"| {s['step']} | {cell(s['observation'])} | {cell(s.get('reply'))} | {cell(s['action'])} | "
        f"{'yes' if s['valid'] else 'NO'} | {s['reward']:+.3f} | {_terms_text(s)} |\n"
        for s in record["steps"]
    )
    return head + rows


def sign_colour(x: float, zero: float = 1e-9) -> str:
    """Blue for a positive value, red for a negative one, grey for about zero (the credit report's colours)."""
    return "#1f5fbf" if x > zero else "#c0392b" if x < -zero else "#777777"


def episodes_page(records: Sequence[Mapping[str, Any]]) -> str:
    """The self-contained HTML page of ``records``: per task, its episode at each logged iteration (latest first),
    each step's observation, reply, action, validity, reward and advantage terms."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["kind"], _task_label(record)), []).append(record)
    sections = []
    for (kind, task), episodes in sorted(groups.items(), key=lambda kv: (kv[0][0] != "val", kv[0][1])):
        blocks = []
        for record in sorted(episodes, key=lambda r: -r["iteration"]):
            colour = "#1a7f37" if record["outcome"] == "won" else "#c0392b"
            rows = "".join(
                f"<tr><td>{s['step']}</td><td><pre>{html.escape(s['observation'])}</pre></td>"
                f"<td><pre>{html.escape(s.get('reply') or '')}</pre></td><td>{html.escape(s['action'])}</td>"
                f"<td>{'yes' if s['valid'] else '<b style=color:#c0392b>no</b>'}</td><td>{s['reward']:+.3f}</td>"
                f"<td style=color:{sign_colour(s.get('advantage', 0.0))}>{html.escape(_terms_text(s))}</td></tr>"
                for s in record["steps"]
            )
            blocks.append(
                f"<details{' open' if not blocks else ''}><summary>iteration {record['iteration']}: "
                f"<b style=color:{colour}>{html.escape(record['outcome'])}</b>, return {record['episode_return']:.3f}, "
                f"{record['length']} steps, {record['num_invalid']} invalid</summary><table><tr><th>step</th>"
                "<th>observation</th><th>reply</th><th>action</th><th>valid</th><th>reward</th><th>advantage</th>"
                f"</tr>{rows}</table></details>"
            )
        task_type = episodes[0].get("task_type")
        sections.append(
            f"<h2>{html.escape(kind)}: {html.escape(task)}{f' ({html.escape(task_type)})' if task_type else ''}</h2>"
            + "".join(blocks)
        )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>episodes</title>'
        f"<style>{PAGE_STYLE} pre{{margin:0;padding:2px;white-space:pre-wrap;max-width:520px}}</style></head><body>"
        "<h1>Logged episodes</h1><p>Validation: the same tasks at every validation (member 0 of tasks "
        "0..N-1). Training: the first trajectory of the first N groups; A_E / A_S = episode and step advantage "
        "terms.</p>" + "".join(sections) + "</body></html>\n"
    )
