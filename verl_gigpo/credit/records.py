"""Per-step credit records: what the step-credit estimator (GiGPO, HGPO, GraphGPO, G2PO) credited, one JSON line
per step row (both engines).

    python -m verl_gigpo.local.train trainer.credit_log_freq=10          # local engine
    python -m verl_gigpo.main ... trainer.credit_log_freq=10             # verl engine (written by the driver)
    python -m verl_gigpo.inspect runs/local                              # the report (verl_gigpo.inspect)

Every ``trainer.credit_log_freq`` iterations (0 = off, the default) the engine writes
``<run dir>/credit/iter_<k>.jsonl`` (run dir = ``trainer.default_local_dir``): one JSON object per valid step row
of ``trainer.credit_log_groups`` episode groups sampled from the batch (-1 = every group). The numbers are the
per-row arrays of the :class:`~verl_gigpo.advantage.AdvantageTerms` that the estimator returned for that batch and
whose advantages the update used; nothing is recomputed. Padding rows and rows of failed episodes (``row_mask``
False) are not written.

================== ===========================================================================================
field              meaning
================== ===========================================================================================
iteration          training iteration k (verl's ``global_steps``)
group              episode group id (verl: the ``uid``; local engine: the task's index in the iteration)
traj               trajectory id; step: step id in the trajectory (0-based)
anchor_key         12-hex-digit hash of the anchor key (the raw key can be a long observation)
anchor_group       the anchor group (episode group, anchor key) A_S was computed in (``AdvantageTerms.anchor_group``:
                   an id within this iteration's batch; with ``key_mode=similarity``, the merged group)
anchor_group_size  valid rows in that anchor group (1 = singleton: A_S = 0)
observation        the observation the action was chosen from, cut to ``trainer.credit_log_max_chars``
action             the parsed action, or the reply (cut likewise) when it held no valid action
action_valid       the reply held a valid action
step_reward        r_t (environment reward + shaping)
step_return        R_t = sum_{k >= t} gamma^(k - t) r_k
episode_return     R(tau) = sum_t r_t of the trajectory
episode_adv        A_E (episode-level relative advantage; HGPO: 0 unless its episode term is on)
step_adv           the method's step term: GiGPO A_S (within the anchor group), HGPO the mix over history depths,
                   GraphGPO A_G (graph return within the anchor group), G2PO A_1 + A_2
advantage          the advantage the update used (GiGPO: A = A_E + w * A_S)
won                the episode was won
task_id, task_type the environment's task id and type (None when the environment has none)
method             the estimator: gigpo, hgpo, graphgpo or g2po (records without it are GiGPO's)
distance           GraphGPO: d(s_t), the state's distance to a win in the group's state graph (and
next_distance      d(s_{t+1}), 0 after a winning last step); graph_return: r_succ * omega^d(s_{t+1})
node_value         G2PO: V(s_t), the merged state's mean discounted outcome; next_value: V'(t) = V(s_{t+1})
depths_used        HGPO: how many history depths gave the row a nonzero group advantage; deepest_depth: the
                   deepest of them (0: none)
images             with image observations (local engine): the PNGs the prompt showed, as paths relative to the
                   ``credit/`` folder (``images/<sha1 of the pixels>.png``, each drawing stored once)
================== ===========================================================================================

The method rows above ``images`` are written only by the method named (the extras of its terms).

Size: about ``rows * (2 * credit_log_max_chars + 400)`` bytes per logged iteration (gridnav demo: 2 groups, about
100 rows, 40 KB). Sampling uses its own generator seeded by (seed, iteration): with logging on or off, training
draws the same random numbers, so the run is the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
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
from verl_gigpo.rollout.vision import save_images

__all__ = [
    "CREDIT_DIR",
    "RECORD_FIELDS",
    "CreditLogOptions",
    "CreditLogger",
    "anchor_key_hash",
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
"""The keys every record has, in file order (documented in the module docstring); records also carry ``method``
and the method's extras (:attr:`AdvantageTerms.extras`)."""


# ---------------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class CreditLogOptions:
    """The ``trainer.credit_log_*`` options (the same keys on both engines).

    freq: write records every ``freq`` iterations (iterations k with k % freq == 0); 0 = off.
    groups: episode groups written per logged iteration, sampled; -1 = every group of the batch.
    max_chars: observation and action texts are cut to this many characters (bounds the files and, on verl,
        the text the agent loop adds to each row's ``extra_fields``).
    """

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
        """Read and validate ``trainer.credit_log_freq|groups|max_chars`` (missing keys take the defaults).

        The one reader of these keys: the verl trainer mode, the agent loop, the preflight check and the local
        engine all call it. With ``estimator`` given and not a step-credit estimator (gigpo, hgpo, graphgpo, g2po),
        logs a warning when records are on: they hold those estimators' terms, so other estimators write none.

        Raises:
            ValueError: a value out of range, naming the key and the valid values.
        """
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
        """Whether training iteration ``iteration`` (1, 2, ...) is logged: ``freq > 0`` and ``iteration % freq == 0``
        (never 0, the state before training)."""
        return self.freq > 0 and int(iteration) >= 1 and int(iteration) % self.freq == 0


def anchor_key_hash(key: Any) -> str:
    """A short stable id of an anchor key: the first 12 hex digits of BLAKE2b of ``str(key)``."""
    return hashlib.blake2b(str(key).encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


# ---------------------------------------------------------------------------------------------------- records
def select_groups(group_ids: np.ndarray, row_mask: np.ndarray, k: int, rng: np.random.Generator) -> list[Any]:
    """``k`` episode groups drawn without replacement from those with a valid row, in first-appearance order.

    Args:
        group_ids: ``(N,)`` episode group of each row.
        row_mask: ``(N,)`` bool, valid rows.
        k: how many; -1 (or more than there are) = all of them.
        rng: the generator to draw with (never the training one).
    """
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
    """One record per valid row of ``groups`` (all groups when None), in batch order.

    Args:
        terms: what the estimator (e.g. :func:`~verl_gigpo.advantage.gigpo_advantage_terms`) returned for this
            batch; every number of a record is read from it (``step_return``, ``episode_return``, ``episode_adv``,
            ``step_adv``, ``advantage``, ``anchor_group``, ``anchor_group_size``, ``row_mask``, ``method`` and the
            ``extras``).
        iteration: the training iteration.
        steps: the N step rows ``terms`` were computed on (:class:`~verl_gigpo.rollout.step_rows.StepBatch`): their
            ids, raw anchor keys (hashed into ``anchor_key``), step rewards, flags and texts.
        groups: the episode groups to write.
        max_chars: texts are cut to this many characters.
        image_folder: where the rows' images (``steps.images``) are stored as PNGs, named by the records'
            ``images`` (:func:`verl_gigpo.rollout.vision.save_images`); None leaves images out.

    Raises:
        ValueError: ``steps`` has not the N rows of ``terms``.
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
        if image_folder is not None and steps.images is not None and steps.images[i]:
            records[-1]["images"] = save_images(steps.images[i], image_folder)
    return records


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
    """The records of one ``iter_<k>.jsonl`` file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not a JSON object with the :data:`RECORD_FIELDS` (names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no credit records file {path}")
    return read_json_lines(
        path, RECORD_FIELDS, what="a credit record", hint="credit files are written by trainer.credit_log_freq > 0"
    )


def read_json_lines(path: Path, fields: Sequence[str], *, what: str, hint: str = "") -> list[dict[str, Any]]:
    """The JSON objects of the lines of ``path`` (blank lines skipped), each checked to hold ``fields``.

    Raises:
        ValueError: a line that is not JSON, or an object without one of ``fields``, naming the file, the line and
            ``what`` it should be (then ``hint``).
    """
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
    """Writes credit records every ``options.freq`` iterations (see the module docstring).

    Args:
        options: the validated ``trainer.credit_log_*`` options.
        run_dir: the run directory; files go to ``<run_dir>/credit/``.
        seed: seeds the group sampling together with the iteration (its own generator).
    """

    def __init__(self, options: CreditLogOptions, run_dir: str | Path, *, seed: int = 0) -> None:
        self.options = options
        self.run_dir = Path(run_dir)
        self.seed = int(seed)

    def due(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` is logged."""
        return self.options.due(iteration)

    def write(self, iteration: int, terms: AdvantageTerms, steps: StepBatch) -> Path:
        """Sample the groups of ``steps`` (the N step rows ``terms`` were computed on, as both engines build them),
        build their records (:func:`credit_records`) and write them; returns the file."""
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
    """N, the rows of ``terms``; raises ValueError when ``steps`` has another number of rows (other rows)."""
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
