"""Per-step credit records: what the step-credit estimator credited, one JSON line per valid step row (both engines).

Every ``trainer.credit_log_freq`` iterations (0 = off) the engine writes ``<run dir>/credit/iter_<k>.jsonl`` for
``trainer.credit_log_groups`` sampled episode groups; the numbers are the :class:`~verl_gigpo.advantage.AdvantageTerms`
the update used, nothing recomputed. The fields and how to read them: docs/credit-report.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.advantage import AdvantageTerms
from verl_gigpo.config.rules import Range, check_settings, whole
from verl_gigpo.rollout.rows import truncate_text
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.vision import aside, save_images

__all__ = [
    "CREDIT_DIR",
    "RECORD_FIELDS",
    "CreditLogOptions",
    "CreditLogger",
    "anchor_key_hash",
    "copy_images",
    "credit_records",
    "read_credit_records",
    "read_json_lines",
    "select_groups",
    "write_credit_records",
]

logger = logging.getLogger(__name__)

#: sub-folder of the run directory that holds ``iter_<k>.jsonl``
CREDIT_DIR = "credit"

RECORD_FIELDS = (
    "iteration",
    "group",
    "traj",
    "step",
    "anchor_key",
    "anchor_group",
    "anchor_group_size",
    "observation",
    "action",
    "action_valid",
    "step_reward",
    "step_return",
    "episode_return",
    "episode_adv",
    "step_adv",
    "advantage",
    "won",
    "task_id",
    "task_type",
)
"""The keys every record has, in file order (docs/credit-report.md); records also carry ``method``
and the method's extras (:attr:`AdvantageTerms.extras`)."""


# ---------------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class CreditLogOptions:
    """The ``trainer.credit_log_*`` options (both engines): ``freq`` (0 = off), ``groups`` (-1 = all), ``max_chars``."""

    freq: int = whole(0, "log every N iterations; 0 turns credit records off", low=0, key="credit_log_freq")
    groups: int = 2
    max_chars: int = whole(200, "characters kept of each text, e.g. 200", low=1, key="credit_log_max_chars")

    def __post_init__(self) -> None:
        check_settings(self, "trainer")
        groups = Range(
            "trainer.credit_log_groups",
            "int",
            "episode groups per logged iteration, or -1 for every episode group",
            low=1,
        )
        if self.groups != -1:  # -1: every episode group
            groups.check(self.groups)

    @classmethod
    def from_trainer(cls, trainer: Mapping[str, Any] | None, *, estimator: str | None = None) -> CreditLogOptions:
        """Read and validate ``trainer.credit_log_*`` (the one reader); warns when ``estimator`` writes no records."""
        trainer = trainer or {}
        default = cls.__dataclass_fields__
        options = cls(
            freq=trainer.get("credit_log_freq", default["freq"].default),
            groups=trainer.get("credit_log_groups", default["groups"].default),
            max_chars=trainer.get("credit_log_max_chars", default["max_chars"].default),
        )
        if options.enabled and estimator is not None and estimator not in STEP_CREDIT_ESTIMATORS:
            logger.warning(
                "trainer.credit_log_freq=%d but algorithm.adv_estimator=%s: credit records hold the terms of the "
                "step-credit estimators (gigpo, hgpo, graphgpo, g2po), none are written",
                options.freq,
                estimator,
            )
        return options

    @property
    def enabled(self) -> bool:
        """Whether any iteration is logged."""
        return self.freq > 0

    def due(self, iteration: int) -> bool:
        """Whether training iteration ``iteration`` (1, 2, ...) is logged: ``freq > 0 and iteration % freq == 0``."""
        return self.freq > 0 and int(iteration) >= 1 and int(iteration) % self.freq == 0


def anchor_key_hash(key: Any) -> str:
    """A short stable id of an anchor key: the first 12 hex digits of BLAKE2b of ``str(key)``."""
    return hashlib.blake2b(str(key).encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


# ---------------------------------------------------------------------------------------------------- records
def select_groups(group_ids: np.ndarray, row_mask: np.ndarray, k: int, rng: np.random.Generator) -> list[Any]:
    """``k`` (-1: all) episode groups with a valid row, drawn with ``rng``; ``group_ids``, ``row_mask``: (N,)."""
    valid_groups = np.asarray(group_ids, dtype=object)[np.asarray(row_mask, dtype=bool)]
    seen: dict[Any, None] = dict.fromkeys(valid_groups.tolist())  # keeps first-appearance order
    groups = list(seen)
    if k < 0 or k >= len(groups):
        return groups
    picked = sorted(rng.choice(len(groups), size=k, replace=False).tolist())
    return [groups[i] for i in picked]


def credit_records(
    terms: AdvantageTerms,
    *,
    iteration: int,
    steps: StepBatch,
    groups: Iterable[Any] | None = None,
    max_chars: int = 200,
    image_folder: str | Path | None = None,
) -> list[dict[str, Any]]:
    """One record per valid row of ``groups`` (None: all), in batch order, from ``terms`` and the (N,) rows ``steps``.

    A row's ``images``: its ``steps.image_refs`` when named, else its ``steps.images`` stored as PNGs in
    ``image_folder`` (None: left out). Raises when the row counts differ.
    """
    n = _check_rows(terms, steps)
    gids = np.asarray(steps.group_ids, dtype=object)
    keep = terms.row_mask.copy()
    if groups is not None:
        wanted = set(groups)
        keep &= np.fromiter((g in wanted for g in gids), dtype=bool, count=n)
    records = []
    for i in np.flatnonzero(keep).tolist():
        records.append(
            {
                "iteration": int(iteration),
                "group": _plain(gids[i]),
                "traj": _plain(steps.traj_ids[i]),
                "step": int(steps.step_ids[i]),
                "anchor_key": anchor_key_hash(steps.anchor_keys[i]),
                "anchor_group": int(terms.anchor_group[i]),
                "anchor_group_size": int(terms.anchor_group_size[i]),
                "observation": truncate_text(steps.observations[i], max_chars),
                "action": truncate_text(steps.actions[i], max_chars),
                "action_valid": bool(steps.action_valid[i]),
                "step_reward": float(steps.step_rewards[i]),
                "step_return": float(terms.step_return[i]),
                "episode_return": float(terms.episode_return[i]),
                "episode_adv": float(terms.episode_adv[i]),
                "step_adv": float(terms.step_adv[i]),
                "advantage": float(terms.advantage[i]),
                "won": bool(steps.won[i]),
                "task_id": _plain(steps.task_ids[i]),
                "task_type": _plain(steps.task_types[i]),
                "method": terms.method,
                **{name: float(values[i]) for name, values in terms.extras.items()},
            }
        )
        if steps.image_refs is not None and steps.image_refs[i]:  # stored already (verl's agent loop, evaluation)
            records[-1]["images"] = list(steps.image_refs[i])
        elif image_folder is not None and steps.images is not None and steps.images[i]:
            records[-1]["images"] = save_images(steps.images[i], image_folder)
    return records


def copy_images(refs: Sequence[str], source: str | Path, folder: str | Path) -> list[str]:
    """Copy the PNGs ``refs`` (paths relative to ``source``, e.g. ``images/<sha1>.png``) to the same paths under
    ``folder`` (a file there already is kept: names are pixel hashes); returns ``refs``. FileNotFoundError naming a
    missing file."""
    source, folder = Path(source), Path(folder)
    for ref in refs:
        src, dst = source / ref, folder / ref
        if Path(ref).is_absolute() or ".." in Path(ref).parts:
            raise ValueError(f"image path {ref!r} (in a record of {source}) must be relative, inside that folder")
        if dst.exists():
            continue
        if not src.is_file():
            raise FileNotFoundError(f"image {src} named by a record of {source} is missing; was the folder moved?")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = aside(dst)
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)  # whole or absent, as save_images writes
    return list(refs)


def write_credit_records(records: Sequence[Mapping[str, Any]], run_dir: str | Path, iteration: int) -> Path:
    """Write ``records`` to ``<run_dir>/credit/iter_<iteration>.jsonl`` (replacing it atomically); returns the path."""
    out = Path(run_dir) / CREDIT_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"iter_{int(iteration)}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def read_credit_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one ``iter_<k>.jsonl`` file; one error naming the file and line for a bad line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no credit records file {path}")
    return read_json_lines(
        path, RECORD_FIELDS, what="a credit record", hint="credit files are written by trainer.credit_log_freq > 0"
    )


def read_json_lines(path: Path, fields: Sequence[str], *, what: str, hint: str = "") -> list[dict[str, Any]]:
    """The JSON objects of the lines of ``path``, each checked to hold ``fields``; errors name file and line."""
    records = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not JSON ({exc.msg}); was the file cut short?") from exc
            missing = [k for k in fields if not isinstance(record, dict) or k not in record]
            if missing:
                raise ValueError(f"{path}:{number} is not {what} (missing {missing}){'; ' + hint if hint else ''}")
            records.append(record)
    return records


class CreditLogger:
    """Writes credit records every ``options.freq`` iterations to ``<run_dir>/credit/``; ``seed`` seeds the sampling."""

    def __init__(self, options: CreditLogOptions, run_dir: str | Path, *, seed: int = 0) -> None:
        self.options = options
        self.run_dir = Path(run_dir)
        self.seed = int(seed)

    def due(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` is logged."""
        return self.options.due(iteration)

    def write(self, iteration: int, terms: AdvantageTerms, steps: StepBatch) -> Path:
        """Sample the groups of ``steps`` (the rows of ``terms``), write their records; returns the file."""
        _check_rows(terms, steps)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, int(iteration)])
        groups = select_groups(np.asarray(steps.group_ids, dtype=object), terms.row_mask, self.options.groups, rng)
        records = credit_records(
            terms,
            iteration=iteration,
            steps=steps,
            groups=groups,
            max_chars=self.options.max_chars,
            image_folder=self.run_dir / CREDIT_DIR,
        )
        path = write_credit_records(records, self.run_dir, iteration)
        logger.info(
            "credit records of iteration %d: %d rows of %d groups -> %s", iteration, len(records), len(groups), path
        )
        return path


def _check_rows(terms: AdvantageTerms, steps: StepBatch) -> int:
    """N, the rows of ``terms``; raises when ``steps`` has another number of rows."""
    n = terms.row_mask.shape[0]
    if len(steps) != n:
        raise ValueError(f"credit records: the batch has {len(steps)} rows but the estimator's terms have {n}")
    return n


def _plain(value: Any) -> Any:
    """A JSON-friendly id: numpy scalars -> Python scalars; other non-JSON types -> str."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
