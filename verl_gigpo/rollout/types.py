"""Plain data types shared by the episode runner, the verl agent loop and the local engine."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from environments.base import INVALID_ACTION_RULES
from verl_gigpo.rules import RANGES

__all__ = [
    "OBSERVATION_CHARS_PER_PROMPT_TOKEN",
    "Episode",
    "EpisodeConfig",
    "GenerationOutput",
    "Generator",
    "StepRecord",
    "TaskSpec",
    "check_invalid_action",
]

#: An observation longer than this many characters per prompt token (``max_prompt_length``) is cut to its last
#: ``OBSERVATION_CHARS_PER_PROMPT_TOKEN * max_prompt_length`` characters before the prompt is rendered and tokenised.
#: English BPE text averages about 4 characters a token (ALFWorld's and WebShop's text with Qwen's tokenizer), so
#: the kept tail still holds about twice the prompt budget: a cut observation's prompt is cut from the left anyway
#: and keeps the same end, while a huge observation costs bounded tokenising time.
OBSERVATION_CHARS_PER_PROMPT_TOKEN = 8

#: EpisodeConfig field -> the config key whose rule (:data:`verl_gigpo.rules.RANGES`) it obeys
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
    max_prompt_length: prompt token budget; when exceeded, the oldest history is dropped first, then the
        prompt is cut from the left as a last resort — an episode never fails for length.
    max_response_length: response tokens kept per step (longer generations are cut).
    invalid_action_penalty: subtracted from the step reward when the reply is invalid (paper: 0.1).
    key_mode: anchor key mode handed to the environment (``observation`` | ``state`` | ``history:K``).
    invalid_action: which replies are invalid (``env.invalid_action``): ``"admissible"`` (an inadmissible command
        is invalid, penalised, and the state stays) or ``"format"`` (the reference's rule: only a broken format is
        invalid; a well-formed command goes to the environment). See :mod:`environments.base`.
    """

    max_steps: int = 50
    history_length: int = 2
    max_prompt_length: int = 2048
    max_response_length: int = 512
    invalid_action_penalty: float = 0.1
    key_mode: str = "state"
    invalid_action: str = "admissible"

    def __post_init__(self) -> None:
        for name, key in _EPISODE_RULES.items():  # the config rules, naming the field (the agent loop maps it back)
            RANGES[key].check(getattr(self, name), key=f"EpisodeConfig.{name}")
        check_invalid_action(self.invalid_action)

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
        ``invalid_action_penalty``, ``invalid_action``) plus the prompt and response budgets and the anchor key mode,
        which each engine reads from its own keys. Both engines build their :class:`EpisodeConfig` here.

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
    history_used: past steps shown in the prompt; history_dropped: past steps removed to fit max_prompt_length.
    prompt_truncated: the prompt was cut from the left even with no history.
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


@dataclass
class Episode:
    """A finished episode: its steps and a summary.

    traj_id: unique trajectory id; task: the task it played; task_id / task_type: from the environment.
    steps: one :class:`StepRecord` per step (may be empty if the environment failed at reset).
    won: the task was solved; episode_return: sum of step rewards (shaping included).
    env_error: the error message when the environment raised (the episode ended there), else None.
    timing: seconds spent in ``generate`` (awaiting the server), ``env`` (inside reset/step/close, measured in the
        worker thread) and ``glue`` (prompt render + chat template + tokenise, decode + parse).
    abandoned_threads: environment calls of this episode abandoned in threads past their deadline (0 or 1: the
        episode ends there); each leaves a thread running until the call returns (``env/abandoned_threads``).
    group_id: the episode group it belongs to (the id of its task draw, shared by the group's members; verl's
        ``uid``); None: the group is the task itself (:func:`verl_gigpo.rollout.step_rows.episode_group_id`).
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
