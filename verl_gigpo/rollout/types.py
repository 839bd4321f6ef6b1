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

#: An observation longer than this many characters per prompt token (``max_prompt_length``) is cut to its end
#: before the prompt is rendered (docs/environments.md#long-observations-and-the-prompt-budget)
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
    """Return ``value`` when it is an ``env.invalid_action`` rule, else raise ValueError naming the key."""
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
    """The :class:`~environments.base.ParseStyle` of ``env.parse`` (None or absent keys: the defaults).

    Raises ValueError naming ``env.parse.<key>``: not a mapping, an unknown key, or a value that is not a bool.
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
    """How each step's prompt is built: the ``env.prompt.*`` keys (docs/configuration.md), for both engines.

    ``style`` holds ``show_step_limit``, ``first_step_number`` and ``admissible_actions``. Raises ValueError naming
    ``env.prompt.<field>``.
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
        """The options of ``env.prompt`` (None or absent keys: the defaults); ValueError names the bad key."""
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
        """The history's action of a step: ``action``, or for none :data:`INVALID_IN_HISTORY` or the reply's tail."""
        if action is not None:
            return action
        if self.invalid_reply_tail is None:
            return INVALID_IN_HISTORY
        return reply[len(reply) - self.invalid_reply_tail :] if self.invalid_reply_tail else ""


@dataclass(frozen=True)
class TaskSpec:
    """One task = one episode group: every member builds ``env_name`` with ``env_kwargs`` (not ``max_steps`` or
    ``key_mode``, which :class:`EpisodeConfig` sets) and resets it with ``(seed, split)``."""

    env_name: str
    seed: int
    split: str = "train"
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeConfig:
    """How an episode is played: the ``env.*`` keys (docs/configuration.md), plus the prompt and response token
    budgets and the anchor key mode."""

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
        """Both engines' :class:`EpisodeConfig` from a config's ``env`` section plus the budgets and key mode.

        Raises ValueError naming the config key (``env.<field>`` or ``field_keys[field]``).
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
        """``OBSERVATION_CHARS_PER_PROMPT_TOKEN * max_prompt_length``: longest observation shown (its end)."""
        return OBSERVATION_CHARS_PER_PROMPT_TOKEN * self.max_prompt_length


@dataclass
class GenerationOutput:
    """One request's output (like verl's ``TokenOutput``): ``token_ids`` (R,) with EOS, ``log_probs`` (R,) or None,
    ``stop_reason`` ``"completed"`` | ``"length"`` | None."""

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
    """One environment step = one training row: ``prompt_ids`` (P,), ``response_ids`` (R,), ``response_logprobs``
    (R,) or None. ``anchor_key`` is the state before the action; ``action`` is None when no command was sent;
    ``step_reward = env_reward - penalty`` if invalid; ``generation_info``: the output's ``extra_fields`` (verl's weight
    versions)."""

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
    """A finished episode: its steps (empty if reset failed) and a summary. ``env_error``: why it ended early;
    ``timing``: seconds in ``generate``, ``env`` and ``glue`` (render, tokenise, parse); ``group_id``: verl's ``uid``
    (None: the task); ``seeds``: its :class:`~verl_gigpo.rollout.seeding.EpisodeSeeds`, enough to replay it."""

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
