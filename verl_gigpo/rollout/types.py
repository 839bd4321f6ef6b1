"""Plain data types shared by the episode runner, the verl agent loop and the local engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Episode", "EpisodeConfig", "GenerationOutput", "Generator", "StepRecord", "TaskSpec"]


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
    invalid_action_penalty: subtracted from the step reward when the reply holds no valid action (paper: 0.1).
    key_mode: anchor key mode handed to the environment (``observation`` | ``state`` | ``history:K``).
    """

    max_steps: int = 50
    history_length: int = 2
    max_prompt_length: int = 2048
    max_response_length: int = 512
    invalid_action_penalty: float = 0.1
    key_mode: str = "state"

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_prompt_length", "max_response_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EpisodeConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.history_length, int) or self.history_length < 0:
            raise ValueError(f"EpisodeConfig.history_length must be an int >= 0, got {self.history_length!r}")
        if self.invalid_action_penalty < 0:
            raise ValueError(
                f"EpisodeConfig.invalid_action_penalty is subtracted from the reward; give a value >= 0, "
                f"got {self.invalid_action_penalty!r}"
            )


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
    action: the parsed action (None when invalid); action_valid: whether the reply held a valid action.
    env_reward: reward returned by the environment; step_reward: env_reward - penalty if invalid.
    terminated / truncated / won: flags after the step.
    history_used: past steps shown in the prompt; history_dropped: past steps removed to fit max_prompt_length.
    prompt_truncated: the prompt was cut from the left even with no history.
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

    @property
    def length(self) -> int:
        """Number of steps played."""
        return len(self.steps)

    @property
    def num_invalid(self) -> int:
        """Steps whose reply held no valid action."""
        return sum(not s.action_valid for s in self.steps)
