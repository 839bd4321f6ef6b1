"""What the evaluation command accepts as a model, and how each is loaded.

* a Hugging Face model folder (``config.json`` and a tokenizer), e.g. ``artifacts/tiny-model``, the folder
  ``python -m verl_gigpo.export`` writes, or a downloaded ``Qwen2.5-1.5B-Instruct``;
* a local-engine run folder (``runs/demo``: its newest complete checkpoint) or one checkpoint of it
  (``runs/demo/checkpoints/iter_200``): the run's start model with the checkpoint's weights, and the run's settings;
* a verl checkpoint (``.../global_step_N`` or its ``actor/`` folder): verl's engine loads it itself
  (``--engine verl``, ``trainer.resume_from_path``); the local engine needs it exported first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelSource", "resolve_model"]

_GLOBAL_STEP = re.compile(r"global_step_(\d+)")


@dataclass(frozen=True)
class ModelSource:
    """A model to evaluate.

    Attributes:
        given: the path the user gave.
        kind: ``"hf"`` (a Hugging Face folder), ``"local"`` (a local-engine checkpoint) or ``"verl"`` (a verl
            checkpoint folder ``global_step_N``).
        hf_dir: the Hugging Face folder whose config and tokenizer are used (a local checkpoint's start model;
            None for a verl checkpoint).
        checkpoint: the local checkpoint's ``state.pt``, or the verl checkpoint's ``global_step_N`` folder.
        step: the checkpoint's iteration (None for a Hugging Face folder).
        run_config: the local run's saved config (a dict), None otherwise.
    """

    given: Path
    kind: str
    hf_dir: Path | None
    checkpoint: Path | None = None
    step: int | None = None
    run_config: dict[str, Any] | None = None

    def describe(self) -> str:
        """One line saying what is evaluated."""
        if self.kind == "hf":
            return f"Hugging Face model {self.hf_dir}"
        if self.kind == "local":
            return f"local-engine checkpoint {self.checkpoint} (iteration {self.step}, start model {self.hf_dir})"
        return f"verl checkpoint {self.checkpoint} (step {self.step})"


def resolve_model(path: str | Path) -> ModelSource:
    """Say what ``path`` is (see the module docstring).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is none of the accepted kinds (the message lists them), or a local run folder without a
            complete checkpoint.
    """
    given = Path(path)
    if not given.exists():
        raise FileNotFoundError(f"model {given} does not exist")
    if (given / "config.json").is_file():
        return ModelSource(given=given, kind="hf", hf_dir=given)
    verl = _verl_step_folder(given)
    if verl is not None:
        return ModelSource(given=given, kind="verl", hf_dir=None, checkpoint=verl, step=_step_of(verl))
    state = _local_state_file(given)
    if state is not None:
        return _local_source(given, state)
    raise ValueError(
        f"{given} is not a model the evaluation reads: give a Hugging Face model folder (with config.json), a "
        "local-engine run folder or checkpoint (runs/NAME or runs/NAME/checkpoints/iter_K), or a verl checkpoint "
        "(.../global_step_N, or its actor/ folder)"
    )


def _verl_step_folder(path: Path) -> Path | None:
    """``.../global_step_N`` when ``path`` is that folder or its ``actor/`` folder, else None."""
    for candidate in (path, path.parent):
        if _GLOBAL_STEP.fullmatch(candidate.name) and (candidate / "actor").is_dir():
            return candidate
    return None


def _step_of(folder: Path) -> int:
    match = _GLOBAL_STEP.fullmatch(folder.name)
    return int(match.group(1)) if match else 0


def _local_state_file(path: Path) -> Path | None:
    """The ``state.pt`` of a local checkpoint folder, or the best one of a run folder, else None."""
    if (path / "state.pt").is_file():
        return path / "state.pt"
    if (path / "checkpoints").is_dir():
        from verl_gigpo.local.run_folder import checkpoint_candidates

        found = checkpoint_candidates(path / "checkpoints")
        if not found:
            raise ValueError(f"{path} is a local run folder without a complete checkpoint (checkpoints/iter_K)")
        return found[0][1]
    return None


def _local_source(given: Path, state_file: Path) -> ModelSource:
    import torch

    state = torch.load(state_file, map_location="cpu", weights_only=False)
    config = state.get("config") or {}
    start = ((config.get("actor_rollout_ref") or {}).get("model") or {}).get("path")
    if not start or not (Path(start) / "config.json").is_file():
        raise ValueError(
            f"{state_file} was trained from actor_rollout_ref.model.path={start!r}, which is not a Hugging Face "
            "folder here; its config and tokenizer are needed (run from the folder the run was started in, or "
            "export the checkpoint with `python -m verl_gigpo.export`)"
        )
    return ModelSource(
        given=given,
        kind="local",
        hf_dir=Path(start),
        checkpoint=state_file,
        step=int(state["iteration"]),
        run_config=config,
    )


def load_local_weights(source: ModelSource) -> dict[str, Any]:
    """The model state dict of a local checkpoint (``source.kind == "local"``)."""
    import torch

    if source.kind != "local" or source.checkpoint is None:
        raise ValueError(f"{source.given} is not a local-engine checkpoint")
    return torch.load(source.checkpoint, map_location="cpu", weights_only=False)["model"]
