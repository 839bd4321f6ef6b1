"""Where ALFWorld games live and which ones a split plays (no alfworld/textworld import here).

Layout (what ``alfworld-download`` fills and what :mod:`environments.alfworld.synth` writes)::

    ROOT/json_2.1.1/<split>/<task-dir>/trial_*/{game.tw-pddl, traj_data.json, initial_state.pddl}
    ROOT/logic/{alfred.pddl, alfred.twl2}

``ROOT`` comes from the ``data_path`` argument or the ``ALFWORLD_DATA`` environment variable. A split's game
list is every ``game.tw-pddl`` under ``json_2.1.1/<split>`` that alfworld's own ``AlfredTWEnv`` would play
(one of the six task types, ``"solvable": true``, no ``movable``/``Sliced`` in its path), sorted by relative
path. That sorted list is the fixed evaluation list of ``valid_seen`` and ``valid_unseen``: game ``i`` of a
split is the same game on every machine that holds the same data.

Training plays the games in :func:`training_order`, a fixed interleave of the sorted list by task type: sorted by
path, the real training list holds its task types in long runs (every ``look_at_obj...`` game, then every
``pick_and_place...`` game, ...), so the first 2,048 of its games hold no heat and no pick-two game. In the
interleave, the first ``T`` games are one of each of the ``T`` task types present, and any prefix (the seeds
``0..TRAIN_SIZE-1`` of a run) holds each task type in proportion to its share of the list, within about one game
(the exact bound is in :func:`training_order`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

__all__ = [
    "DATA_ENV_VAR",
    "SPLITS",
    "TASK_KINDS",
    "TASK_TYPES",
    "GameEntry",
    "games_by_seed",
    "keep_data_env_var",
    "list_games",
    "missing_data_message",
    "resolve_json_root",
    "training_order",
]

DATA_ENV_VAR = "ALFWORLD_DATA"
#: short task kind -> ALFRED task type (the six types ALFWorld plays); kinds are used for per-type metrics
TASK_TYPES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick2": "pick_two_obj_and_place",
}
TASK_KINDS: tuple[str, ...] = tuple(TASK_TYPES)
KIND_OF_TASK_TYPE: dict[str, str] = {v: k for k, v in TASK_TYPES.items()}
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")


@contextlib.contextmanager
def keep_data_env_var() -> Iterator[None]:
    """Undo what importing ``alfworld`` does to ``$ALFWORLD_DATA``: its first import sets the variable to
    ``~/.cache/alfworld`` when unset, which would make every later environment look there. Wrap the import."""
    before = os.environ.get(DATA_ENV_VAR)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DATA_ENV_VAR, None)
        else:
            os.environ[DATA_ENV_VAR] = before


def missing_data_message(problem: str) -> str:
    """The error text for unusable data: what is wrong, then the two ways to get games."""
    return (
        f"ALFWorld games not found: {problem}.\n"
        "  Real games: on a machine with GitHub access run `alfworld-download` (from `pip install alfworld`), copy "
        "the folder it fills (~/.cache/alfworld by default, holding json_2.1.1/ and logic/) here, then pass "
        f"data_path=/that/folder or set {DATA_ENV_VAR}=/that/folder.\n"
        "  Synthetic games (offline): `python -m environments.alfworld.synth --out DIR`, then "
        f"set {DATA_ENV_VAR}=DIR (or pass data_path=DIR)."
    )


def resolve_json_root(data_path: str | os.PathLike[str] | None) -> Path:
    """The ``json_2.1.1`` folder of the data named by ``data_path`` (or ``$ALFWORLD_DATA`` when None).

    ``data_path`` may be the data root (holding ``json_2.1.1/``) or the ``json_2.1.1`` folder itself.

    Raises:
        FileNotFoundError: no path given, the path does not exist, or it holds no split folders; the message
            says how to get real or synthetic games.
    """
    if data_path is None or str(data_path) == "":
        raw = os.environ.get(DATA_ENV_VAR, "")
        if not raw:
            raise FileNotFoundError(missing_data_message(f"no data_path given and {DATA_ENV_VAR} is not set"))
        where = f"{raw} (from ${DATA_ENV_VAR})"
    else:
        raw = os.fspath(data_path)
        where = f"{raw} (from data_path)"
    root = Path(raw).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(missing_data_message(f"{where} is not a directory"))
    for candidate in (root / "json_2.1.1", root):
        if any((candidate / split).is_dir() for split in SPLITS):
            return candidate.resolve()
    raise FileNotFoundError(
        missing_data_message(f"{where} holds no json_2.1.1/{{{','.join(SPLITS)}}} folders (is it empty?)")
    )


@dataclass(frozen=True)
class GameEntry:
    """One playable game.

    rel_path: posix path of ``game.tw-pddl`` relative to ``json_2.1.1`` (e.g. ``valid_seen/<task>/trial_x/...``);
        this is the environment's ``task_id``.
    task_type: the ALFRED task type (``pick_heat_then_place_in_recep``...).
    kind: the short kind (``heat``).
    """

    rel_path: str
    task_type: str

    @property
    def kind(self) -> str:
        """The short task kind: pick, look, clean, heat, cool or pick2."""
        return KIND_OF_TASK_TYPE[self.task_type]


@functools.lru_cache(maxsize=64)
def list_games(json_root: Path, split: str) -> tuple[GameEntry, ...]:
    """The playable games of ``split`` under ``json_root``, sorted by relative path (cached per process).

    Mirrors alfworld's ``AlfredTWEnv.collect_game_files`` filters: a ``traj_data.json`` of one of the six task
    types beside a ``game.tw-pddl`` whose ``solvable`` flag is true; paths with ``movable`` or ``Sliced``
    (relative to ``json_root``) are skipped, as alfworld does not support those tasks. The result is cached
    per ``(json_root, split)``; call ``list_games.cache_clear()`` after adding games to a folder in use.

    Raises:
        ValueError: unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {list(SPLITS)}")
    entries = []
    for traj in sorted((json_root / split).rglob("traj_data.json")):
        folder = traj.parent
        rel = (folder / "game.tw-pddl").relative_to(json_root).as_posix()
        if "movable" in rel or "Sliced" in rel:
            continue
        game = folder / "game.tw-pddl"
        if not game.is_file():
            continue
        task_type = json.loads(traj.read_text()).get("task_type")
        if task_type not in KIND_OF_TASK_TYPE:
            continue
        if json.loads(game.read_text()).get("solvable") is not True:
            continue
        entries.append(GameEntry(rel, task_type))
    entries.sort(key=lambda e: e.rel_path)
    return tuple(entries)


def training_order(games: Sequence[GameEntry]) -> tuple[GameEntry, ...]:
    """The order in which training seeds play ``games`` (the sorted list of :func:`list_games`): a deterministic
    interleave of the task types, each type's games keeping their sorted order.

    The ``j``-th game (0-based) of a task type with ``n`` games gets the position ``j / n`` in [0, 1); games are
    ordered by that position, ties by task type name, so the order depends only on the list. The first ``T``
    entries are then one game of each of the ``T`` types, and a prefix of length ``L`` holds ``c`` games of a type
    with ``n`` of the ``N`` games where ``L*n/N - T*n/N <= c <= L*n/N + 1``: its proportional share within one game
    above and ``T*n/N`` below (under 1.6 games for six types none of which holds more than 26% of the list).

    Returns:
        the same games, reordered (a permutation of ``games``).
    """
    by_type: dict[str, list[GameEntry]] = {}
    for game in games:
        by_type.setdefault(game.task_type, []).append(game)
    keyed = [
        (Fraction(j, len(members)), task_type, game)
        for task_type, members in by_type.items()
        for j, game in enumerate(members)
    ]
    keyed.sort(key=lambda item: (item[0], item[1]))  # stable: a type's games keep their order
    return tuple(game for _, _, game in keyed)


@functools.lru_cache(maxsize=64)
def games_by_seed(json_root: Path, split: str) -> tuple[GameEntry, ...]:
    """The games of ``split`` in the order seeds index them: :func:`training_order` of the sorted list for
    ``"train"``, the sorted list itself for the evaluation splits (cached per process, like :func:`list_games`;
    clear both caches after adding games to a folder in use).

    Raises:
        ValueError: unknown split.
    """
    games = list_games(json_root, split)
    return training_order(games) if split == "train" else games
