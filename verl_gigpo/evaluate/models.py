"""What the evaluation command accepts as a model, and how each is loaded: a Hugging Face model folder, a
local-engine run or checkpoint (its start model with the checkpoint's weights, and the run's settings), or a verl
checkpoint (``<experiment>``, ``.../global_step_N`` or its ``actor/``), found as ``python -m verl_gigpo.export``
finds it. docs/evaluate.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gigpo.export.run_settings import RunSettings, local_run_layer, no_launch_record, verl_run_settings

__all__ = [
    "ModelSource",
    "RunSettings",
    "exported_run_settings",
    "load_local_weights",
    "local_run_layer",
    "no_launch_record",
    "resolve_model",
    "run_settings",
    "verl_run_settings",
]


#: the files a Hugging Face folder holds its weights in
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


@dataclass(frozen=True)
class ModelSource:
    """A model to evaluate: ``kind`` is ``"hf"``, ``"local"`` or ``"verl"``.

    ``hf_dir``: the folder whose config and tokenizer are used (None for a verl checkpoint until exported);
    ``checkpoint``: a local ``state.pt`` or a verl ``global_step_N``; ``run_config``: a local run's saved config.
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

    def short_name(self) -> str:
        """A folder-name stem: ``tiny-model``, ``demo-iter_200``, ``<experiment>-global_step_150``."""
        if self.kind == "hf":
            return Path(self.given).resolve().name or "model"
        if self.kind == "local":
            run = self.checkpoint.parent.parent.parent  # <run>/checkpoints/iter_K/state.pt
            return f"{run.name}-iter_{self.step}"
        return f"{self.checkpoint.parent.name}-global_step_{self.step}"


def resolve_model(path: str | Path) -> ModelSource:
    """Say what ``path`` is.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: neither a Hugging Face folder nor a checkpoint, or a local checkpoint without its start model.
    """
    from verl_gigpo.export import ExportError, local_base_model, resolve_checkpoint

    given = Path(path)
    if not given.exists():
        raise FileNotFoundError(f"model {given} does not exist")
    verl_side_folder = given.name == "huggingface" and (given.parent / "fsdp_config.json").is_file()
    if (given / "config.json").is_file() and not verl_side_folder:
        if not any(next(given.glob(pattern), None) for pattern in _WEIGHT_FILES):
            raise ValueError(
                f"{given} has config.json but no weights ({', '.join(_WEIGHT_FILES)}): pass a complete Hugging Face "
                "folder or a checkpoint"
            )
        return ModelSource(given=given, kind="hf", hf_dir=given)
    try:
        source = resolve_checkpoint(given)
    except ExportError as exc:
        raise ValueError(
            f"{given} is not a model the evaluation reads: a Hugging Face folder (with config.json) or a checkpoint "
            f"({exc})"
        ) from None
    if source.kind == "verl":  # source.path is the actor folder
        return ModelSource(given=given, kind="verl", hf_dir=None, checkpoint=source.path.parent, step=source.step)
    state = _load(source.path)
    try:
        start = local_base_model(source.path, state, None)
    except ExportError as exc:
        raise ValueError(f"{exc}, or export it with `python -m verl_gigpo.export` and evaluate that") from None
    return ModelSource(
        given=given, kind="local", hf_dir=start, checkpoint=source.path, step=source.step, run_config=state["config"]
    )


def load_local_weights(source: ModelSource) -> dict[str, Any]:
    """The model state dict of a local checkpoint; ValueError for another kind of source."""
    if source.kind != "local" or source.checkpoint is None:
        raise ValueError(f"{source.given} is not a local-engine checkpoint")
    return _load(source.checkpoint)["model"]


def _load(state_file: Path) -> dict[str, Any]:
    import torch

    return torch.load(state_file, map_location="cpu", weights_only=False)


def run_settings(path: str | Path) -> RunSettings:
    """The settings of a run or checkpoint of either engine, or of a folder the export wrote (``--settings``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is no run or checkpoint, or a verl experiment without a launch record.
    """
    given = Path(path)
    if not given.exists():
        raise FileNotFoundError(
            f"--settings {given} does not exist; pass a local-engine run (runs/NAME) or a verl experiment or "
            "checkpoint (<experiment>/global_step_N)"
        )
    try:
        source = resolve_model(given)
    except ValueError:
        source = None
    if source is not None and source.kind == "hf" and exported_run_settings(source.hf_dir) is not None:
        return exported_run_settings(source.hf_dir)
    if source is not None and source.kind == "local":
        return RunSettings(layer=local_run_layer(source.run_config), origin=f"local run {source.checkpoint}")
    if source is not None and source.kind == "verl":
        settings = verl_run_settings(source.checkpoint, source.step)
        if settings is None:
            raise ValueError(no_launch_record(source.checkpoint))
        return settings
    raise ValueError(
        f"--settings {given}: not a local-engine run or checkpoint, nor a verl experiment or checkpoint (no saved "
        "settings there)"
    )


def exported_run_settings(hf_dir: Path) -> RunSettings | None:
    """The run settings the export saved in a folder (None when it has none)."""
    import json

    from verl_gigpo.export import RUN_SETTINGS

    path = Path(hf_dir) / RUN_SETTINGS
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return RunSettings(
        layer=saved["layer"],
        origin=f"{saved['origin']}, saved with the export in {path}",
        dropped=tuple(saved.get("dropped", ())),
    )
