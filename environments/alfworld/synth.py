"""Offline generator of ALFRED-style ALFWorld games (no GitHub, no THOR, no downloads).

    python -m environments.alfworld.synth --out /tmp/alfworld_synth --games-per-type 4 --seed 0
    ALFWORLD_DATA=/tmp/alfworld_synth python -m environments.checker alfworld --seeds 2

Real ALFWorld games are made from ALFRED trajectories: each ``trial_*`` folder holds an
``initial_state.pddl`` (a PDDL problem over the ``alfred`` domain) and a ``traj_data.json`` (task type and
targets), and ``alfworld-generate`` turns them into playable ``game.tw-pddl`` files after checking with an
expert that each game is solvable. This module writes its own problems in that layout and then runs
alfworld's own generation code on them, so the games are played by the real TextWorld/PDDL engine exactly
like downloaded ones. Output layout (the one ``alfworld-download`` produces)::

    OUT/logic/{alfred.pddl, alfred.twl2}          copied from the alfworld wheel
    OUT/json_2.1.1/<split>/<task-dir>/trial_*/{initial_state.pddl, traj_data.json, game.tw-pddl}
    OUT/synth_manifest.json                        seed, options and counts of this run

Rooms, receptacles and objects use ALFRED class names and ALFRED-style ids (``Apple|-01.75|+00.97|+00.03``,
sink basins as ``Sink|...|SinkBasin``): alfworld's name demangler, its hand-coded expert and the PDDL
domain (``SinkBasinType``, ``MicrowaveType``, ``FridgeType``) depend on that naming. Which object fits in
which receptacle, and which objects can be cleaned, heated, cooled or toggled, comes from ALFRED's own
tables in ``alfworld.gen.constants``; goals come from ``alfworld.gen.goal_library``.

Splits mirror ALFRED: ``train`` and ``valid_seen`` draw rooms from the same pool of "seen" scenes (new
object placements and tasks), ``valid_unseen`` only from a disjoint pool of "unseen" scenes.

Everything is a function of ``--seed``: the problems come from ``np.random.default_rng`` streams keyed by
(seed, split, task type, index), and alfworld's generation step (which draws from Python's global
``random`` for the goal template and its expert) runs with the global ``random`` state seeded and restored
afterwards.

Deviations from real ALFWorld data (on purpose, numbered):
    1. One location per receptacle plus a start location; ALFRED scenes sometimes share a location.
    2. No sliced-object or movable-receptacle tasks (alfworld skips those too); knives still exist.
    3. Only desk lamps as light sources for ``look_at_obj_in_light``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.metadata
import importlib.util
import io
import json
import logging
import random
import shutil
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from environments.alfworld.data import SPLITS, TASK_KINDS, TASK_TYPES, keep_data_env_var

__all__ = [
    "SPLITS",
    "TASK_KINDS",
    "TASK_TYPES",
    "Problem",
    "SynthSummary",
    "generate",
    "main",
    "problem_to_pddl",
    "sample_problem",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- room layouts
# receptacle class -> (min count, max count) per room kind; class names are ALFRED's.
_ROOMS: dict[str, dict[str, tuple[int, int]]] = {
    "kitchen": {
        "Cabinet": (3, 6),
        "Drawer": (2, 4),
        "CounterTop": (1, 2),
        "DiningTable": (0, 1),
        "Fridge": (1, 1),
        "Microwave": (1, 1),
        "SinkBasin": (1, 1),
        "StoveBurner": (2, 4),
        "GarbageCan": (1, 1),
        "CoffeeMachine": (1, 1),
        "Toaster": (0, 1),
        "Shelf": (0, 2),
    },
    "bathroom": {
        "SinkBasin": (1, 2),
        "BathtubBasin": (0, 1),
        "Toilet": (1, 1),
        "CounterTop": (1, 1),
        "Cabinet": (1, 4),
        "Drawer": (0, 2),
        "GarbageCan": (1, 1),
        "TowelHolder": (0, 1),
        "HandTowelHolder": (0, 1),
        "ToiletPaperHanger": (1, 1),
        "Shelf": (0, 2),
    },
    "bedroom": {
        "Bed": (1, 1),
        "Desk": (0, 1),
        "SideTable": (1, 2),
        "Dresser": (0, 1),
        "Drawer": (1, 4),
        "Shelf": (0, 3),
        "GarbageCan": (1, 1),
        "LaundryHamper": (0, 1),
        "Safe": (0, 1),
    },
    "livingroom": {
        "Sofa": (1, 1),
        "ArmChair": (0, 1),
        "CoffeeTable": (1, 1),
        "SideTable": (1, 2),
        "TVStand": (0, 1),
        "Drawer": (0, 3),
        "Cabinet": (0, 2),
        "Shelf": (0, 2),
        "GarbageCan": (1, 1),
        "Ottoman": (0, 1),
    },
}
# objects that may appear in each room kind (ALFRED class names)
_ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "kitchen": (
        "Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato", "Bowl", "Cup", "Mug", "Plate", "Pan", "Pot",
        "Kettle", "Fork", "Knife", "ButterKnife", "Spoon", "Spatula", "Ladle", "DishSponge", "SaltShaker",
        "PepperShaker", "SoapBottle", "WineBottle", "Glassbottle", "CellPhone", "CreditCard",
    ),
    "bathroom": (
        "SoapBar", "SoapBottle", "SprayBottle", "ToiletPaper", "Cloth", "Candle", "TissueBox", "HandTowel",
        "DishSponge", "Towel", "Plunger",
    ),
    "bedroom": (
        "Book", "CellPhone", "CreditCard", "KeyChain", "Pen", "Pencil", "CD", "AlarmClock", "Laptop", "Pillow",
        "Mug", "Bowl", "Watch", "Cloth", "BaseballBat", "BasketBall", "TennisRacket", "Vase", "Statue",
    ),
    "livingroom": (
        "Book", "CellPhone", "CreditCard", "KeyChain", "RemoteControl", "Newspaper", "Pillow", "Laptop", "Statue",
        "Vase", "Watch", "Box", "TissueBox", "Candle", "Pen", "Pencil", "Plate", "Bowl",
    ),
}  # fmt: skip
# ALFRED scene numbering: kitchens 1-30, living rooms 201-230, bedrooms 301-330, bathrooms 401-430.
_SCENE_BASE = {"kitchen": 0, "livingroom": 200, "bedroom": 300, "bathroom": 400}
_SEEN_SCENES = range(1, 21)  # train + valid_seen
_UNSEEN_SCENES = range(21, 31)  # valid_unseen only
# room kinds each task is set in (a subset of ALFRED's GOALS_VALID that has the needed appliances)
_TASK_ROOMS = {
    "pick": ("kitchen", "bathroom", "bedroom", "livingroom"),
    "pick2": ("kitchen", "bathroom", "bedroom", "livingroom"),
    "look": ("bedroom", "livingroom"),
    "clean": ("kitchen", "bathroom"),
    "heat": ("kitchen",),
    "cool": ("kitchen",),
}
# the appliance a task uses is never its destination (no "cool some apple and put it in fridge")
_TOOL_RECEPTACLE = {"clean": ("SinkBasin", "BathtubBasin"), "heat": ("Microwave",), "cool": ("Fridge",)}
_TASK_PROPERTY = {"clean": "Cleanable", "heat": "Heatable", "cool": "Coolable"}
_LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")
_CONTAINERS = {
    "Cabinet", "Drawer", "Fridge", "Microwave", "GarbageCan", "Safe", "SinkBasin", "BathtubBasin", "Box",
    "LaundryHamper", "Toaster", "CoffeeMachine",
}  # fmt: skip


def _constants() -> ModuleType:
    """ALFRED's tables (``alfworld.gen.constants``), imported on first use."""
    try:
        with keep_data_env_var():
            import alfworld.gen.constants as constants
    except ImportError as exc:
        raise ImportError(
            'the ALFWorld synthetic generator needs the alfworld package: pip install -e ".[alfworld]" '
            "(or the lean set: pip install --no-deps -r requirements-alfworld.txt)"
        ) from exc
    return constants


# ---------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    """One ALFRED-style task in one room, before it is written to disk.

    receptacles: ``(alfred_id, class)`` pairs, e.g. ``("Sink|-01.99|+01.14|-00.98|SinkBasin", "SinkBasin")``.
    objects: ``(alfred_id, class, receptacle_id)`` triples: each object starts in that receptacle.
    locations: receptacle id -> location id (``loc|x|z|rotation|horizon``); ``start`` is the agent's.
    pddl_params: ALFRED's targets (``object_target``, ``parent_target``, ``toggle_target``, ...).
    """

    kind: str
    room: str
    scene_num: int
    receptacles: list[tuple[str, str]]
    objects: list[tuple[str, str, str]]
    locations: dict[str, str]
    start: str
    pddl_params: dict[str, Any]

    @property
    def task_type(self) -> str:
        """The ALFRED task type, e.g. ``pick_heat_then_place_in_recep``."""
        return TASK_TYPES[self.kind]


def _mangle(alfred_id: str) -> str:
    """ALFRED id -> PDDL name, the way ALFRED writes its problems (``|`` -> ``_bar_``, ``-`` -> ``_minus_``...)."""
    for char, word in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        alfred_id = alfred_id.replace(char, word)
    return alfred_id


class _Ids:
    """Draws unique ALFRED-style ids (3-D coordinates) for one room."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.used: set[str] = set()

    def _coords(self, n: int, scale: float) -> str:
        while True:
            values = self.rng.uniform(-scale, scale, size=n).round(2)
            text = "|".join(f"{v:+06.2f}" for v in values)
            if text not in self.used:
                self.used.add(text)
                return text

    def entity(self, cls: str) -> str:
        coords = self._coords(3, 4.0)
        if cls == "SinkBasin":  # ALFRED: the basin is a part of the sink, named after it
            return f"Sink|{coords}|SinkBasin"
        if cls == "BathtubBasin":
            return f"Bathtub|{coords}|BathtubBasin"
        return f"{cls}|{coords}"

    def location(self) -> str:
        while True:
            x, z = (int(v) for v in self.rng.integers(-12, 13, size=2))
            rot, hor = int(self.rng.integers(0, 4)), int(self.rng.choice([0, 15, 30, 45, 60]))
            text = f"loc|{x}|{z}|{rot}|{hor}"
            if text not in self.used:
                self.used.add(text)
                return text


def _room_layout(room: str, scene_num: int, seed: int) -> list[str]:
    """The receptacle classes of scene ``scene_num`` (one entry per receptacle), fixed by ``(seed, scene_num)``."""
    rng = np.random.default_rng([seed, 7, scene_num])
    classes = []
    for cls, (low, high) in _ROOMS[room].items():
        classes += [cls] * int(rng.integers(low, high + 1))
    return classes


def _can_hold(constants: ModuleType, recep_cls: str, obj_cls: str) -> bool:
    return obj_cls in constants.VAL_RECEPTACLE_OBJECTS.get(recep_cls, ())


def sample_problem(kind: str, rng: np.random.Generator, *, seed: int, unseen: bool) -> Problem:
    """Draw one solvable task of kind ``kind`` (``pick``, ``look``, ``clean``, ``heat``, ``cool``, ``pick2``).

    The room comes from the seen or the unseen scene pool (``unseen``); the scene's receptacles are a function
    of ``(seed, scene number)``, the task, object placement and start location of ``rng``.

    Raises:
        ValueError: unknown ``kind``.
        RuntimeError: no scene could host the task in 100 draws (the room tables would be inconsistent).
    """
    if kind not in TASK_TYPES:
        raise ValueError(f"unknown task kind {kind!r}; known kinds: {list(TASK_KINDS)}")
    constants = _constants()
    for _attempt in range(100):
        room = str(rng.choice(_TASK_ROOMS[kind]))
        pool = _UNSEEN_SCENES if unseen else _SEEN_SCENES
        scene_num = _SCENE_BASE[room] + int(rng.choice(pool))
        problem = _try_problem(kind, room, scene_num, rng, seed, constants)
        if problem is not None:
            return problem
    raise RuntimeError(f"could not place a {kind!r} task in 100 tries (seed {seed}); the room tables are inconsistent")


def _try_problem(
    kind: str, room: str, scene_num: int, rng: np.random.Generator, seed: int, constants: ModuleType
) -> Problem | None:
    """One attempt at a task in the given scene; None when the scene cannot host it."""
    layout = _room_layout(room, scene_num, seed)
    present = sorted(set(layout))
    candidates = [o for o in _ROOM_OBJECTS[room] if any(_can_hold(constants, r, o) for r in present)]
    if kind in _TASK_PROPERTY:
        tools = [r for r in _TOOL_RECEPTACLE[kind] if r in present]
        if not tools:
            return None
        candidates = [o for o in candidates if o in constants.VAL_ACTION_OBJECTS[_TASK_PROPERTY[kind]]]
    if kind == "look" and not any(r in present for r in _LAMP_HOLDERS):
        return None
    if not candidates:
        return None
    target = str(rng.choice(candidates))
    parent = ""
    if kind != "look":
        banned = set(_TOOL_RECEPTACLE.get(kind, ()))
        parents = [r for r in present if _can_hold(constants, r, target) and r not in banned]
        # the target must also be able to start somewhere that is not a destination (else the goal holds at once)
        parents = [p for p in parents if any(_can_hold(constants, r, target) and r != p for r in present)]
        if not parents:
            return None
        parent = str(rng.choice(parents))

    ids = _Ids(rng)
    receptacles = [(ids.entity(cls), cls) for cls in layout]
    locations = {rid: ids.location() for rid, _ in receptacles}
    start = ids.location()

    def homes(obj_cls: str, avoid: str = "") -> list[str]:
        return [rid for rid, rcls in receptacles if _can_hold(constants, rcls, obj_cls) and rcls != avoid]

    objects: list[tuple[str, str, str]] = []
    n_target = int(rng.integers(2, 4)) if kind == "pick2" else int(rng.integers(1, 3))
    for _ in range(n_target):
        spots = homes(target, avoid=parent)
        objects.append((ids.entity(target), target, str(rng.choice(spots))))
    toggle = ""
    if kind == "look":
        toggle = "DeskLamp"
        holders = [rid for rid, rcls in receptacles if rcls in _LAMP_HOLDERS]
        objects.append((ids.entity(toggle), toggle, str(rng.choice(holders))))
    distractor_classes = [o for o in candidates + list(_ROOM_OBJECTS[room]) if o != target and homes(o)]
    for _ in range(int(rng.integers(4, 10))):  # distractors: never of the target class, so counts stay as drawn
        cls = str(rng.choice(distractor_classes))
        objects.append((ids.entity(cls), cls, str(rng.choice(homes(cls)))))
    pddl_params = {
        "object_target": target,
        "parent_target": parent,
        "toggle_target": toggle,
        "mrecep_target": "",
        "object_sliced": False,
    }
    return Problem(kind, room, scene_num, receptacles, objects, locations, start, pddl_params)


def problem_to_pddl(problem: Problem, name: str) -> str:
    """The PDDL problem text (``initial_state.pddl``) of ``problem`` over alfworld's ``alfred`` domain.

    Declares every ALFRED object and receptacle class as an ``otype``/``rtype`` constant (the domain refers to
    ``SinkBasinType``, ``MicrowaveType``, ``KnifeType``...), then the room's entities, their static properties,
    the placement and the goal from ``alfworld.gen.goal_library`` for the task type.
    """
    constants = _constants()  # first: it imports alfworld without leaking $ALFWORLD_DATA
    import alfworld.gen.goal_library as goal_library

    static_receptacles = sorted(constants.RECEPTACLES - set(constants.MOVABLE_RECEPTACLES))
    object_classes = sorted(constants.OBJECTS_SET - set(static_receptacles))
    actions = constants.VAL_ACTION_OBJECTS
    m = _mangle
    decl = ["agent1 - agent"]
    decl += [f"{c}Type - otype" for c in object_classes]
    decl += [f"{c}Type - rtype" for c in static_receptacles]
    decl += [f"{m(oid)} - object" for oid, _, _ in problem.objects]
    decl += [f"{m(rid)} - receptacle" for rid, _ in problem.receptacles]
    decl += [f"{m(loc)} - location" for loc in [*problem.locations.values(), problem.start]]

    init = [f"(atLocation agent1 {m(problem.start)})"]
    for rid, rcls in problem.receptacles:
        init.append(f"(receptacleType {m(rid)} {rcls}Type)")
        init.append(f"(receptacleAtLocation {m(rid)} {m(problem.locations[rid])})")
        if rcls in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {m(rid)})")
    for oid, ocls, rid in problem.objects:
        o = m(oid)
        init += [f"(objectType {o} {ocls}Type)", f"(inReceptacle {o} {m(rid)})"]
        init.append(f"(objectAtLocation {o} {m(problem.locations[rid])})")
        if ocls not in actions["Toggleable"]:
            init.append(f"(pickupable {o})")
        for prop, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable")):
            if ocls in actions[prop]:
                init.append(f"({pred} {o})")
        if ocls in actions["Toggleable"]:
            init.append(f"(toggleable {o})")
        if ocls in actions["Sliceable"]:
            init.append(f"(sliceable {o})")
        if ocls in constants.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {o})")
    recep_classes = sorted({rcls for _, rcls in problem.receptacles})
    obj_classes = sorted({ocls for _, ocls, _ in problem.objects})
    init += [f"(canContain {r}Type {o}Type)" for r in recep_classes for o in obj_classes if _can_hold(constants, r, o)]
    params = problem.pddl_params
    goal = goal_library.gdict[problem.task_type]["pddl"].replace("#", "-")
    goal = goal.format(
        obj=params["object_target"],
        recep=params["parent_target"],
        toggle=params["toggle_target"],
        mrecep=params["mrecep_target"],
    )
    lines = [f"(define (problem plan_{name})", "(:domain alfred)", "(:objects"]
    lines += [f"    {d}" for d in decl]
    lines += ["    )", "(:init"]
    lines += [f"    {i}" for i in init]
    lines += ["    )"]
    return "\n".join(lines) + "\n" + goal.strip() + "\n"


def _words(cls: str) -> str:
    """ALFRED class -> plain words for human-style goals: ``DiningTable`` -> ``dining table``."""
    special = {"SinkBasin": "sink", "BathtubBasin": "bathtub", "CD": "CD", "TVStand": "TV stand"}
    if cls in special:
        return special[cls]
    out = "".join(f" {c.lower()}" if c.isupper() else c for c in cls).strip()
    return out.replace("glassbottle", "glass bottle")


def _human_goals(problem: Problem) -> list[str]:
    """Natural phrasings of the goal, stored as ``turk_annotations`` (alfworld uses them when asked to).

    No final period: alfworld's grammar adds one after the goal.
    """
    p = problem.pddl_params
    obj = _words(p["object_target"])
    if problem.kind == "look":
        lamp = _words(p["toggle_target"])
        return [f"Examine the {obj} under the {lamp}", f"Pick up a {obj} and turn on the {lamp} to look at it"]
    recep = _words(p["parent_target"])
    prep = "in" if p["parent_target"] in _CONTAINERS else "on"
    verb = {"clean": "Rinse off", "heat": "Heat up", "cool": "Chill"}.get(problem.kind)
    if problem.kind == "pick2":
        return [f"Put two {obj}s {prep} the {recep}", f"Move a pair of {obj}s {prep}to the {recep}"]
    if verb:
        return [
            f"{verb} a {obj} and put it {prep} the {recep}",
            f"{verb} the {obj}, then place it {prep} the {recep}",
        ]
    return [f"Put a {obj} {prep} the {recep}", f"Move the {obj} {prep}to the {recep}"]


def _traj_data(problem: Problem, trial: str, seed: int) -> dict[str, Any]:
    """``traj_data.json`` content: what alfworld reads (task type, targets, annotations) plus provenance."""
    return {
        "task_id": trial,
        "task_type": problem.task_type,
        "pddl_params": dict(problem.pddl_params),
        "scene": {"scene_num": problem.scene_num, "room": problem.room},
        "turk_annotations": {"anns": [{"task_desc": text, "votes": [1]} for text in _human_goals(problem)]},
        "synthetic": {"generator": "environments.alfworld.synth", "seed": seed},
    }


def _task_dir(problem: Problem) -> str:
    p = problem.pddl_params
    second = p["toggle_target"] if problem.kind == "look" else p["parent_target"]
    return f"{problem.task_type}-{p['object_target']}-None-{second}-{problem.scene_num}"


# ---------------------------------------------------------------------------------------------- alfworld step
def _load_alfworld_generate() -> ModuleType:
    """Import the ``alfworld-generate`` console script of the installed alfworld wheel as a module.

    The script keeps its logic in ``gen_game_files(args)``; its ``__main__`` block (argument parsing, the
    interactive y/n question) does not run on import.
    """
    try:
        dist = importlib.metadata.distribution("alfworld")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ImportError('alfworld is not installed: pip install -e ".[alfworld]"') from exc
    scripts = [f for f in (dist.files or []) if f.name == "alfworld-generate"]
    if not scripts:
        raise ImportError("the installed alfworld wheel has no 'alfworld-generate' script; reinstall alfworld==0.4.2")
    path = Path(str(dist.locate_file(scripts[0]))).resolve()
    loader = importlib.machinery.SourceFileLoader("_alfworld_generate", str(path))
    spec = importlib.util.spec_from_loader("_alfworld_generate", loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if not hasattr(module, "gen_game_files"):
        raise ImportError(f"{path} has no gen_game_files(); this generator was written against alfworld 0.4.2")
    return module


def _make_game(
    gen: ModuleType, trial_dir: Path, logic: Path, *, game_seed: int, expert: str, human_goal_prob: float
) -> dict[str, Any]:
    """Run alfworld's own ``gen_game_files`` on one trial folder and return the game file's content.

    Quirks of the script handled here: its default ``end=-1`` drops the last problem (we pass ``end=None``);
    it asks a y/n question on stdin only in its ``__main__`` block (we call the function); the goal template
    and the hand-coded expert draw from the global ``random`` (seeded with ``game_seed`` here, and the caller's
    state is restored afterwards); it prints progress bars (captured and logged at DEBUG level).
    """
    args = argparse.Namespace(
        data_path=str(trial_dir),  # its glob '<data_path>/**/traj_data.json' also matches the folder itself
        save_path=str(trial_dir),
        domain=str(logic / "alfred.pddl"),
        grammar=str(logic / "alfred.twl2"),
        expert_type=expert,
        verbose=False,
        start=0,
        end=None,
        goal_desc_human_anns_prob=human_goal_prob,
        seed=game_seed,
    )
    saved = random.getstate()
    buffer = io.StringIO()
    try:
        random.seed(game_seed)
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            gen.gen_game_files(args)
    finally:
        random.setstate(saved)
    logger.debug("alfworld gen_game_files on %s:\n%s", trial_dir, buffer.getvalue())
    game = trial_dir / "game.tw-pddl"
    if not game.exists():
        raise RuntimeError(f"alfworld wrote no game for {trial_dir}; its output was:\n{buffer.getvalue()[-2000:]}")
    return json.loads(game.read_text())


@dataclass
class SynthSummary:
    """What :func:`generate` made.

    path: the data root (use it as ``ALFWORLD_DATA`` or ``data_path``).
    counts: split -> task kind -> number of playable games.
    games: relative paths (posix) of every ``game.tw-pddl``, sorted.
    seconds: wall time per game (problem sampling + writing + alfworld's generation and solvability check),
        in generation order.
    rejected: problems alfworld's expert could not solve, which were replaced by new draws.
    """

    path: Path
    counts: dict[str, dict[str, int]]
    games: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    rejected: int = 0

    @property
    def n_games(self) -> int:
        """Total number of games."""
        return len(self.games)

    @property
    def seconds_per_game(self) -> float:
        """Mean wall time per game."""
        return float(np.mean(self.seconds)) if self.seconds else 0.0


_MAX_ATTEMPTS = 10


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a non-negative int, got {value!r}")
    return value


def _plan_counts(games_per_type: int | Mapping[str, Any], kinds: Sequence[str]) -> dict[str, dict[str, int]]:
    """``games_per_type`` as ``{split: {kind: n}}``: an int applies to every split and kind; a mapping gives
    per split an int (for each of ``kinds``) or a ``{kind: n}`` mapping; missing splits and kinds get 0."""
    if not isinstance(games_per_type, Mapping):
        n = _count(games_per_type, "games_per_type")
        return {split: dict.fromkeys(kinds, n) for split in SPLITS}
    unknown = [s for s in games_per_type if s not in SPLITS]
    if unknown:
        raise ValueError(f"games_per_type: unknown splits {unknown}; known splits: {list(SPLITS)}")
    plan = {}
    for split in SPLITS:
        value = games_per_type.get(split, 0)
        if isinstance(value, Mapping):
            bad = [k for k in value if k not in kinds]
            if bad:
                raise ValueError(f"games_per_type[{split!r}]: kinds {bad} are not among kinds={list(kinds)}")
            plan[split] = {k: _count(value.get(k, 0), f"games_per_type[{split!r}][{k!r}]") for k in kinds}
        else:
            plan[split] = dict.fromkeys(kinds, _count(value, f"games_per_type[{split!r}]"))
    return plan


def generate(
    out: str | Path,
    *,
    games_per_type: int | Mapping[str, Any] = 1,
    seed: int = 0,
    kinds: Sequence[str] = TASK_KINDS,
    expert: str = "planner",
    human_goal_prob: float = 0.0,
) -> SynthSummary:
    """Write ALFRED-style problems under ``out`` and turn each into a playable ALFWorld game with alfworld's
    own generation code; games alfworld's expert cannot solve are replaced by fresh draws.

    Args:
        out: output directory; must not already hold a ``json_2.1.1`` folder.
        games_per_type: games per task kind in every split; or per split (``{"train": 2, "valid_seen": 1}``), or
            per split and kind (``{"valid_seen": {"pick": 1}}``); splits and kinds left out get 0.
        seed: the only source of randomness: the same arguments give byte-identical games. Game ``i`` of a
            (split, kind) does not depend on how many games are asked for, so small sets are prefixes of big ones.
        kinds: task kinds to generate (default all six).
        expert: alfworld's solvability check: ``"planner"`` (the PDDL planner must find a plan; ~1 s a game) or
            ``"handcoded"`` (alfworld's hand-written expert must play the game to the goal, as
            ``alfworld-generate`` does by default; ~4 s a game, and some draws are rejected).
        human_goal_prob: probability that a game's goal text is one of the natural ``turk_annotations``
            instead of alfworld's template (``put a apple in fridge``); real ALFWorld games use templates (0).

    Returns:
        a :class:`SynthSummary`.

    Raises:
        ValueError: bad arguments. FileExistsError: ``out`` already holds games.
        RuntimeError: no solvable draw in 10 attempts for some game (a bug in this generator).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    kinds = list(kinds)
    if not kinds or any(k not in TASK_TYPES for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {list(TASK_KINDS)}, got {kinds}")
    plan = _plan_counts(games_per_type, kinds)
    if expert not in ("handcoded", "planner"):
        raise ValueError(f"expert must be 'handcoded' or 'planner', got {expert!r}")
    if not 0.0 <= float(human_goal_prob) <= 1.0:
        raise ValueError(f"human_goal_prob must be in [0, 1], got {human_goal_prob!r}")
    out = Path(out).resolve()
    if "movable" in str(out) or "Sliced" in str(out):
        raise ValueError(f"{out}: alfworld silently skips every game whose path contains 'movable' or 'Sliced'")
    json_root = out / "json_2.1.1"
    if json_root.exists():
        raise FileExistsError(f"{json_root} already exists; pick a new --out directory or delete that folder first")

    with keep_data_env_var():
        import alfworld.info

        gen = _load_alfworld_generate()
    logic = out / "logic"
    logic.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(alfworld.info.ALFRED_PDDL_PATH, logic / "alfred.pddl")
    shutil.copyfile(alfworld.info.ALFRED_TWL2_PATH, logic / "alfred.twl2")
    summary = SynthSummary(out, {s: dict.fromkeys(kinds, 0) for s in SPLITS})
    for split_index, split in enumerate(SPLITS):
        for kind in kinds:
            for i in range(plan[split][kind]):
                t0 = time.perf_counter()
                rel = _make_one(gen, out, logic, split, split_index, kind, i, seed, expert, human_goal_prob, summary)
                summary.seconds.append(time.perf_counter() - t0)
                summary.counts[split][kind] += 1
                summary.games.append(rel)
    summary.games.sort()
    manifest = {
        "generator": "environments.alfworld.synth",
        "seed": seed,
        "expert": expert,
        "human_goal_prob": human_goal_prob,
        "counts": summary.counts,
        "rejected_draws": summary.rejected,
    }
    (out / "synth_manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return summary


def _make_one(
    gen: ModuleType,
    out: Path,
    logic: Path,
    split: str,
    split_index: int,
    kind: str,
    i: int,
    seed: int,
    expert: str,
    human_goal_prob: float,
    summary: SynthSummary,
) -> str:
    """Draw, write and build game ``i`` of ``(split, kind)``; return its relative path."""
    kind_index = TASK_KINDS.index(kind)
    for attempt in range(_MAX_ATTEMPTS):
        rng = np.random.default_rng([seed, split_index, kind_index, i, attempt])
        problem = sample_problem(kind, rng, seed=seed, unseen=split == "valid_unseen")
        trial = f"trial_s{seed}_{kind}_{i:05d}"
        folder = out / "json_2.1.1" / split / _task_dir(problem) / trial
        folder.mkdir(parents=True)
        (folder / "initial_state.pddl").write_text(problem_to_pddl(problem, trial))
        (folder / "traj_data.json").write_text(json.dumps(_traj_data(problem, trial, seed), indent=1) + "\n")
        game_seed = zlib.crc32(f"{seed}/{split}/{kind}/{i}/{attempt}".encode())
        data = _make_game(gen, folder, logic, game_seed=game_seed, expert=expert, human_goal_prob=human_goal_prob)
        # alfworld marks a game solvable when the walkthrough is not None; the planner returns [] for "no plan"
        if data.get("solvable") and data.get("walkthrough"):
            return (folder / "game.tw-pddl").relative_to(out).as_posix()
        summary.rejected += 1
        logger.info("alfworld's %s expert could not solve %s (attempt %d); drawing another", expert, folder, attempt)
        shutil.rmtree(folder)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # the task folder, when no other trial is left in it
    raise RuntimeError(
        f"no solvable {kind!r} game for {split} #{i} (seed {seed}) in {_MAX_ATTEMPTS} draws with expert={expert!r}; "
        "try expert='planner' or report this seed"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m environments.alfworld.synth --out DIR [--games-per-type N] [--seed S]``."""
    parser = argparse.ArgumentParser(description="Generate synthetic ALFRED-style games for ALFWorld, offline.")
    parser.add_argument("--out", required=True, help="output directory (then: export ALFWORLD_DATA=DIR)")
    parser.add_argument("--games-per-type", type=int, default=2, help="games per task type in train (default 2)")
    parser.add_argument(
        "--eval-games-per-type", type=int, default=None, help="games per task type in each valid split (default: same)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--kinds", default=",".join(TASK_KINDS), help="comma-separated task kinds (default: all six)")
    parser.add_argument(
        "--expert", choices=("planner", "handcoded"), default="planner", help="solvability check (default planner)"
    )
    parser.add_argument("--human-goal-prob", type=float, default=0.0, help="share of human-style goal texts (0)")
    args = parser.parse_args(argv)
    n_eval = args.games_per_type if args.eval_games_per_type is None else args.eval_games_per_type
    try:
        summary = generate(
            args.out,
            games_per_type={"train": args.games_per_type, "valid_seen": n_eval, "valid_unseen": n_eval},
            seed=args.seed,
            kinds=[k.strip() for k in args.kinds.split(",") if k.strip()],
            expert=args.expert,
            human_goal_prob=args.human_goal_prob,
        )
    except (ValueError, FileExistsError) as exc:
        parser.error(str(exc))
    print(summary.path)
    for split, per_kind in summary.counts.items():
        print(f"{split}: {sum(per_kind.values())} games ({', '.join(f'{k}={n}' for k, n in per_kind.items())})")
    total = sum(summary.seconds)
    print(f"{summary.n_games} games in {total:.1f} s ({summary.seconds_per_game:.2f} s/game, "
          f"{summary.rejected} draws rejected by the expert)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
