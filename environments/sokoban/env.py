"""Sokoban as a text environment (the GiGPO paper's 6x6, one-box setting by default).

    from environments import make_env
    env = make_env("sokoban", dim_room=(6, 6), num_boxes=1, max_steps=20, key_mode="state")
    obs, info = env.reset(seed=3, options={"split": "train"})
    action, valid = env.parse_action("<think>...</think><action>up</action>")
    obs, reward, terminated, truncated, info = env.step(action if valid else None)

**Rooms.** ``dim_room`` counts the outer wall (as gym-sokoban and the paper: a 6x6 room has a 4x4 interior). Each
``reset`` draws a room with :func:`environments.sokoban.generator.generate_room` from ``self.np_random``: solvable
by construction, no box starting on a target, shortest solution at most ``num_gen_steps`` moves (default
``max_steps // 2``, so the hardest room leaves the agent as many spare moves as it needs).
``reset(options={"room": text})`` plays a given layout instead (text as rendered, see
:func:`environments.sokoban.room.parse_room`; task id ``<split>/room-<sha1 prefix of the layout>``).

**Observation.** The grid, one symbol per cell separated by spaces, row 0 on top (legend: :data:`room.LEGEND`,
also in the task description)::

    # wall   _ floor   O target   X box   * box on a target   P player   S player on a target

After a step a one-line feedback (``You moved up.``, ``You pushed a box left onto a target.``, ``You cannot move
down: a wall is in the way. Nothing changed.`` ...) comes before the grid. The grid alone is the canonical
observation (``observation`` key mode) and the state digest (``state`` key mode): equal states give equal text.

**Images** (``observation='image'`` or ``'both'``, ``tile_size`` pixels per cell, default 8): each observation
also carries the room drawn by :func:`environments.sokoban.render.render_room_image` under ``info["images"]``; with
``'image'`` the text holds :data:`IMAGE_ONLY_TEXT` in place of the grid. The anchor key stays the state digest.

**Actions.** ``up``, ``down``, ``left``, ``right`` — always all four admissible. :meth:`SokobanEnv._match_action`
accepts, case-insensitively and with surrounding whitespace ignored: the bare word (``Up``), the word after
``move``, ``go`` or ``push`` and whitespace (``move left``), with an optional quote or backtick on either side
and an optional period before or after the closing quote (``"down".``, ``'up.'``). Anything else is not an
action (``step(None)``, the invalid-action step).
A move into a wall, or a push into a wall or another box, is a valid action that changes nothing.

**The format rule** (``parse_action(text, rule="format")``, the reference's ``sokoban_projection``): the command
is the first of ``up``, ``down``, ``left``, ``right``, ``still`` found anywhere in the lower-cased text between the
first ``<action>`` and the first ``</action>`` (so ``<action>push the box up</action>`` is ``up``); the reply is
valid when such a word is found and it has a ``<think>`` and a ``</think>`` tag (no Chinese-character test here,
as in the reference). Otherwise the command is ``still``, and the reply is invalid. ``still`` (or any command that
is not an action) is an unmatched command: nothing moves, and it costs ``reward_step`` like a blocked move (the
reference's no-op action 0 is charged the step cost too).

**Reward** (gym-sokoban's scheme; every value is a constructor argument), for a valid step::

    r = reward_step                                      (-0.1, every valid move, blocked or not)
      + reward_box_on_target    if a box was pushed onto a target  (+1)
      + reward_box_off_target   if a box was pushed off a target   (-1)
      + reward_solved           if now every box is on a target    (+10; terminated = won = True)

The invalid-action step gives 0 (the contract; the runner adds its own penalty). A room that can no longer be
solved (a box stuck in a corner) does not end the episode; it runs until ``max_steps`` (truncated).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from typing import Any

import numpy as np

from environments.base import StepResult, TextEnv
from environments.images import check_tile_size
from environments.sokoban.generator import check_room_config, generate_room
from environments.sokoban.prompt import SOKOBAN_HISTORY_ITEM, SOKOBAN_PROMPT, SOKOBAN_STEP_LIMIT_PHRASES, SOKOBAN_TASK
from environments.sokoban.render import IMAGE_LEGEND, render_room_image
from environments.sokoban.room import (
    ACTIONS,
    DIRECTIONS,
    LEGEND,
    MoveOutcome,
    Room,
    apply_move,
    parse_room,
    render_room,
)

__all__ = ["SokobanEnv"]

logger = logging.getLogger(__name__)

#: Most room states the generator may keep (``max_gen_states``): bounds the memory and time of one reset.
MAX_GEN_STATES = 2_000_000
#: ``observation=``: the grid as text (default, for text models), the room as an image, or both.
OBSERVATION_MODES = ("text", "image", "both")
#: What the text observation holds in place of the grid with ``observation='image'``.
IMAGE_ONLY_TEXT = "(The room is shown in the image.)"

#: The reference's sokoban_projection looks for these words, in this order, in the action block; "still" is a no-op.
FORMAT_WORDS = ("up", "down", "left", "right", "still")
_ACTION_OPEN = re.compile("<action>", re.IGNORECASE)
_ACTION_CLOSE = re.compile("</action>", re.IGNORECASE)
_ACTION_RE = re.compile(r"""["'`]?(?:(?:move|go|push)\s+)?(up|down|left|right)\.?["'`]?\.?""", re.IGNORECASE)
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
_CHECKER_PATH_LEN = 4  # checker_paths enumerates every action sequence up to this length


class SokobanEnv(TextEnv):
    """Sokoban: push every box onto a target (see the module docstring for observation, actions and reward).

    Args:
        dim_room: ``(height, width)`` including the outer wall (paper: ``(6, 6)``).
        num_boxes: boxes (= targets) per room (paper: 1).
        key_mode: anchor-key mode (``"state"``, ``"observation"`` or ``"history:K"``).
        max_steps: step limit of an episode (default 20: the paper-style short horizon for 6x6 with one box).
        num_gen_steps: the generator's reverse-play depth = the most moves a room's shortest solution may need;
            the difficulty knob. Default ``max(1, max_steps // 2)``.
        reward_step, reward_box_on_target, reward_box_off_target, reward_solved: the reward scheme.
        max_gen_states: cap on the generator's reverse search per layout (matters for large rooms only).

    Raises:
        ValueError: a bad value, or a room/box configuration for which no room can be generated.
    """

    name = "sokoban"
    splits = ("train", "test")
    reset_options = ("room",)
    prompt_template = SOKOBAN_PROMPT
    history_item_template = SOKOBAN_HISTORY_ITEM
    step_limit_phrases = SOKOBAN_STEP_LIMIT_PHRASES

    def __init__(
        self,
        *,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        key_mode: str = "state",
        max_steps: int = 20,
        num_gen_steps: int | None = None,
        reward_step: float = -0.1,
        reward_box_on_target: float = 1.0,
        reward_box_off_target: float = -1.0,
        reward_solved: float = 10.0,
        max_gen_states: int = 200_000,
        observation: str = "text",
        tile_size: int = 8,
    ) -> None:
        super().__init__(key_mode=key_mode, max_steps=max_steps)
        if observation not in OBSERVATION_MODES:
            raise ValueError(f"sokoban: observation must be one of {OBSERVATION_MODES}, got {observation!r}")
        if observation == "image" and self.key_kind == "observation":
            raise ValueError(
                "sokoban: key_mode='observation' keys by the grid text, which observation='image' does not show; "
                "use key_mode='state' (the same groups: the drawing is one-to-one)"
            )
        self.observation = observation
        self.images_per_step = 0 if observation == "text" else 1
        self.tile_size = check_tile_size(tile_size, "sokoban")
        if num_gen_steps is None:
            num_gen_steps = max(1, max_steps // 2)
        self.dim_room = check_room_config(dim_room, num_boxes, num_gen_steps)
        self.num_boxes = int(num_boxes)
        self.num_gen_steps = int(num_gen_steps)
        if (
            isinstance(max_gen_states, bool)
            or not isinstance(max_gen_states, int)
            or not 1 <= max_gen_states <= MAX_GEN_STATES
        ):
            raise ValueError(
                f"max_gen_states must be an int in [1, {MAX_GEN_STATES}] (room states kept while generating), "
                f"got {max_gen_states!r}"
            )
        self.max_gen_states = max_gen_states
        rewards = {
            "reward_step": reward_step,
            "reward_box_on_target": reward_box_on_target,
            "reward_box_off_target": reward_box_off_target,
            "reward_solved": reward_solved,
        }
        for key, value in rewards.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
        self.reward_step = float(reward_step)
        self.reward_box_on_target = float(reward_box_on_target)
        self.reward_box_off_target = float(reward_box_off_target)
        self.reward_solved = float(reward_solved)
        if self.num_gen_steps > max_steps:
            logger.warning(
                "sokoban: num_gen_steps=%d > max_steps=%d: some rooms need more moves than an episode allows",
                self.num_gen_steps,
                max_steps,
            )
        # Fail now, not at the first reset, when no room of this configuration can be generated.
        self._generate(np.random.default_rng(0))
        height, width = self.dim_room
        self.task_type = f"sokoban-{height}x{width}-{self.num_boxes}box"
        legend = {"text": LEGEND, "image": IMAGE_LEGEND, "both": f"{LEGEND}; {IMAGE_LEGEND}"}[observation]
        self.task_description = SOKOBAN_TASK.format(legend=legend)
        self._room: Room | None = None
        self._unseeded_resets = 0

    def task_type_of(self, seed: int, split: str) -> str:
        """The room configuration, e.g. ``"sokoban-6x6-1box"`` (the same for every task of an environment).

        Raises:
            ValueError: unknown split.
        """
        self._check_split(split)
        return str(self.task_type)

    # ------------------------------------------------------------------ hooks
    def _generate(self, rng: np.random.Generator) -> Room:
        return generate_room(
            rng,
            self.dim_room,
            self.num_boxes,
            num_gen_steps=self.num_gen_steps,
            max_states=self.max_gen_states,
        ).room

    def _reset(self, split: str, options: dict[str, Any]) -> str:
        layout = options.get("room")
        if layout is not None:
            if not isinstance(layout, str):
                raise ValueError(f"sokoban: options['room'] must be a rendered room (str), got {type(layout).__name__}")
            self._room = parse_room(layout)
            if self._room.solved:
                raise ValueError("sokoban: options['room'] is already solved (every box on a target); nothing to play")
            digest = hashlib.sha1(render_room(self._room).encode()).hexdigest()[:12]
            self.task_id = f"{split}/room-{digest}"
            return self._shown(self._room)
        self._room = self._generate(self.np_random)
        if self.seed is not None:
            self.task_id = f"{split}/seed-{self.seed}"
        else:
            self._unseeded_resets += 1
            self.task_id = f"{split}/unseeded-{self._unseeded_resets}"
        return self._shown(self._room)

    def _step(self, action: str) -> StepResult:
        room = self._require_room()
        new_room, outcome = apply_move(room, action)
        self._room = new_room
        reward = self.reward_step
        if outcome is MoveOutcome.MOVED:
            feedback = f"You moved {action}."
        elif outcome is MoveOutcome.BLOCKED_WALL:
            feedback = f"You cannot move {action}: a wall is in the way. Nothing changed."
        elif outcome is MoveOutcome.BLOCKED_BOX:
            feedback = f"You cannot push the box {action}: a wall or another box is behind it. Nothing changed."
        else:  # PUSHED: the box moved from the player's new cell one cell further
            dr, dc = DIRECTIONS[action]
            box_from = new_room.player
            box_to = (box_from[0] + dr, box_from[1] + dc)
            was_on, now_on = box_from in room.targets, box_to in room.targets
            feedback = f"You pushed a box {action}"
            if now_on and not was_on:
                reward += self.reward_box_on_target
                feedback += " onto a target."
            elif was_on and not now_on:
                reward += self.reward_box_off_target
                feedback += " off its target."
            else:
                feedback += "."
        won = new_room.solved
        if won:
            reward += self.reward_solved
            feedback += " Every box is on a target: puzzle solved!"
        return StepResult(observation=f"{feedback}\n{self._shown(new_room)}", reward=reward, terminated=won, won=won)

    def _state_digest(self) -> str:
        return render_room(self._require_room())

    def _state_observation(self) -> str:
        return self._shown(self._require_room())

    def _shown(self, room: Room) -> str:
        """The room as the text observation shows it: the grid, or with ``observation='image'`` a pointer to the
        image."""
        return IMAGE_ONLY_TEXT if self.observation == "image" else render_room(room)

    def _observation_images(self) -> list[np.ndarray]:
        return [render_room_image(self._require_room(), self.tile_size)]

    def _match_action(self, candidate: str) -> str | None:
        """Map ``candidate`` to ``"up"``/``"down"``/``"left"``/``"right"`` or None (syntax: module docstring)."""
        match = _ACTION_RE.fullmatch(candidate.strip())
        return match.group(1).lower() if match else None

    def _admissible_actions(self) -> list[str]:
        return list(ACTIONS)

    def _parse_format(self, text: str) -> tuple[str | None, bool]:
        """The reference's Sokoban format rule (module docstring): ``(word, valid)``, ``("still", False)`` when the
        action block is missing or names no move."""
        start, end = _ACTION_OPEN.search(text), _ACTION_CLOSE.search(text)
        command, valid = "still", False
        if start is not None and end is not None:
            content = text[start.end() : end.start()].lower()
            found = next((word for word in FORMAT_WORDS if word in content), None)
            if found is not None:
                command, valid = found, True
        return command, valid and "<think>" in text and "</think>" in text

    def _unmatched_step(self, command: str) -> StepResult:
        """A command that is not a move (e.g. the format rule's ``still``): nothing changes; the move is charged
        ``reward_step``."""
        return StepResult(
            observation=f"You stay where you are. Nothing changed.\n{self._shown(self._require_room())}",
            reward=self.reward_step,
        )

    def _require_room(self) -> Room:
        if self._room is None:
            raise RuntimeError("sokoban: call reset() first")
        return self._room

    # ------------------------------------------------------------------ public extras
    @property
    def room(self) -> Room:
        """The current state (immutable), e.g. for :func:`environments.sokoban.solver.solve`."""
        return self._require_room()

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Pairs of different action sequences that reach the same state from the room ``reset`` just built.

        Found by enumerating every action sequence of up to 4 moves (pure simulation; the environment is not
        touched) that never solves the room before its end, grouped by the room they reach. Returned, when they
        exist: the default pair (nothing vs an invalid step); two different walks without a push to the same new
        cell (e.g. ``up, left`` vs ``left, up``); two different sequences that push a box to the same result; a
        blocked move vs nothing; a move and its undo vs nothing.
        """
        start = self._require_room()
        max_len = min(_CHECKER_PATH_LEN, self.max_steps)
        groups: dict[Room, list[tuple[tuple[str, ...], bool, bool]]] = {}  # room -> [(path, pushed, blocked)]

        def visit(room: Room, path: tuple[str, ...], pushed: bool, blocked: bool) -> None:
            groups.setdefault(room, []).append((path, pushed, blocked))
            if len(path) == max_len:
                return
            for action in ACTIONS:
                nxt, outcome = apply_move(room, action)
                if nxt.solved and len(path) + 1 < max_len:
                    continue  # the episode would end mid-path; keep only paths that are played to the end
                visit(
                    nxt,
                    path + (action,),
                    pushed or outcome is MoveOutcome.PUSHED,
                    blocked or outcome in (MoveOutcome.BLOCKED_WALL, MoveOutcome.BLOCKED_BOX),
                )

        visit(start, (), False, False)
        pairs: list[tuple[list[str | None], list[str | None]]] = list(super().checker_paths())
        walk_pairs, push_pairs = [], []
        for room, members in groups.items():
            if room == start:
                continue
            clean = [m for m in members if not m[2]]  # no blocked move: every action changed the state
            for kind, out in ((False, walk_pairs), (True, push_pairs)):
                paths = [m[0] for m in clean if m[1] is kind]
                out += [(a, b) for i, a in enumerate(paths) for b in paths[i + 1 :]]
        for found in (walk_pairs, push_pairs):
            if found:  # prefer two equally long paths (the same moves in another order), then the shortest
                a, b = min(found, key=lambda ab: (len(ab[0]) != len(ab[1]), len(ab[0]) + len(ab[1])))
                pairs.append((list(a), list(b)))
        outcomes = {a: apply_move(start, a)[1] for a in ACTIONS}
        blocked = [a for a in ACTIONS if outcomes[a] in (MoveOutcome.BLOCKED_WALL, MoveOutcome.BLOCKED_BOX)]
        free = [a for a in ACTIONS if outcomes[a] is MoveOutcome.MOVED]
        if blocked:
            pairs.append(([blocked[0]], []))
        if free and self.max_steps >= 2:
            pairs.append(([free[0], _OPPOSITE[free[0]]], []))
        return pairs
