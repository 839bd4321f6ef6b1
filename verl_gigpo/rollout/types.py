"""Plain data types shared by the episode runner, the verl agent loop and the local engine."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from environments.base import INVALID_ACTION_RULES, ParseStyle, PromptStyle
from verl_gigpo.config.rules import RANGES, check_settings, choice, whole
from verl_gigpo.rollout.prompts import HISTORY_ITEMS, load_template, moot_key_warnings

__all__ = [
    "INVALID_IN_HISTORY",
    "OBSERVATION_CHARS_PER_PROMPT_TOKEN",
    "OVERLONG_RULES",
    "PARSE_KEYS",
    "PROMPT_KEYS",
    "Episode",
    "EpisodeConfig",
    "GenerationOutput",
    "Generator",
    "PromptOptions",
    "StepRecord",
    "TaskSpec",
    "check_invalid_action",
    "parse_style_from_config",
]

#: An observation longer than this many characters per prompt token (``max_prompt_length``) is cut to its last
#: ``OBSERVATION_CHARS_PER_PROMPT_TOKEN * max_prompt_length`` characters before the prompt is rendered and tokenised.
#: English BPE text averages about 4 characters a token (ALFWorld's and WebShop's text with Qwen's tokenizer), so
#: the kept tail still holds about twice the prompt budget: a cut observation's prompt is cut from the left anyway
#: and keeps the same end, while a huge observation costs bounded tokenising time.
OBSERVATION_CHARS_PER_PROMPT_TOKEN = 8

#: EpisodeConfig field -> the config key whose rule (:data:`verl_gigpo.config.rules.RANGES`) it obeys
#: ``EpisodeConfig.<field>`` in a rule's message (the field, mapped back to the config key by ``from_env``)
_EPISODE_FIELD = re.compile(r"EpisodeConfig\.(\w+)")

_EPISODE_RULES = {
    "max_steps": "env.max_steps",
    "history_length": "env.history_length",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "actor_rollout_ref.rollout.response_length",
    "invalid_action_penalty": "env.invalid_action_penalty",
}

_RULE_MEANINGS = {
    "admissible": "a reply is invalid, penalised and not executed unless it names an action admissible now",
    "format": "the reference's rule: only a broken reply format is invalid and penalised; a well-formed command "
    "goes to the environment even when it is not admissible",
}


def check_invalid_action(value: Any) -> str:
    """Return ``value`` when it is an invalid-action rule (``env.invalid_action``: ``"format"`` or
    ``"admissible"``, see :mod:`environments.base`).

    Raises:
        ValueError: naming ``env.invalid_action``, the value and what each rule means.
    """
    if value not in INVALID_ACTION_RULES:
        rules = "; ".join(f"{rule!r}: {_RULE_MEANINGS[rule]}" for rule in INVALID_ACTION_RULES)
        raise ValueError(f"env.invalid_action must be one of {list(INVALID_ACTION_RULES)} ({rules}), got {value!r}")
    return value


#: Shown in the history in place of an action when the reply sent no command (``env.prompt.invalid_reply_tail``
#: null).
INVALID_IN_HISTORY = "(invalid output)"

#: What happens to a prompt longer than ``data.max_prompt_length`` (``env.prompt.overlong``).
OVERLONG_RULES = {
    "drop_history": "the oldest history items are dropped, then the history-free prompt's ids are cut from the left",
    "cut_left": "the prompt's ids are cut from the left, history kept (the reference's data.truncation=left: search)",
    "fail_episode": "the episode ends there as failed: its rows are left out of training, like an environment "
    "failure (the reference's data.truncation=error stops the whole run instead: ALFWorld, WebShop, Sokoban)",
}

#: The keys of the ``env.prompt`` section (:class:`PromptOptions`).
PROMPT_KEYS = (
    "show_step_limit",
    "first_step_number",
    "admissible_actions",
    "invalid_reply_tail",
    "overlong",
    "history_free_above_chars",
    "template",
    "history_item",
    "image_history",
)


#: The keys of the ``env.parse`` section (:class:`environments.base.ParseStyle`).
PARSE_KEYS = ("lowercase", "collapse_whitespace")


def parse_style_from_config(parse: Mapping[str, Any] | None) -> ParseStyle:
    """The :class:`~environments.base.ParseStyle` of a config's ``env.parse`` section (None or absent keys: the
    defaults, this project's rules: no lower-casing, whitespace collapsed).

    Raises:
        ValueError: the section is not a mapping, has a key outside :data:`PARSE_KEYS`, or a value that is not a
            bool; the message names the key (``env.parse.<key>``).
    """
    if parse is None:
        return ParseStyle()
    if not isinstance(parse, Mapping):
        raise ValueError(f"env.parse must be a mapping of reply-parsing options ({PARSE_KEYS}), got {parse!r}")
    unknown = sorted(str(key) for key in parse if key not in PARSE_KEYS)
    if unknown:
        raise ValueError(f"unknown env.parse key(s) {unknown}; known keys: {list(PARSE_KEYS)}")
    try:
        return ParseStyle(**{key: parse[key] for key in PARSE_KEYS if key in parse})
    except ValueError as exc:
        raise ValueError(
            str(exc).replace("ParseStyle.", "env.parse.") + " (the reference's ALFWorld, WebShop and Sokoban: "
            "lowercase=true, collapse_whitespace=false; docs/environments.md)"
        ) from None


@dataclass(frozen=True)
class PromptOptions:
    """How the episode runner builds each step's prompt: the ``env.prompt.*`` keys, read the same way by both engines.
    The defaults are this project's choices; the paper recipes set the reference implementation's
    (docs/fidelity.md). The wording of a prompt is its environment's (``environments/<env>/prompt.py``).

    style: the structure :meth:`environments.base.TextEnv.render_prompt` writes: ``env.prompt.show_step_limit``
        (state ``max_steps``; default true), ``env.prompt.first_step_number`` (0 or 1: the number of an episode's
        first step in the history; default 0) and ``env.prompt.admissible_actions`` (``comma`` or ``lines``: one
        quoted action per line; default ``comma``). See :class:`environments.base.PromptStyle`.
    invalid_reply_tail: what the history shows as the action of a step whose reply sent no command (every invalid
        reply under ``env.invalid_action=admissible``; under ``format``, a reply the environment's rule sends
        nothing for): None = :data:`INVALID_IN_HISTORY`; N = the reply's last N characters (0: nothing).
    overlong: what happens to a prompt longer than ``data.max_prompt_length``, one of :data:`OVERLONG_RULES`.
    history_free_above_chars: a prompt whose text with history has more characters than this is rendered without
        history (the reference's WebShop rule, 13,000); None = no such rule. Applied before ``overlong``.
    template: a template file (``env.prompt.template``) whose text, filled with the environment's fields, is the
        prompt instead of the environment's own; None = the environment's own (:mod:`verl_gigpo.rollout.prompts`).
    history_item: how a template's ``{history}`` writes the past steps, one of
        :data:`~verl_gigpo.rollout.prompts.HISTORY_ITEMS`.
    image_history: the images of how many past steps a prompt shows before the current observation's (oldest
        first; 0 = none, as the reference's visual Sokoban prompt). Text history is ``env.history_length``'s.

    Raises:
        ValueError: a bad value, naming the key (``env.prompt.<field>``).
    """

    style: PromptStyle = field(default_factory=PromptStyle)
    invalid_reply_tail: int | None = whole(
        None,
        f"null: the history shows {INVALID_IN_HISTORY!r} for a reply that sent no command; N: its last N "
        "characters, as the reference: ALFWorld 30, WebShop 20, search 0",
        low=0,
        nullable=True,
    )
    overlong: str = choice(
        "drop_history", OVERLONG_RULES, "; ".join(f"{rule}: {meaning}" for rule, meaning in OVERLONG_RULES.items())
    )
    history_free_above_chars: int | None = whole(
        None,
        "a prompt longer than that many characters with history is shown without it; the reference's "
        "WebShop: 13000; null = never",
        low=1,
        nullable=True,
    )
    template: str | None = None
    history_item: str = choice(
        "env", HISTORY_ITEMS, "; ".join(f"{name}: {meaning}" for name, meaning in HISTORY_ITEMS.items())
    )
    image_history: int = whole(
        0,
        "the images of that many past steps shown before the current one's; 0 = none (the reference's visual "
        "Sokoban prompt)",
        low=0,
    )

    def __post_init__(self) -> None:
        if not isinstance(self.style, PromptStyle):
            raise ValueError(f"PromptOptions.style must be an environments.base.PromptStyle, got {self.style!r}")
        check_settings(self, "env.prompt")
        if self.template is not None:
            if not isinstance(self.template, str) or not self.template:
                raise ValueError(
                    f"env.prompt.template={self.template!r} must be the path of a template file, or null for the "
                    "environment's own prompt"
                )
            load_template(self.template)

    @classmethod
    def from_config(cls, prompt: Mapping[str, Any] | None) -> PromptOptions:
        """The options of a config's ``env.prompt`` section (None or absent keys: the defaults).

        Raises:
            ValueError: the section is not a mapping, has a key outside :data:`PROMPT_KEYS`, or a bad value; the
                message names the key (``env.prompt.<key>``).
        """
        if prompt is None:
            return cls()
        if not isinstance(prompt, Mapping):
            raise ValueError(
                f"env.prompt must be a mapping of prompt options ({', '.join(PROMPT_KEYS)}), got {prompt!r}"
            )
        unknown = sorted(str(key) for key in prompt if key not in PROMPT_KEYS)
        if unknown:
            raise ValueError(f"unknown env.prompt key(s) {unknown}; known keys: {list(PROMPT_KEYS)}")
        defaults, base = PromptStyle(), cls()
        try:
            style = PromptStyle(
                show_step_limit=prompt.get("show_step_limit", defaults.show_step_limit),
                first_step_number=prompt.get("first_step_number", defaults.first_step_number),
                admissible_actions=prompt.get("admissible_actions", defaults.admissible_actions),
            )
        except ValueError as exc:
            raise ValueError(str(exc).replace("PromptStyle.", "env.prompt.")) from None
        options = cls(
            style=style,
            invalid_reply_tail=prompt.get("invalid_reply_tail", base.invalid_reply_tail),
            overlong=prompt.get("overlong", base.overlong),
            history_free_above_chars=prompt.get("history_free_above_chars", base.history_free_above_chars),
            template=prompt.get("template", base.template),
            history_item=prompt.get("history_item", base.history_item),
            image_history=prompt.get("image_history", base.image_history),
        )
        moot_key_warnings(options)
        return options

    def history_action(self, action: str | None, reply: str) -> str:
        """What the history shows as the action of a step: the command sent (``action``), or, when the reply sent
        none, :data:`INVALID_IN_HISTORY` or the reply's last ``invalid_reply_tail`` characters."""
        if action is not None:
            return action
        if self.invalid_reply_tail is None:
            return INVALID_IN_HISTORY
        return reply[len(reply) - self.invalid_reply_tail :] if self.invalid_reply_tail else ""


@dataclass(frozen=True)
class TaskSpec:
    """One task = one episode group: every member builds ``env_name`` with ``env_kwargs`` and resets it with
    ``(seed, split)``, so all of them start in the same state.

    env_name: registry name (see ``environments.list_envs()``).
    seed: task seed / index (the same seed gives the same task and initial state).
    split: task split of that environment (``"train"``, ``"valid_seen"``, ``"test"``, ...).
    env_kwargs: extra constructor arguments (e.g. ``{"dim_room": [6, 6]}``); ``max_steps`` and ``key_mode``
        come from :class:`EpisodeConfig` and must not be repeated here.
    """

    env_name: str
    seed: int
    split: str = "train"
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeConfig:
    """How an episode is played (the ``env.*`` keys of the Hydra config).

    max_steps: step limit of the environment (truncation).
    history_length: how many past (observation, action) pairs the prompt shows (paper: 2 for ALFWorld).
    max_prompt_length: prompt token budget; what happens to a longer prompt is ``prompt.overlong``'s rule (by
        default the oldest history is dropped first, then the prompt is cut from the left as a last resort).
    max_response_length: response tokens kept per step (longer generations are cut).
    invalid_action_penalty: subtracted from the step reward when the reply is invalid (paper: 0.1).
    key_mode: anchor key mode handed to the environment (``observation`` | ``state`` | ``history:K``).
    invalid_action: which replies are invalid (``env.invalid_action``): ``"admissible"`` (an inadmissible command
        is invalid, penalised, and the state stays) or ``"format"`` (the reference's rule: only a broken format is
        invalid; a well-formed command goes to the environment). See :mod:`environments.base`.
    prompt: how each step's prompt is built (``env.prompt.*``, :class:`PromptOptions`).
    parse: how a reply becomes a command (``env.parse.*``, :class:`environments.base.ParseStyle`); the environment
        factory sets it on every environment it builds.
    """

    max_steps: int = 50
    history_length: int = 2
    max_prompt_length: int = 2048
    max_response_length: int = 512
    invalid_action_penalty: float = 0.1
    key_mode: str = "state"
    invalid_action: str = "admissible"
    prompt: PromptOptions = field(default_factory=PromptOptions)
    parse: ParseStyle = field(default_factory=ParseStyle)

    def __post_init__(self) -> None:
        for name, key in _EPISODE_RULES.items():  # the config rules, naming the field (the agent loop maps it back)
            RANGES[key].check(getattr(self, name), key=f"EpisodeConfig.{name}")
        check_invalid_action(self.invalid_action)
        if not isinstance(self.prompt, PromptOptions):
            raise ValueError(f"EpisodeConfig.prompt must be a PromptOptions, got {self.prompt!r}")
        if not isinstance(self.parse, ParseStyle):
            raise ValueError(f"EpisodeConfig.parse must be an environments.base.ParseStyle, got {self.parse!r}")

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, Any],
        *,
        max_prompt_length: int,
        max_response_length: int,
        key_mode: str,
        field_keys: Mapping[str, str] | None = None,
    ) -> EpisodeConfig:
        """The episode settings of a config's ``env`` section (``max_steps``, ``history_length``,
        ``invalid_action_penalty``, ``invalid_action``, ``prompt``: :meth:`PromptOptions.from_config`, ``parse``:
        :func:`parse_style_from_config`) plus the prompt
        and response budgets and the anchor key mode, which each engine reads from its own keys. Both engines build
        their :class:`EpisodeConfig` here.

        Raises:
            ValueError: a value out of range, the message naming the config key (``env.<field>``, or
                ``field_keys[field]`` for the fields not under ``env``) instead of the ``EpisodeConfig`` field.
        """
        keys = {"key_mode": "algorithm.gigpo.key_mode", **(field_keys or {})}
        try:
            return cls(
                max_steps=int(env["max_steps"]),
                history_length=int(env["history_length"]),
                max_prompt_length=int(max_prompt_length),
                max_response_length=int(max_response_length),
                invalid_action_penalty=float(env["invalid_action_penalty"]),
                key_mode=key_mode,
                invalid_action=str(env.get("invalid_action", "admissible")),
                prompt=PromptOptions.from_config(env.get("prompt", None)),
                parse=parse_style_from_config(env.get("parse", None)),
            )
        except ValueError as exc:
            message = _EPISODE_FIELD.sub(lambda m: keys.get(m.group(1), f"env.{m.group(1)}"), str(exc))
            raise ValueError(message) from None

    @property
    def max_observation_chars(self) -> int:
        """Longest observation text shown in a prompt: ``OBSERVATION_CHARS_PER_PROMPT_TOKEN * max_prompt_length``
        characters (a longer one keeps its end)."""
        return OBSERVATION_CHARS_PER_PROMPT_TOKEN * self.max_prompt_length


@dataclass
class GenerationOutput:
    """What a generator returns for one request (duck-compatible with verl's ``TokenOutput``).

    token_ids: generated token ids (R,), EOS included when generation stopped on it.
    log_probs: log-probability of each generated token under the sampling policy (R,), or None.
    stop_reason: ``"completed"`` (EOS), ``"length"`` (max tokens) or None.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None


@runtime_checkable
class Generator(Protocol):
    """The async generation interface shared by verl's server manager and the local server."""

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        """Return an object with ``token_ids`` (list[int]) and ``log_probs`` (list[float] | None)."""
        ...


@dataclass
class StepRecord:
    """One environment step = one training row.

    step_id: 0-based index of the step in its trajectory.
    observation: the observation the action was chosen from; anchor_key: its anchor key (state BEFORE the action).
    prompt_ids (P,), response_ids (R,), response_logprobs (R,) or None: the tokens of this row.
    action: the command sent to the environment (the canonical action; under the ``format`` rule any command the
        reply named, admissible or not; None when none was sent); action_valid: the reply is valid under the
        episode's invalid-action rule (False: penalised).
    env_reward: reward returned by the environment; step_reward: env_reward - penalty if invalid.
    terminated / truncated / won: flags after the step.
    history_used: past steps shown in the prompt; history_dropped: past steps left out of it to fit
        max_prompt_length (or ``env.prompt.history_free_above_chars``).
    prompt_truncated: the prompt's ids were cut from the left (``env.prompt.overlong``: ``cut_left``, or
        ``drop_history`` when even the history-free prompt was too long).
    observation_truncated: ``observation`` was longer than ``EpisodeConfig.max_observation_chars`` and holds its
        end only (so does the prompt).
    generation_info: the generator output's ``extra_fields`` when it has them (verl's servers report e.g. the
        weight versions ``min_global_steps``/``max_global_steps``), else an empty dict.
    """

    step_id: int
    observation: str
    anchor_key: str
    prompt_text: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None
    response_text: str
    action: str | None
    action_valid: bool
    env_reward: float
    step_reward: float
    terminated: bool
    truncated: bool
    won: bool
    history_used: int = 0
    history_dropped: int = 0
    prompt_truncated: bool = False
    observation_truncated: bool = False
    generation_info: dict[str, Any] = field(default_factory=dict)
    #: the observation's images shown in the prompt (RGB PIL images; none for a text environment)
    images: list[Any] = field(default_factory=list)


@dataclass
class Episode:
    """A finished episode: its steps and a summary.

    traj_id: unique trajectory id; task: the task it played; task_id / task_type: from the environment.
    steps: one :class:`StepRecord` per step (may be empty if the environment failed at reset).
    won: the task was solved; episode_return: sum of step rewards (shaping included).
    env_error: the error message when the environment raised, or the prompt went over budget under
        ``env.prompt.overlong=fail_episode`` (the episode ended there), else None.
    timing: seconds spent in ``generate`` (awaiting the server), ``env`` (inside reset/step/close, measured in the
        worker thread) and ``glue`` (prompt render + chat template + tokenise, decode + parse).
    abandoned_threads: environment calls of this episode abandoned in threads past their deadline (0 or 1: the
        episode ends there); each leaves a thread running until the call returns (``env/abandoned_threads``).
    group_id: the episode group it belongs to (the id of its task draw, shared by the group's members; verl's
        ``uid``); None: the group is the task itself (:func:`verl_gigpo.rollout.step_rows.episode_group_id`).
    seeds: the seeds its requests carried (:class:`~verl_gigpo.rollout.seeding.EpisodeSeeds`: rollout seed,
        stream, member), or None when they carried none; enough to replay it.
    """

    traj_id: str
    task: TaskSpec
    task_id: str | None = None
    task_type: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
    won: bool = False
    episode_return: float = 0.0
    env_error: str | None = None
    timing: dict[str, float] = field(default_factory=dict)
    abandoned_threads: int = 0
    group_id: str | None = None
    seeds: Any = None

    @property
    def length(self) -> int:
        """Number of steps played."""
        return len(self.steps)

    @property
    def num_invalid(self) -> int:
        """Steps whose reply was invalid (under the episode's invalid-action rule)."""
        return sum(not s.action_valid for s in self.steps)

    @property
    def num_observation_truncated(self) -> int:
        """Steps whose observation was cut to ``EpisodeConfig.max_observation_chars``."""
        return sum(s.observation_truncated for s in self.steps)
