"""ALFWorld (text) on the real TextWorld/PDDL engine of the ``alfworld`` package, one game per episode.

    env = AlfWorldEnv(data_path="/data/alfworld", key_mode="state", max_steps=50)   # or $ALFWORLD_DATA
    obs, info = env.reset(seed=3, options={"split": "valid_seen"})   # game 3 of the sorted valid_seen list
    obs, reward, terminated, truncated, info = env.step(info["admissible_actions"][0])

Engine: the same wrapper stack as alfworld's ``AlfredTWEnv`` (``PddlEnv`` -> ``AlfredDemangler`` ->
``AlfredInfos`` [-> ``AlfredExpert`` in planner mode]), built once per environment instance and fed one game
at a time (batch size 1, no gym/multiprocessing layer). A reset of the game already loaded only resets the
engine; another game is loaded into the same engine. The engine parses a game's logic on every load and
translates its PDDL to fast-downward's SAS format on every reset; both are memoised per process
(``engine_cache``), so the members of an episode group and repeated resets of one game do that work once.
``close()`` frees the engine's planning task.

Tasks: ``reset(seed=i, options={"split": s})`` plays game ``i`` of :func:`environments.alfworld.data.games_by_seed`.
``valid_seen``/``valid_unseen`` are fixed evaluation lists (the split's games sorted by path) and ``i >= n`` is an
error. ``train`` plays :func:`~environments.alfworld.data.training_order`, an interleave of the sorted list by task
type, and wraps around (``i % n``): seeds ``0..k-1`` hold every task type in proportion for any ``k``, and
``k >= n`` plays every game. ``seed=None`` draws the game from ``self.np_random``. ``task_id`` is the game's path
relative to ``json_2.1.1``; ``task_type`` is pick, look, clean, heat, cool or pick2; the task text is the goal of
the "Your task is to: ..." line.

Actions: the engine's admissible commands (``look``, ``inventory``, ``examine ...`` included) except ``help``,
which the reference implementation leaves out of the listed actions too (verl-agent, ``env_manager.py``,
``AlfWorldEnvironmentManager.build_text_obs``). A reply is matched after collapsing runs of whitespace and
lower-casing; anything else (a typo, a trailing period, a command that is not admissible now) is invalid under
the ``admissible`` invalid-action rule. Under the ``format`` rule (the reference's ``alfworld_projection``: an
action block, think tags, no Chinese characters) such a command is sent to the engine as it is, which answers
"Nothing happens." (or runs ``help``) and leaves the state as it was; that answer is the next observation. A reply
without an action block sends its last 30 characters, as the reference does.

Prompt: the task is stated once, in the prompt's header; :meth:`AlfWorldEnv.prompt_fields` leaves the "Your task
is to: ..." line out of the observations it shows (the first observation holds it). The observations themselves
(``observation`` anchor keys, history records) are the engine's text, unchanged.

Reward: ``success_reward`` (default 10.0, as in the GiGPO paper) on the step that wins, else 0; the episode
terminates when won. ALFWorld has no losing state.

Anchor keys:
    * ``state``: a digest (sha256, 32 hex digits) of the engine's fact set: every PDDL fact that holds now,
      ids as in the problem file, sorted, so the same state gives the same digest whatever path led there.
      Left out: (1) the negative literals the engine keeps after an action deletes a fact (``not_atlocation``
      after leaving a place): under PDDL's closed world they only repeat that the positive fact is absent,
      and keeping them would make "go to A; go to B" differ from "go to B" (one engine quirk remains: the
      grammar's "look" text lists objects by a ``not_inreceptacle`` literal, so in real scenes where two
      receptacles share a location, an object moved between them is listed "next to" the first one, while
      the state digest, rightly, does not change); (2) facts of the bookkeeping
      predicate ``checked``, set by ``look``, ``examine``, ``inventory``, ``help`` and ``open`` but read by no
      precondition, goal or feedback text of alfworld's domain and grammar (with them, a ``look`` would make
      a "new" state); (3) fast-downward's derived ``new-axiom@`` facts, functions of the others.
      :meth:`AlfWorldEnv.state_facts` lists what is digested.
    * ``observation``: the raw text of the last observation, as in the paper. It aliases states: "You arrive
      at cabinet 1. The cabinet 1 is closed." reads the same whatever the agent carries, and "Nothing
      happens." (which the engine answers to a non-admissible command, sent under the ``format`` rule only) is
      one key for every state. The ``state`` key has no such aliasing.

Thread safety: the engine keeps process-global state (the fast-downward translator's options, the grammar
parser; it swaps ``sys.stdout`` and overwrites ``sys.argv`` on every reset), so every engine call runs under
one process-wide lock (which also guards the cache) and ``sys.argv`` is restored afterwards.
Environments in threads are safe but take turns; run them in processes for parallel speed. Each instance
loads its own copy of fast-downward's library (~34 MB file, as textworld does), so reuse instances.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from environments.alfworld.data import SPLITS, GameEntry, games_by_seed, keep_data_env_var, resolve_json_root
from environments.alfworld.prompt import ALFWORLD_HISTORY_ITEM, ALFWORLD_PROMPT, ALFWORLD_STEP_LIMIT_PHRASES
from environments.base import PromptStyle, StepResult, TextEnv

__all__ = ["AlfWorldEnv"]

logger = logging.getLogger(__name__)

#: predicates no precondition, goal or feedback text reads (set by look/examine/inventory/help/open)
BOOKKEEPING_PREDICATES = frozenset({"checked"})
#: engine commands left out of the admissible actions (as the reference's prompt leaves them out)
HIDDEN_COMMANDS = frozenset({"help"})
_TASK_PREFIX = "Your task is to: "
_ENGINE_LOCK = threading.RLock()


#: (what, args, kwargs) -> result of a pure engine-preparation step, most recently used last (see _memoised)
_ENGINE_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
ENGINE_CACHE_SIZE = 64


def _memoised(what: str, build: Callable[..., Any]) -> Callable[..., Any]:
    """``build`` with a process-wide LRU cache keyed by its (text) arguments.

    Used for the two slow, pure preparation steps of the engine: parsing a game's logic (domain + grammar with
    its goal text; ~0.25 s per load) and translating its PDDL problem to fast-downward's SAS format (twice per
    reset, ~0.1-0.3 s). The engine only reads their results (the one write, adding the task's types to the
    logic's type hierarchy, is idempotent), so the members of an episode group and repeated resets of a game
    can share them.
    """

    def cached(*args: Any, **kwargs: Any) -> Any:
        key = (what, args, tuple(sorted(kwargs.items())))
        if key in _ENGINE_CACHE:
            _ENGINE_CACHE.move_to_end(key)
            return _ENGINE_CACHE[key]
        value = build(*args, **kwargs)
        _ENGINE_CACHE[key] = value
        while len(_ENGINE_CACHE) > ENGINE_CACHE_SIZE:
            _ENGINE_CACHE.popitem(last=False)
        return value

    return cached


@contextlib.contextmanager
def _engine_call(*, cache: bool = True) -> Iterator[None]:
    """Run engine calls under one process-wide lock, with the memoised logic parser and PDDL translator swapped
    in (``cache``), and undo the engine's ``sys.argv`` overwrite afterwards."""
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic

    with _ENGINE_LOCK:
        argv = list(sys.argv)
        originals = (fast_downward.pddl2sas, pddl_logic.GameLogic)
        if cache:
            fast_downward.pddl2sas = _memoised("pddl2sas", originals[0])
            pddl_logic.GameLogic = _memoised("GameLogic", originals[1])
        try:
            yield
        finally:
            fast_downward.pddl2sas, pddl_logic.GameLogic = originals
            sys.argv[:] = argv


def _without_task_line(text: str) -> str:
    """``text`` without its "Your task is to: ..." lines and the blank lines they leave at the end."""
    if _TASK_PREFIX not in text:
        return text
    return "\n".join(line for line in text.split("\n") if not line.startswith(_TASK_PREFIX)).rstrip()


def _is_state_fact(fact: Any) -> bool:
    """Whether a fact of the engine's state enters the state digest (see the module docstring)."""
    return not (fact.is_negation or fact.name in BOOKKEEPING_PREDICATES or fact.name.startswith("new-axiom@"))


def _import_engine() -> dict[str, Any]:
    """Import textworld and alfworld's wrappers; a missing package raises ImportError saying what to install."""
    try:
        with keep_data_env_var():
            import textworld
            from alfworld.agents.environment.alfred_tw_env import (
                AlfredDemangler,
                AlfredExpert,
                AlfredExpertType,
                AlfredInfos,
            )
        from textworld.envs import PddlEnv
    except ImportError as exc:
        raise ImportError(
            f"the alfworld environment needs the alfworld and textworld packages ({exc}). Install them with "
            '`pip install -e ".[alfworld]"` or, without spaCy and other heavy extras, '
            "`pip install --no-deps -r requirements-alfworld.txt`"
        ) from exc
    return {
        "textworld": textworld,
        "PddlEnv": PddlEnv,
        "AlfredDemangler": AlfredDemangler,
        "AlfredInfos": AlfredInfos,
        "AlfredExpert": AlfredExpert,
        "planner": AlfredExpertType.PLANNER,
    }


class AlfWorldEnv(TextEnv):
    """ALFWorld text games (six ALFRED task types) with the :class:`~environments.base.TextEnv` contract.

    Args:
        data_path: the ALFWorld data root (holding ``json_2.1.1/``); default ``$ALFWORLD_DATA``.
        key_mode: ``"state"`` (fact-set digest), ``"observation"`` (raw last observation) or ``"history:K"``.
        max_steps: step limit per episode (the GiGPO paper uses 50).
        success_reward: reward of the winning step (paper: 10.0).
        expert_plan: also run alfworld's planner expert; :meth:`expert_plan` and each step's
            ``info["expert_plan"]`` then give the planner's plan from the current state (slower: it replans
            every step; for tests and demonstrations).
        engine_cache: share each game's parsed logic and PDDL-to-SAS translation across resets and instances in
            this process (an LRU of :data:`ENGINE_CACHE_SIZE` entries); same results, loads and resets several
            times faster. False parses and translates on every load/reset, as alfworld does.

    Raises:
        FileNotFoundError: no usable data folder (the message says how to download or generate games).
        ImportError: alfworld/textworld missing (the message says what to install).
        ValueError: bad ``success_reward``, ``key_mode`` or ``max_steps``.
    """

    name = "alfworld"
    splits = SPLITS
    prompt_template = ALFWORLD_PROMPT
    history_item_template = ALFWORLD_HISTORY_ITEM
    step_limit_phrases = ALFWORLD_STEP_LIMIT_PHRASES
    format_fallback_chars = 30
    thread_parallel = False  # one engine lock per process: host instances in worker processes for parallel steps

    def __init__(
        self,
        *,
        data_path: str | PathLike[str] | None = None,
        key_mode: str = "state",
        max_steps: int = 50,
        success_reward: float = 10.0,
        expert_plan: bool = False,
        engine_cache: bool = True,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        if isinstance(success_reward, bool) or not isinstance(success_reward, int | float):
            raise ValueError(f"success_reward must be a number, got {success_reward!r}")
        if not math.isfinite(success_reward):
            raise ValueError(f"success_reward must be finite, got {success_reward!r}")
        self.success_reward = float(success_reward)
        self.use_expert = bool(expert_plan)
        self.engine_cache = bool(engine_cache)
        self.json_root: Path = resolve_json_root(data_path)  # before importing alfworld (its import sets the var)
        engine = _import_engine()
        infos = engine["textworld"].EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
        tw = engine["PddlEnv"](infos)
        self._downward_lib = tw.downward_lib
        tw = engine["AlfredInfos"](engine["AlfredDemangler"](tw, shuffle=False))
        if self.use_expert:
            tw = engine["AlfredExpert"](tw, expert_type=engine["planner"])
        self._tw: Any = tw
        self._loaded: Path | None = None
        self._state: Any = None  # the engine's last GameState
        self._digest: str | None = None

    @classmethod
    def setup_problems(cls, kwargs: Mapping[str, Any]) -> list[tuple[str | None, str]]:
        """The data folder (``data_path``, else ``$ALFWORLD_DATA``) must hold ALFWorld's split folders
        (:func:`~environments.alfworld.data.resolve_json_root`); nothing is loaded."""
        data_path = kwargs.get("data_path")
        try:
            resolve_json_root(data_path)
        except FileNotFoundError as exc:
            return [("data_path" if data_path not in (None, "") else None, str(exc))]
        return []

    # ------------------------------------------------------------------ games
    def games(self, split: str) -> tuple[GameEntry, ...]:
        """The playable games of ``split`` in seed order (``reset(seed=i)`` plays entry ``i``, ``i % n`` for
        ``train``): sorted by path for the evaluation splits, the task-type interleave for ``train`` (module
        docstring)."""
        return games_by_seed(self.json_root, split)

    def num_tasks(self, split: str) -> int | None:
        """Size of the fixed task list of ``split``: the number of games of ``valid_seen``/``valid_unseen``
        (``reset(seed=i)`` needs ``i`` below it); None for ``train``, whose seeds wrap around its games."""
        self._check_split(split)
        return None if split == "train" else len(self.games(split))

    def task_type_of(self, seed: int, split: str) -> str:
        """The task kind (pick, look, clean, heat, cool or pick2) of the game ``reset(seed=seed)`` plays in
        ``split``, from the game list alone.

        Raises:
            ValueError: unknown split, a split without games, or a seed past a fixed evaluation list.
        """
        self._check_split(split)
        return self._game_of(split, int(seed)).kind

    def _game_of(self, split: str, seed: int | None) -> GameEntry:
        games = self.games(split)
        if not games:
            raise ValueError(
                f"alfworld: no playable games in split {split!r} under {self.json_root / split}; generate some "
                "with `python -m environments.alfworld.synth --out DIR` or download the real data "
                "(`alfworld-download`)"
            )
        if seed is None:
            return games[int(self.np_random.integers(len(games)))]
        if split == "train":
            return games[seed % len(games)]
        if seed >= len(games):
            raise ValueError(
                f"alfworld: seed {seed} is out of range for the fixed evaluation list of {split!r}, which "
                f"has {len(games)} games (use seeds 0..{len(games) - 1})"
            )
        return games[seed]

    # ------------------------------------------------------------------ hooks
    def _reset(self, split: str, options: dict[str, Any]) -> str:
        if self._tw is None:
            raise RuntimeError("alfworld: the environment was closed; make a new one")
        game = self._game_of(split, self.seed)
        path = self.json_root / game.rel_path
        self.task_id = game.rel_path
        self.task_type = game.kind
        with _engine_call(cache=self.engine_cache):
            if self._loaded != path:
                self._loaded = None
                logger.debug("alfworld: loading %s", path)
                self._tw.load(str(path))
                self._loaded = path
            self._state = self._tw.reset()
        self._digest = None
        obs = str(self._state.feedback)
        goal = [line for line in obs.splitlines() if line.startswith(_TASK_PREFIX)]
        if len(goal) != 1:
            raise ValueError(f"alfworld: {game.rel_path}: the first observation has no 'Your task is to:' line")
        self.task_description = goal[0][len(_TASK_PREFIX) :].strip()
        return obs

    def _step(self, action: str) -> StepResult:
        with _engine_call():
            self._state, _, _ = self._tw.step(action)
        self._digest = None
        won = bool(self._state["won"])
        extra = {"expert_plan": self.expert_plan()} if self.use_expert else None
        return StepResult(
            observation=str(self._state.feedback),
            reward=self.success_reward if won else 0.0,
            terminated=won,
            won=won,
            extra=extra,
        )

    def _state_digest(self) -> str:
        if self._state is None:
            return "<no game>"
        if self._digest is None:
            facts = sorted(str(fact) for fact in self._state["_facts"] if _is_state_fact(fact))
            self._digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:32]
        return self._digest

    def _admissible_actions(self) -> list[str] | None:
        if self._state is None:
            return None
        return [c for c in self._state["admissible_commands"] if c not in HIDDEN_COMMANDS]

    def _unmatched_step(self, command: str) -> StepResult:
        """Send a command that is not admissible now to the engine, as the reference does under its format rule:
        the engine answers "Nothing happens." and leaves the state (or runs a hidden command such as ``help``,
        which changes only bookkeeping facts)."""
        return self._step(command)

    def _match_action(self, candidate: str) -> str | None:
        wanted = " ".join(candidate.split()).lower()
        for command in self._admissible_actions() or ():
            if " ".join(command.split()).lower() == wanted:
                return command
        return None

    # ------------------------------------------------------------------ prompt
    def prompt_fields(
        self,
        observation: str,
        info: dict[str, Any],
        history: Sequence[tuple[str, str]] = (),
        style: PromptStyle | None = None,
    ) -> dict[str, Any]:
        """The base fields, with the task stated once: the header's task line stays, and the "Your task is to:
        ..." line is left out of the observations shown (the first observation of a game holds it)."""
        shown = [(_without_task_line(obs), act) for obs, act in history]
        return super().prompt_fields(_without_task_line(observation), info, shown, style)

    # ------------------------------------------------------------------ extras
    def state_facts(self, *, names: bool = True) -> list[str]:
        """The facts the ``state`` key digests, sorted, for inspection: e.g. ``"holds(agent 1, apple 1)"``.

        ``names=True`` writes entities with their in-game names (``apple 1``); ``names=False`` with the PDDL
        ids that the digest uses.
        """
        if self._state is None:
            return []
        infos = self._state["_entity_infos"]
        out = []
        for fact in self._state["_facts"]:
            if not _is_state_fact(fact):
                continue
            if names:
                args = ", ".join((infos[v.name].name or v.name).strip() for v in fact.arguments)
                out.append(f"{fact.name}({args})")
            else:
                out.append(str(fact))
        return sorted(out)

    def expert_plan(self) -> list[str]:
        """The plan of alfworld's PDDL planner expert from the current state (a list of admissible commands).

        Raises:
            RuntimeError: the environment was built without ``expert_plan=True``, or not reset yet.
        """
        if not self.use_expert:
            raise RuntimeError("alfworld: build the environment with expert_plan=True to get the expert's plan")
        if self._state is None:
            raise RuntimeError("alfworld: call reset() first")
        return list(self._state["extra.expert_plan"])

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Different action sequences from this reset that reach the same state (and the same last observation).

        * ``go to A; go to B`` vs ``go to B``;
        * ``go to A; look; inventory; examine A; go to B`` vs ``go to B`` (bookkeeping actions change nothing);
        * ``go to C; open C; close C; go to B`` vs ``go to B`` for an openable receptacle ``C``;
        * ``go to R; take o from R; move o to R; go to B`` vs ``go to B`` for an object ``o`` lying on an
          open receptacle ``R`` (the world is back as it was).
        """
        pairs = super().checker_paths()
        if self._state is None:
            return pairs
        receptacles = sorted(c[len("go to ") :] for c in self._state["admissible_commands"] if c.startswith("go to "))
        if len(receptacles) < 2:
            return pairs
        facts = self._state["_facts"]
        infos = self._state["_entity_infos"]

        def name(var: Any) -> str:
            return str(infos[var.name].name).strip()

        def where(pred: str) -> set[str]:
            return {name(f.arguments[0]) for f in facts if f.name == pred}

        closed = sorted((where("openable") - where("opened")) & set(receptacles))
        pickupable = where("pickupable")
        rtype = {name(f.arguments[0]): f.arguments[1].name for f in facts if f.name == "receptacletype"}
        otype = {name(f.arguments[0]): f.arguments[1].name for f in facts if f.name == "objecttype"}
        fits = {(f.arguments[0].name, f.arguments[1].name) for f in facts if f.name == "cancontain"}
        place = {name(f.arguments[0]): f.arguments[1].name for f in facts if f.name == "receptacleatlocation"}
        # an object that can be taken (receptacle not closed) and put back (the receptacle type can hold it)
        lying = sorted(
            (name(f.arguments[1]), name(f.arguments[0]))
            for f in facts
            if f.name == "inreceptacle" and name(f.arguments[0]) in pickupable
        )
        lying = [
            (r, o) for r, o in lying if r in receptacles and r not in closed and (rtype.get(r), otype.get(o)) in fits
        ]

        def elsewhere(x: str) -> str | None:
            """The last receptacle (by name) at another location than ``x``: "go to" it is admissible from ``x``."""
            others = [r for r in receptacles if place.get(r) != place.get(x)]
            return others[-1] if others else None

        a = receptacles[0]
        b = elsewhere(a)
        if b is not None:
            pairs.append(([f"go to {a}", f"go to {b}"], [f"go to {b}"]))
            pairs.append(([f"go to {a}", "look", "inventory", f"examine {a}", f"go to {b}"], [f"go to {b}"]))
        for c in closed[:1]:
            other = elsewhere(c)
            if other is not None:
                pairs.append(([f"go to {c}", f"open {c}", f"close {c}", f"go to {other}"], [f"go to {other}"]))
        for r, o in lying[:1]:
            other = elsewhere(r)
            if other is not None:
                path = [f"go to {r}", f"take {o} from {r}", f"move {o} to {r}", f"go to {other}"]
                pairs.append((path, [f"go to {other}"]))
        return pairs

    def close(self) -> None:
        """Release the engine: free fast-downward's planning task and drop every reference. Safe to call twice.

        The library copy the engine loaded stays mapped: unloading it (``fast_downward.close_lib``, a
        ``dlclose``) makes the process crash with a segmentation fault at exit (measured with
        alfworld 0.4.2 / fast-downward-textworld 20.6.4), so reuse environment instances across episodes
        rather than making one per episode.
        """
        if self._tw is None:
            return
        with _engine_call():
            self._tw.close()
            self._downward_lib.cleanup()
        self._tw = None
        self._state = None
        self._loaded = None
        self._downward_lib = None
