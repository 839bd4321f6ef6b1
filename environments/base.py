"""The text-environment contract every environment in this package follows.

Gymnasium-shaped, text in and text out::

    env = make_env("sokoban", key_mode="state", max_steps=20)
    obs, info = env.reset(seed=3, options={"split": "train"})
    command, valid = env.parse_action(llm_text, rule="admissible")   # pure and total: never raises
    obs, reward, terminated, truncated, info = env.step(command)     # None when the reply held no command

* ``terminated``: the task ended (won, or lost for good). ``truncated``: the step limit ``max_steps`` was hit.
* ``step(None)`` is the *invalid-action step*: the state does not change, the observation says the action
  was invalid, and it counts toward ``max_steps``. The environment reward of an invalid step is 0; the
  invalid-action penalty is shaping added by the episode runner, not by the environment.
* ``step(command)`` with a string the environment does not recognise as an action now (``_match_action`` gives
  None: a typo, a command not admissible in this state) is an *unmatched command*: it counts toward ``max_steps``
  and does whatever the environment's :meth:`TextEnv._unmatched_step` says. By default nothing happens (the state
  and the canonical observation stay, the observation starts with :data:`UNMATCHED_ACTION_TEXT`, reward 0); an
  environment whose own engine answers such commands overrides it (ALFWorld's engine says "Nothing happens.", and
  that answer becomes the observation). Either way the ``state`` key does not change.

Invalid-action rules (:data:`INVALID_ACTION_RULES`; ``parse_action(text, rule=...)``, the runner's
``env.invalid_action``): a rule decides which replies are *invalid* (the runner subtracts its penalty) and which
command goes to ``step``.

* ``"admissible"``: a reply is valid when it names an action the environment accepts now; the command is that
  canonical action. An invalid reply gives ``(None, False)``, so the runner takes the invalid-action step.
* ``"format"`` (the rule of the GiGPO reference implementation, verl-agent's ``projection.py`` of each
  environment): a reply is invalid only when its FORMAT is broken; a well-formed command is sent to the
  environment even when it is not admissible, with no penalty. Each environment follows its reference projection
  (:meth:`TextEnv._parse_format`); the default is ALFWorld's and WebShop's: an ``<action>...</action>`` block, a
  ``<think>`` and a ``</think>`` tag, and no Chinese character (U+4E00-U+9FFF), else invalid. The command is then
  the stripped text between the first ``<action>`` and the first ``</action>``; a reply without an action block
  sends the last :attr:`TextEnv.format_fallback_chars` characters of the reply (ALFWorld 30, WebShop 20, as the
  reference does) or nothing (the invalid-action step).
* ``info`` always holds (see :data:`INFO_KEYS`): ``anchor_key`` (str), ``admissible_actions`` (list[str] or None),
  ``won`` (bool), ``task`` (the task description), ``task_id`` (str), ``task_type`` (str or None),
  ``action_valid`` (bool), ``step`` (int, steps taken so far) and ``env_name`` (str).
* One ``np.random.Generator`` per environment (``self.np_random``); no global seeding. ``reset(seed=s)``
  reseeds it from ``(s, index of the split)``, so the same ``(seed, options["split"])`` gives the same task
  and the same initial state — that is what makes an episode group. ``reset(seed=None)`` continues the
  current stream. The seed is kept in ``self.seed`` for environments that index fixed task lists.

* ``reset(options=...)`` accepts ``"split"`` and the environment's :attr:`TextEnv.reset_options`, checked once
  here (an unknown option is a ``ValueError`` that lists the accepted ones); ``num_tasks(split)`` is the size of a
  fixed task list (``reset(seed=0..n-1)``), None when tasks are procedural or unbounded.

Anchor keys (``key_mode`` in the constructor) are pure functions of the environment state after a reset/step
(``anchor_key(mode)`` gives the key of the current state under any mode, e.g. ``anchor_key("state")``):

* ``"observation"``: the environment's canonical observation of the current state (the text an agent
  sees, as in the GiGPO paper), without one-off feedback such as "that action was invalid";
* ``"state"``: a digest of the environment's true state (e.g. the Sokoban grid);
* ``"history:K"``: the state digest plus the last ``K`` actions (a step that applied no action, the invalid step
  or an unmatched command, written ``<invalid>``).

Subclasses implement the ``_reset``/``_step``/``_state_digest``/``_match_action`` hooks and the class
attributes documented on :class:`TextEnv`; the public methods here do the bookkeeping (step counting,
truncation, invalid steps, unmatched commands, keys, error wrapping) once for every environment.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from environments.images import IMAGE_INFO_KEY, MAX_IMAGE_PIXELS, check_images

__all__ = [
    "INFO_KEYS",
    "ACTION_LIST_FORMATS",
    "INVALID_ACTION_RULES",
    "INVALID_ACTION_TEXT",
    "UNMATCHED_ACTION_TEXT",
    "EnvError",
    "ParseStyle",
    "PromptStyle",
    "StepResult",
    "TextEnv",
    "extract_tag",
    "parse_key_mode",
    "strip_tag",
    "tag_blocks",
]

INFO_KEYS = (
    "anchor_key",
    "admissible_actions",
    "won",
    "task",
    "task_id",
    "task_type",
    "action_valid",
    "step",
    "env_name",
)

INVALID_ACTION_TEXT = "Your previous output did not contain a valid action, so nothing happened."

#: Start of the observation after an unmatched command (see the module docstring) in the default no-op.
UNMATCHED_ACTION_TEXT = "Nothing happens: that command is not an available action here."

#: The invalid-action rules of :meth:`TextEnv.parse_action` (see the module docstring).
INVALID_ACTION_RULES = ("admissible", "format")

#: The reference's "Chinese characters" test of its format rule (CJK Unified Ideographs, U+4E00-U+9FFF).
_CJK = re.compile("[\u4e00-\u9fff]")

_ACTION_OPEN = re.compile("<action>", re.IGNORECASE)
_ACTION_CLOSE = re.compile("</action>", re.IGNORECASE)

#: History entry of a step that did not apply an action of the environment (invalid step or unmatched command).
_NO_ACTION = "<invalid>"

#: Longest text ``parse_action`` looks at; anything beyond is ignored (LLM outputs are far shorter).
MAX_PARSE_CHARS = 65_536

#: Largest ``max_steps`` of any environment (an episode keeps its actions; LLM agent episodes are far shorter).
MAX_EPISODE_STEPS = 10_000

#: How a prompt writes the admissible actions (:attr:`PromptStyle.admissible_actions`): ``"comma"``: ``a, b, c``;
#: ``"lines"``: the list starts on a new line and holds one action per line, in single quotes; ``"quoted_indent"``:
#: one quoted action per line, every line after the first indented by a space (``'a'\n 'b'``, the reference's
#: ALFWorld); ``"quoted_comma"``: one quoted action per line, each followed by a comma (``'a',\n'b',``, the
#: reference's WebShop).
ACTION_LIST_FORMATS = ("comma", "lines", "quoted_indent", "quoted_comma")


@dataclass(frozen=True)
class ParseStyle:
    """How a reply becomes a command, beyond the invalid-action rule (the episode runner reads it from
    ``env.parse.*`` and sets :attr:`TextEnv.parse_style`). The defaults are this project's; the reference
    implementation lower-cases in ALFWorld, WebShop and Sokoban and matches commands as written (docs/fidelity.md).

    lowercase: the command is read from the lower-cased reply (as the reference's ``projection.py`` of ALFWorld,
        WebShop and Sokoban do); whether the reply is valid is judged on the reply as written (the reference checks
        its ``<think>`` tags there). It changes the command sent and shown in the history.
    collapse_whitespace: a command matches an action when both are equal after runs of whitespace collapse to one
        space (this project's ALFWorld and WebShop matchers). False: only as written, ends stripped, as the
        reference's engines take it (ALFWorld's looks the command up as written; WebShop clicks a button only by
        its exact text); an oddly spaced command is then an unmatched command.

    Raises:
        ValueError: a field that is not a bool, naming it (``ParseStyle.<field>``).
    """

    lowercase: bool = False
    collapse_whitespace: bool = True

    def __post_init__(self) -> None:
        for name in ("lowercase", "collapse_whitespace"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ParseStyle.{name}={getattr(self, name)!r} must be true or false")

    def match_form(self, command: str) -> str:
        """``command`` as the matchers compare it: stripped, lower-cased, and with whitespace runs collapsed when
        :attr:`collapse_whitespace`."""
        return " ".join(command.split()).lower() if self.collapse_whitespace else command.strip().lower()


@dataclass(frozen=True)
class PromptStyle:
    """The structural choices of a prompt that :meth:`TextEnv.render_prompt` makes (the wording is each
    environment's own). The defaults are this project's; the GiGPO reference implementation (verl-agent) makes the
    other choice of each (docs/fidelity.md; the episode runner reads them from ``env.prompt.*``).

    show_step_limit: the prompt states the step limit ``max_steps``. False: each of the environment's
        :attr:`TextEnv.step_limit_phrases` is written in its form without the limit (the reference never states it).
    first_step_number: the number of an episode's first step in the history items and in the label of the current
        step (``{step_number}``): 0 or 1 (the reference numbers from 1). Counts of steps taken do not change.
    admissible_actions: how the admissible actions are written, one of :data:`ACTION_LIST_FORMATS`
        (``"quoted_indent"`` and ``"quoted_comma"`` are the reference's ALFWorld and WebShop layouts).

    Raises:
        ValueError: a field of the wrong type or out of range, naming it (``PromptStyle.<field>``).
    """

    show_step_limit: bool = True
    first_step_number: int = 0
    admissible_actions: str = "comma"

    def __post_init__(self) -> None:
        if not isinstance(self.show_step_limit, bool):
            raise ValueError(
                f"PromptStyle.show_step_limit={self.show_step_limit!r} must be true or false (whether the prompt "
                "states the step limit)"
            )
        if isinstance(self.first_step_number, bool) or self.first_step_number not in (0, 1):
            raise ValueError(
                f"PromptStyle.first_step_number={self.first_step_number!r} must be 0 or 1 (the number of an "
                "episode's first step in the prompt's history; the reference numbers from 1)"
            )
        if self.admissible_actions not in ACTION_LIST_FORMATS:
            raise ValueError(
                f"PromptStyle.admissible_actions={self.admissible_actions!r} must be one of "
                f"{list(ACTION_LIST_FORMATS)} (comma: 'a, b, c' on one line; lines: one quoted action per line; "
                "quoted_indent: the same, lines after the first indented; quoted_comma: each quoted and followed by a "
                "comma)"
            )

    def action_list(self, actions: Sequence[str] | None) -> str:
        """The admissible ``actions`` as the prompt writes them (``"any"`` when there are none or they are
        unbounded), in one of :data:`ACTION_LIST_FORMATS`."""
        if not actions:
            return "any"
        if self.admissible_actions == "lines":
            return "".join(f"\n'{action}'" for action in actions)
        if self.admissible_actions == "quoted_indent":
            return "\n ".join(f"'{action}'" for action in actions)
        if self.admissible_actions == "quoted_comma":
            return "\n".join(f"'{action}'," for action in actions)
        return ", ".join(actions)


class _HiddenStepLimit:
    """What ``{max_steps}`` stands for when the step limit is hidden: formatting it is an error that says where the
    template shows the limit (a template field outside :attr:`TextEnv.step_limit_phrases`)."""

    def __init__(self, env_name: str) -> None:
        self.env_name = env_name

    def __format__(self, spec: str) -> str:
        raise ValueError(
            f"{self.env_name}: the prompt must not state the step limit (PromptStyle.show_step_limit=False), but its "
            "prompt_template (or the limit-free form of a step_limit_phrases entry) writes {max_steps}; write the "
            "limit only in step_limit_phrases, whose second form leaves it out"
        )


class EnvError(RuntimeError):
    """An environment failed inside ``reset`` or ``step``.

    Carries enough to find the failing episode again: the environment name, the task id and the step.
    The original exception is chained (``raise ... from``) and kept in ``cause``.
    """

    def __init__(self, env_name: str, task_id: str | None, step: int, message: str, cause: BaseException | None = None):
        self.env_name = env_name
        self.task_id = task_id
        self.step = step
        self.cause = cause
        super().__init__(f"[env={env_name} task={task_id} step={step}] {message}")


@dataclass
class StepResult:
    """What a subclass's ``_step`` returns.

    observation: the text the agent sees next (canonical state observation, feedback included).
    reward: environment reward of this transition.
    terminated: whether the task ended (won or lost for good).
    won: whether the task is solved.
    extra: additional info entries (must not clash with :data:`INFO_KEYS`).
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    won: bool = False
    extra: dict[str, Any] | None = None


def parse_key_mode(key_mode: str) -> tuple[str, int]:
    """Split a key mode into ``(kind, k)``: ``"observation"`` -> ``("observation", 0)``,
    ``"state"`` -> ``("state", 0)``, ``"history:3"`` -> ``("history", 3)``.

    Raises:
        ValueError: for anything else, listing the valid spellings.
    """
    if not isinstance(key_mode, str):
        raise ValueError(f"key_mode must be a string, got {type(key_mode).__name__}: {key_mode!r}")
    if key_mode in ("observation", "state"):
        return key_mode, 0
    match = re.fullmatch(r"history:(\d+)", key_mode)
    if match:
        return "history", int(match.group(1))
    raise ValueError(
        f"unknown key_mode {key_mode!r}: use 'observation' (raw observation text, as in the paper), "
        "'state' (the environment's true state) or 'history:K' (state plus the last K actions, e.g. 'history:2')"
    )


def tag_blocks(text: str, tag: str) -> list[tuple[int, int, int, int]]:
    """Spans ``(open_start, open_end, close_start, close_end)`` of the non-nested ``<tag>...</tag>`` blocks of
    ``text`` (case-insensitive), in order, in one linear scan.

    A block runs from an opening tag to the nearest closing tag after it; opening tags inside a block are part of
    its content, a closing tag with no block open is plain text, and an opening tag that is never closed starts no
    block. This is exactly what ``re.findall(r"<tag>(.*?)</tag>", text, re.I | re.S)`` matches, but linear in
    ``len(text)`` (the lazy regex rescans the rest of the text from every unclosed opening tag: quadratic).
    """
    spans = []
    open_at: tuple[int, int] | None = None
    for m in re.finditer(rf"<(/?){re.escape(tag)}>", text, re.IGNORECASE):
        if not m.group(1):
            if open_at is None:
                open_at = (m.start(), m.end())
        elif open_at is not None:
            spans.append((open_at[0], open_at[1], m.start(), m.end()))
            open_at = None
    return spans


def extract_tag(text: str, tag: str) -> list[str]:
    """All non-nested ``<tag>...</tag>`` contents of ``text``, in order (case-insensitive tags; see
    :func:`tag_blocks`, linear time)."""
    return [text[open_end:close_start] for _, open_end, close_start, _ in tag_blocks(text, tag)]


def strip_tag(text: str, tag: str) -> str:
    """``text`` without its ``<tag>...</tag>`` blocks (tags included; see :func:`tag_blocks`, linear time)."""
    pieces, pos = [], 0
    for open_start, _, _, close_end in tag_blocks(text, tag):
        pieces.append(text[pos:open_start])
        pos = close_end
    pieces.append(text[pos:])
    return "".join(pieces)


class TextEnv(abc.ABC):
    """Base class of every text environment.

    Class attributes a subclass sets:
        name: registry name (e.g. ``"sokoban"``).
        splits: the task splits ``reset(options={"split": ...})`` accepts; the first is the default.
        reset_options: the ``reset`` options ``_reset`` reads besides ``"split"`` (e.g. Sokoban's ``"room"``);
            :meth:`reset` refuses any other before calling ``_reset``.
        prompt_template: a ``str.format`` template with the fields ``{task}``, ``{history}``,
            ``{observation}``, ``{admissible_actions}``, ``{step}`` (steps taken so far), ``{step_number}`` (the
            current step's number), ``{max_steps}``, one field per entry of ``step_limit_phrases`` and those of
            ``_prompt_fields()`` (kept in a ``prompt.py`` beside the environment; see :meth:`render_prompt`).
        history_item_template: renders one past step; fields ``{step}`` (its number), ``{observation}``,
            ``{action}``.
        step_limit_phrases: the phrases of the prompt that state the step limit: field name -> (the phrase with
            ``{max_steps}``, the phrase without it), both ``str.format`` templates over the prompt's fields. The
            prompt writes the second form when :attr:`PromptStyle.show_step_limit` is False; a template that writes
            ``{max_steps}`` outside them cannot hide the limit (an error says so).
        format_fallback_chars: under the ``format`` rule, a reply without an ``<action>`` block sends its last
            this many characters to the environment (the reference's ALFWorld: 30, WebShop: 20); None (default)
            sends nothing (the invalid-action step).
        thread_parallel: False when instances share process-wide state, so that their calls in threads of one
            process take turns (ALFWorld's engine lock). The episode runner then hosts the environment in worker
            processes (``verl_gigpo.rollout.execution.procpool``) and parses replies and renders prompts in its own
            process on a *view*: an instance built with ``TextEnv.__init__`` only (not the subclass constructor) whose
            ``_admissible_actions()`` returns the last ``info["admissible_actions"]``. Such an environment's
            ``parse_action`` and ``render_prompt`` may therefore read only those, its class attributes and the
            attributes ``TextEnv.__init__`` sets (``max_steps``, ``key_mode``, ``task_description``,
            ``parse_style``).

    Hooks a subclass implements:
        ``_reset(split, options) -> str``: build the task from ``self.np_random`` (already seeded) and return
            the first observation; set ``self.task_description``, ``self.task_id``, ``self.task_type``.
            ``options`` holds only keys of ``reset_options`` (``"split"`` removed, unknown keys already refused).
        ``_step(action: str) -> StepResult``: apply a canonical action (what ``_match_action`` returned; never
            None).
        ``_state_digest() -> str``: the true state as a string (same state <=> same string).
        ``_observation_images() -> list``: the ``images_per_step`` images of the current observation (PIL images or
            uint8 arrays), for an environment that sets ``self.images_per_step`` > 0 (environments/images.py).
        ``_state_observation() -> str``: canonical observation of the current state, used by the
            ``observation`` key mode and after an invalid step (default: the last observation).
        ``_match_action(candidate: str) -> str | None``: map a candidate action string (tag content, the whole
            reply when it has no tags, or a command given to ``step``) to the canonical action, or None when it
            is not an action now. Pure, total, and idempotent on canonical actions.
        ``_admissible_actions() -> list[str] | None``: the actions valid now, or None when unbounded.
        ``_unmatched_step(command: str) -> StepResult | None``: what a command that is not an action now does
            (default None: nothing; see the module docstring). A ``StepResult`` is the environment's own answer
            and becomes the last observation; it must leave the ``state`` digest unchanged.
        ``_parse_format(text: str) -> (command, valid)``: the ``format`` rule (default: the reference's ALFWorld
            and WebShop projection, see the module docstring).
        ``_prompt_fields() -> dict[str, str]``: extra fields of ``prompt_template`` that depend on the instance
            (default none; WebShop's ``{strategy}``).

    Public methods a subclass overrides where it can:
        ``num_tasks(split) -> int | None``: the size of a fixed task list (default None: procedural or unbounded).
        ``task_type_of(seed, split) -> str | None``: the task type ``reset(seed=seed)`` would play, without
            building the task (default None: unknown until reset).
        ``example_reply(action) -> str``: a well-formed reply that takes ``action`` (default: a ``<think>`` block
            then ``<action>action</action>``).
    """

    name: ClassVar[str] = "base"
    splits: ClassVar[tuple[str, ...]] = ("train",)
    reset_options: ClassVar[tuple[str, ...]] = ()
    thread_parallel: ClassVar[bool] = True
    prompt_template: ClassVar[str] = (
        "Task: {task}\n{history}Current observation ({progress}):\n{observation}\n"
        "Admissible actions: {admissible_actions}\n"
        "Think inside <think>...</think>, then give exactly one action inside <action>...</action>."
    )
    history_item_template: ClassVar[str] = "Step {step}: observation: {observation}\nAction: {action}\n"
    step_limit_phrases: ClassVar[Mapping[str, tuple[str, str]]] = {
        "progress": ("step {step_number} of {max_steps}", "step {step_number}")
    }
    format_fallback_chars: ClassVar[int | None] = None

    def __init__(self, *, key_mode: str = "state", max_steps: int = 50) -> None:
        self.key_kind, self.key_history = parse_key_mode(key_mode)
        self.key_mode = key_mode
        self.parse_style = ParseStyle()  # env.parse.*: set by the episode runner's factory (make_task_env)
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or not 1 <= max_steps <= MAX_EPISODE_STEPS:
            raise ValueError(f"max_steps must be an int in [1, {MAX_EPISODE_STEPS}], got {max_steps!r}")
        self.max_steps = max_steps
        self.np_random: np.random.Generator = np.random.default_rng()
        self.task_description: str = ""
        self.task_id: str | None = None
        self.task_type: str | None = None
        self.split: str = self.splits[0]
        self.seed: int | None = None
        self._step_count = 0
        self._actions: list[str] = []
        self._last_obs = ""
        self._won = False
        self._started = False
        self._done = False
        #: images returned with every observation under ``info["images"]`` (0: text only; environments/images.py)
        self.images_per_step = 0
        self.max_image_pixels = MAX_IMAGE_PIXELS

    # ------------------------------------------------------------------ public API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. ``seed`` (int) reseeds ``self.np_random``; ``options["split"]`` picks the task split.

        Returns ``(observation, info)``.

        Raises:
            ValueError: ``options`` is not a dict, names an unknown split or an option outside ``"split"`` and
                :attr:`reset_options`, or ``seed`` is not a non-negative int (all checked before any state changes).
            EnvError: the environment failed while building the task.
        """
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(
                f"{self.name}: reset options must be a dict or None, got {type(options).__name__} {options!r:.80}; "
                f"e.g. options={{'split': {self.splits[0]!r}}}"
            )
        options = dict(options or {})
        split = options.pop("split", self.splits[0])
        self._check_split(split)
        unknown = [key for key in options if key not in self.reset_options]
        if unknown:
            accepted = (
                f"accepted: {', '.join(repr(k) for k in ('split', *self.reset_options))}"
                if self.reset_options
                else "only 'split' is accepted"
            )
            raise ValueError(f"{self.name}: unknown reset options {sorted(map(str, unknown))}; {accepted}")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
                raise ValueError(f"{self.name}: seed must be a non-negative int, got {seed!r}")
            # one stream per (seed, split): train seed 3 and test seed 3 are different tasks
            self.np_random = np.random.default_rng([int(seed), self.splits.index(split)])
        self.seed = None if seed is None else int(seed)
        self.split = split
        self._step_count = 0
        self._actions = []
        self._won = False
        self._done = False
        try:
            obs = self._reset(split, options)
        except (EnvError, ValueError):
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised as EnvError with context, never swallowed
            raise EnvError(self.name, self.task_id, 0, f"reset failed: {exc!r}", exc) from exc
        self._started = True
        self._last_obs = obs
        return obs, self._info(action_valid=True)

    def step(self, action: str | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one command: ``None`` is the invalid-action step; a string is matched with ``_match_action`` and
        applied (``_step``) when it is an action now, else it is an unmatched command (``_unmatched_step``).

        Returns ``(obs, reward, terminated, truncated, info)``; ``info["action_valid"]`` says whether an action
        of the environment was applied (False for ``None`` and for an unmatched command).
        """
        if not self._started:
            raise RuntimeError(f"{self.name}: call reset() before step()")
        if self._done:
            raise RuntimeError(f"{self.name}: the episode has ended (terminated or truncated); call reset()")
        if action is not None and not isinstance(action, str):
            raise TypeError(f"{self.name}: action must be a str or None, got {type(action).__name__}")
        self._step_count += 1
        canonical, transition = None, False
        if action is None:
            result = StepResult(observation=f"{INVALID_ACTION_TEXT}\n{self._state_observation()}")
        else:
            try:
                canonical = self._match_action(action)
                if canonical is not None:
                    result, transition = self._step(canonical), True
                else:
                    answer = self._unmatched_step(action)
                    transition = answer is not None
                    if answer is None:
                        answer = StepResult(observation=f"{UNMATCHED_ACTION_TEXT}\n{self._state_observation()}")
                    result = answer
            except EnvError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised as EnvError with context, never swallowed
                message = f"step({action!r:.200}) failed: {exc!r}"
                raise EnvError(self.name, self.task_id, self._step_count, message, exc) from exc
        valid = canonical is not None
        self._actions.append(canonical if valid else _NO_ACTION)
        self._won = bool(result.won)
        terminated = bool(result.terminated)
        truncated = not terminated and self._step_count >= self.max_steps
        self._done = terminated or truncated
        if transition:
            self._last_obs = result.observation  # an invalid step leaves the state, and its observation, as it was
        info = self._info(action_valid=valid)
        if result.extra:
            clash = set(result.extra) & {*INFO_KEYS, IMAGE_INFO_KEY}
            if clash:
                raise EnvError(self.name, self.task_id, self._step_count, f"_step extra overrides info keys {clash}")
            info.update(result.extra)
        return result.observation, float(result.reward), terminated, truncated, info

    def parse_action(self, llm_text: str, rule: str = "admissible") -> tuple[str | None, bool]:
        """The command a reply sends to :meth:`step`, and whether the reply is valid under ``rule`` (see the module
        docstring). Pure and total in ``llm_text``: never raises, whatever it is (bytes are decoded as UTF-8 with
        replacement; other non-strings are invalid). Linear in the length of the reply (only the first
        :data:`MAX_PARSE_CHARS` characters are read).

        ``"admissible"``: format ``<think>...</think><action>ACTION</action>``. Exactly one ``<action>`` block is
        required when tags are present (several blocks are ambiguous -> invalid). Without tags, the whole reply
        (stripped) is tried as the environment's own action syntax. Returns ``(canonical_action, True)`` or
        ``(None, False)``.

        ``"format"``: :meth:`_parse_format`; returns ``(command or None, valid)``: the command goes to ``step``
        whether or not the reply is valid (the reference executes it and penalises the format).

        :attr:`parse_style` (:class:`ParseStyle`) ``lowercase`` reads the command from the lower-cased reply (the
        validity of a ``format`` reply is still judged on the reply as written).

        Raises:
            ValueError: ``rule`` is not one of :data:`INVALID_ACTION_RULES`.
        """
        if rule not in INVALID_ACTION_RULES:
            raise ValueError(f"unknown invalid-action rule {rule!r}; use one of {list(INVALID_ACTION_RULES)}")
        if isinstance(llm_text, bytes | bytearray):
            llm_text = bytes(llm_text).decode("utf-8", errors="replace")
        if not isinstance(llm_text, str):
            return None, False
        text = llm_text[:MAX_PARSE_CHARS]
        if rule == "format":
            if not self.parse_style.lowercase:
                return self._parse_format(text)
            return self._parse_format(text.lower())[0], self._parse_format(text)[1]
        if self.parse_style.lowercase:
            text = text.lower()
        tagged = extract_tag(text, "action")
        if len(tagged) > 1:
            return None, False
        if len(tagged) == 1:
            candidate = tagged[0]
        elif re.search(r"</?action>", text, re.IGNORECASE):
            return None, False  # an unclosed or stray tag: malformed
        else:
            candidate = strip_tag(text, "think")
        candidate = candidate.strip()
        if not candidate:
            return None, False
        action = self._match_action(candidate)
        return (action, True) if action is not None else (None, False)

    def example_reply(self, action: str) -> str:
        """A well-formed reply that takes ``action`` under both invalid-action rules: a short ``<think>`` block,
        then ``<action>action</action>``. Environments with another reply format override it."""
        return f"<think>I choose {action}.</think><action>{action}</action>"

    def anchor_key(self, key_mode: str | None = None) -> str:
        """The anchor key of the current state under ``key_mode`` (default: the mode the environment was built
        with, the key ``info["anchor_key"]`` holds).

        ``"state"`` is the digest of the true state (same state <=> same key), ``"observation"`` the canonical
        observation, ``"history:K"`` the state digest plus the last ``K`` actions. Asking for another mode than the
        configured one changes nothing (used by the checker to compare states).

        Raises:
            ValueError: ``key_mode`` is not a valid key mode (see :func:`parse_key_mode`).
        """
        kind, history = (self.key_kind, self.key_history) if key_mode is None else parse_key_mode(key_mode)
        if kind == "observation":
            return self._state_observation()
        digest = self._state_digest()
        if kind == "state":
            return digest
        recent = self._actions[-history:] if history else []
        return digest + "\n#last-actions:" + "|".join(recent)

    def num_tasks(self, split: str) -> int | None:
        """Size of the fixed task list of ``split``: ``reset(seed=i)`` for ``i`` in ``0..n-1`` plays each of its
        ``n`` tasks once (data prep sizes validation sets with it; the checker checks at most ``n`` seeds).

        Default None: tasks are procedural or unbounded (every seed is a task). Environments with task lists
        override it (ALFWorld's evaluation games, WebShop's goals).

        Raises:
            ValueError: unknown ``split``.
        """
        self._check_split(split)
        return None

    def task_type_of(self, seed: int, split: str) -> str | None:
        """The task type ``reset(seed=seed, options={"split": split})`` plays, found without building the task
        (data prep reports the task-type mix of the seeds it writes).

        Default None: unknown until the task is built. Environments whose tasks come from fixed lists override it
        (ALFWorld's games, WebShop's goals, search questions).

        Raises:
            ValueError: unknown ``split``, or a seed the split cannot play.
        """
        self._check_split(split)
        return None

    def prompt_fields(
        self,
        observation: str,
        info: dict[str, Any],
        history: Sequence[tuple[str, str]] = (),
        style: PromptStyle | None = None,
    ) -> dict[str, Any]:
        """The values a prompt of this state shows, for :meth:`render_prompt` and for prompt templates
        (``verl_gigpo.rollout.prompts``): ``task`` (str), ``observation`` (str), ``actions`` (the admissible
        actions, list[str] or None), ``step`` (steps taken, ``info["step"]``), ``step_number`` (``step`` +
        ``style.first_step_number``), ``max_steps`` (int) and ``history``: one ``(number, observation, action)``
        per given past pair, oldest first, numbered so that the episode's first step is ``style.first_step_number``.
        """
        style = style or PromptStyle()
        taken = info.get("step", 0)
        first = taken - len(history) + style.first_step_number
        return {
            "task": info.get("task", self.task_description),
            "observation": observation,
            "actions": info.get("admissible_actions"),
            "step": taken,
            "step_number": taken + style.first_step_number,
            "max_steps": self.max_steps,
            "history": [(first + i, obs, act) for i, (obs, act) in enumerate(history)],
        }

    def render_prompt(
        self,
        observation: str,
        info: dict[str, Any],
        history: Sequence[tuple[str, str]] = (),
        style: PromptStyle | None = None,
    ) -> str:
        """Fill ``prompt_template`` with :meth:`prompt_fields` of the given past ``(observation, action)`` pairs
        (oldest first, already cut to the wanted length by the caller), in ``style`` (default
        :class:`PromptStyle`'s defaults).

        Fields: ``{task}``; ``{history}`` ("Recent history:" and one ``history_item_template`` per pair; empty
        without history); ``{observation}``; ``{admissible_actions}`` (:meth:`PromptStyle.action_list`); ``{step}``;
        ``{step_number}``; ``{max_steps}``; each of ``step_limit_phrases`` (with or without the limit,
        ``style.show_step_limit``); and ``_prompt_fields()``.

        Raises:
            ValueError: the step limit is hidden but the template writes ``{max_steps}`` outside
                ``step_limit_phrases``.
        """
        style = style or PromptStyle()
        values = self.prompt_fields(observation, info, history, style)
        lines = [
            self.history_item_template.format(step=number, observation=obs, action=act)
            for number, obs, act in values["history"]
        ]
        fields: dict[str, Any] = {
            "task": values["task"],
            "history": ("Recent history:\n" + "".join(lines)) if lines else "",
            "observation": values["observation"],
            "admissible_actions": style.action_list(values["actions"]),
            "step": values["step"],
            "step_number": values["step_number"],
            "max_steps": values["max_steps"] if style.show_step_limit else _HiddenStepLimit(self.name),
        }
        phrases = {
            name: (shown if style.show_step_limit else hidden).format(**fields)
            for name, (shown, hidden) in self.step_limit_phrases.items()
        }
        return self.prompt_template.format(**fields, **phrases, **self._prompt_fields())

    def close(self) -> None:
        """Release external resources (engines, files). Safe to call twice."""
        return None

    # ------------------------------------------------------------------ hooks
    @abc.abstractmethod
    def _reset(self, split: str, options: dict[str, Any]) -> str: ...

    @abc.abstractmethod
    def _step(self, action: str) -> StepResult: ...

    @abc.abstractmethod
    def _state_digest(self) -> str: ...

    @abc.abstractmethod
    def _match_action(self, candidate: str) -> str | None: ...

    def _observation_images(self) -> list[Any]:
        """The images of the current observation (``images_per_step`` PIL images or uint8 arrays); none by
        default."""
        return []

    def _state_observation(self) -> str:
        return self._last_obs  # the last observation of a real transition (invalid steps do not change it)

    def _admissible_actions(self) -> list[str] | None:
        return None

    def _unmatched_step(self, command: str) -> StepResult | None:
        """A command that is not an action now (see the module docstring). Default None: nothing happens (the
        base class then answers :data:`UNMATCHED_ACTION_TEXT` and the canonical observation, reward 0)."""
        return None

    def _parse_format(self, text: str) -> tuple[str | None, bool]:
        """The ``format`` rule of the reference's ALFWorld and WebShop projections (``alfworld_projection``,
        ``webshop_projection``): valid iff the reply has an ``<action>`` and an ``</action>`` tag (any case), a
        ``<think>`` and a ``</think>`` tag (exact case), and no Chinese character. The command is the stripped text
        between the first ``<action>`` and the first ``</action>`` (empty when that closing tag comes first); a
        reply without both action tags sends its last :attr:`format_fallback_chars` characters, or None. Linear
        in ``len(text)``."""
        start, end = _ACTION_OPEN.search(text), _ACTION_CLOSE.search(text)
        if start is None or end is None:
            tail = self.format_fallback_chars
            return (text[-tail:] if tail else None), False
        command = text[start.end() : end.start()].strip()
        valid = "<think>" in text and "</think>" in text and _CJK.search(text) is None
        return command, valid

    def _prompt_fields(self) -> dict[str, str]:
        """Extra fields of ``prompt_template`` that depend on the instance (default none)."""
        return {}

    def example_actions(self) -> list[str]:
        """Actions worth trying now (used by the checker's random walks and by tests).

        Default: the admissible actions. Environments whose action space is unbounded (``admissible_actions``
        is None) return a few representative actions.
        """
        return list(self._admissible_actions() or [])

    @classmethod
    def setup_problems(cls, kwargs: Mapping[str, Any]) -> list[tuple[str | None, str]]:
        """What would stop ``cls(**kwargs)`` that can be seen without building the environment (no engine started,
        no data loaded): a missing data folder or file, say. Trainers call it before starting a run, so the user
        hears of it before minutes of start-up (``verl_gigpo.verl_glue.preflight``).

        Returns:
            ``(argument, message)`` pairs: ``argument`` is the constructor argument at fault, or None when the
            problem comes from elsewhere (an environment variable the default reads); ``message`` says what is
            wrong and what to do. ``[]`` (the default) when nothing is known to be wrong.
        """
        return []

    def checker_paths(self) -> list[tuple[list[str | None], list[str | None]]]:
        """Pairs of action sequences that, from the task ``reset`` just built, reach the same state.

        Used by :func:`environments.checker.check_env` for key stability. The default pair (nothing vs one
        invalid step) holds for every environment; subclasses add pairs of real, different paths.
        """
        return [([], [None])]

    # ------------------------------------------------------------------ internals
    def _check_split(self, split: Any) -> None:
        """Raise ``ValueError`` naming the known splits unless ``split`` is one of them."""
        if split not in self.splits:
            raise ValueError(f"{self.name}: unknown split {split!r}; known splits: {list(self.splits)}")

    def _info(self, *, action_valid: bool) -> dict[str, Any]:
        admissible = self._admissible_actions()
        info = {
            "anchor_key": self.anchor_key(),
            "admissible_actions": list(admissible) if admissible is not None else None,
            "won": self._won,
            "task": self.task_description,
            "task_id": self.task_id,
            "task_type": self.task_type,
            "action_valid": action_valid,
            "step": self._step_count,
            "env_name": self.name,
        }
        if self.images_per_step:
            images = self._observation_images()
            info[IMAGE_INFO_KEY] = check_images(
                images, count=self.images_per_step, max_pixels=self.max_image_pixels, name=self.name
            )
        return info
