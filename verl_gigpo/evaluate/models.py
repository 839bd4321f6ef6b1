"""What the evaluation command accepts as a model, and how each is loaded.

* a Hugging Face model folder (``config.json`` and a tokenizer), e.g. ``artifacts/tiny-model``, the folder
  ``python -m verl_gigpo.export`` writes, or a downloaded ``Qwen2.5-1.5B-Instruct``;
* a checkpoint of either engine, found as ``python -m verl_gigpo.export`` finds it
  (:func:`verl_gigpo.export.resolve_checkpoint`): a local-engine run folder or checkpoint (``runs/demo``,
  ``runs/demo/checkpoints/iter_200``: the run's start model with the checkpoint's weights, and the run's settings),
  or a verl checkpoint (``<experiment>``, ``.../global_step_N`` or its ``actor/`` folder: verl's engine loads it
  itself, ``--engine verl``; the local engine plays its float32 export).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """A model to evaluate.

    Attributes:
        given: the path the user gave.
        kind: ``"hf"`` (a Hugging Face folder), ``"local"`` (a local-engine checkpoint) or ``"verl"`` (a verl
            checkpoint).
        hf_dir: the Hugging Face folder whose config and tokenizer are used (a local checkpoint's start model;
            None for a verl checkpoint until it is exported).
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

    def short_name(self) -> str:
        """A folder-name stem for this model: ``tiny-model``, ``demo-iter_200`` (a local run and its iteration),
        ``<experiment>-global_step_150`` (a verl checkpoint)."""
        if self.kind == "hf":
            return Path(self.given).resolve().name or "model"
        if self.kind == "local":
            run = self.checkpoint.parent.parent.parent  # <run>/checkpoints/iter_K/state.pt
            return f"{run.name}-iter_{self.step}"
        return f"{self.checkpoint.parent.name}-global_step_{self.step}"


def resolve_model(path: str | Path) -> ModelSource:
    """Say what ``path`` is (see the module docstring).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is neither a Hugging Face folder nor a checkpoint (the message says what is accepted),
            or a local checkpoint whose start model is not there.
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
    """The model state dict of a local checkpoint (``source.kind == "local"``).

    Raises:
        ValueError: ``source`` is not a local-engine checkpoint.
    """
    if source.kind != "local" or source.checkpoint is None:
        raise ValueError(f"{source.given} is not a local-engine checkpoint")
    return _load(source.checkpoint)["model"]


def _load(state_file: Path) -> dict[str, Any]:
    import torch

    return torch.load(state_file, map_location="cpu", weights_only=False)


@dataclass(frozen=True)
class RunSettings:
    """The settings of the run that made a model, as a layer of the local engine's config.

    Attributes:
        layer: nested mapping of local-engine config keys (``env.*``, ``algorithm.*``, prompt and reply lengths,
            validation sampling, the validation split and size).
        origin: where they were read (a local run's saved config, or a verl launch record).
        dropped: keys of the run's config the local engine has no counterpart for (not applied).
    """

    layer: dict[str, Any]
    origin: str
    dropped: tuple[str, ...] = ()


#: the parts of a verl launch's config that say what an episode plays and how the model is sampled, with the
#: same meaning on the local engine (each subtree is kept where the local engine has the key)
_VERL_SHARED = (
    "env",
    "algorithm",
    "data.max_prompt_length",
    "data.apply_chat_template_kwargs",
    "actor_rollout_ref.rollout.response_length",
    "actor_rollout_ref.rollout.val_kwargs",
)
#: verl-only or training-only keys among those subtrees (the KL-in-reward switch trains, it does not play)
_VERL_SKIPPED = ("algorithm.use_kl_in_reward", "env.transcript_dir")


def verl_run_settings(checkpoint: Path, step: int) -> RunSettings | None:
    """The settings of the verl launch that wrote ``checkpoint`` (``<experiment>/global_step_<step>``), read from
    its launch record (``<experiment>/launches/launch_NNN.json``, written by ``python -m verl_gigpo.main``; the
    newest record when none can be matched to the checkpoint), as local-engine keys: the parts in
    :data:`_VERL_SHARED` the local engine has, the environment, split and size of the launch's ``data.val_files``
    (its rows' ``env_name`` and ``split`` and their count; the environment's default evaluation split when the file
    is gone),
    and ``local.constrain_to_actions=false`` (verl samples from the whole vocabulary). None when the experiment
    folder holds no launch record.
    """
    from verl_gigpo.verl_glue.launch import LAUNCHES_DIR, saved_launch_config

    folder = Path(checkpoint).parent
    found = saved_launch_config(folder, step)
    if found is None:
        records = sorted((folder / LAUNCHES_DIR).glob("launch_*.json"))
        if not records:
            return None
        import json

        found = records[-1], json.loads(records[-1].read_text())
    path, record = found
    config = record["config"]
    defaults = _local_defaults()
    layer: dict[str, Any] = {}
    dropped: list[str] = []
    for key in _VERL_SHARED:
        value = _get(config, key)
        if value is None:
            continue
        kept = _common(value, _get(defaults, key), key, dropped)
        _put(layer, key, kept)
    env_name, split, size = _val_tasks(config)
    if env_name is not None:
        _put(layer, "env.name", env_name)
    if split is not None:
        _put(layer, "env.val_split", split)
    if size is not None:
        _put(layer, "data.val_size", size)
    layer["local"] = {"constrain_to_actions": False}
    return RunSettings(layer=layer, origin=f"verl launch record {path}", dropped=tuple(dropped))


def run_settings(path: str | Path) -> RunSettings:
    """The settings of a local-engine run or checkpoint, a verl experiment or checkpoint, or a folder
    ``python -m verl_gigpo.export`` wrote (``--settings``).

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


#: keys of a local run's saved ``trainer`` section that belong to the run folder, not to what an episode plays
_RUN_ONLY_KEYS = ("resume", "overwrite", "allow_config_change", "default_local_dir")


def exported_run_settings(hf_dir: Path) -> RunSettings | None:
    """The run settings ``python -m verl_gigpo.export`` saved in a folder it wrote
    (:data:`verl_gigpo.export.RUN_SETTINGS`), None when the folder has none."""
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


def local_run_layer(run_config: dict[str, Any]) -> dict[str, Any]:
    """A local run's saved config as a layer, without its folder and resume flags."""
    trainer = {k: v for k, v in run_config.get("trainer", {}).items() if k not in _RUN_ONLY_KEYS}
    return {**run_config, "trainer": trainer}


def no_launch_record(checkpoint: Path) -> str:
    """The message for a verl checkpoint whose experiment folder holds no launch record."""
    return (
        f"{checkpoint.parent / 'launches'} holds no launch record (the run was not launched with python -m "
        "verl_gigpo.main), so its settings are unknown: pass --env NAME and the run's settings as key=value (e.g. "
        "env.max_steps=50 env.history_length=2 data.max_prompt_length=2048 "
        "actor_rollout_ref.rollout.response_length=512), or evaluate it with verl: --engine verl -- <the run's "
        "overrides>"
    )


def _val_tasks(config: dict[str, Any]) -> tuple[str | None, str | None, int | None]:
    """``(environment, split, task count)`` of a verl launch's validation: its ``data.val_files`` rows' one
    ``env_name`` and one ``split`` (the agent loop plays a row's ``env_name``, which may differ from ``env.name``)
    and their number; else ``(None, the environment's default evaluation split, None)``."""
    from verl_gigpo.data.prepare import DEFAULT_VAL_SPLIT

    files = _get(config, "data.val_files")
    files = [files] if isinstance(files, str) else list(files or [])
    if len(files) == 1 and Path(files[0]).is_file():
        import pandas as pd

        frame = pd.read_parquet(files[0])
        envs = sorted(set(frame["env_name"])) if "env_name" in frame else []
        splits = sorted(set(frame["split"])) if "split" in frame else []
        if len(splits) == 1:
            return (str(envs[0]) if len(envs) == 1 else None), str(splits[0]), len(frame)
    return None, DEFAULT_VAL_SPLIT.get(_get(config, "env.name")), None


def _local_defaults() -> dict[str, Any]:
    from omegaconf import OmegaConf

    from verl_gigpo.local.config import DEFAULT_CONFIG

    return OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG), resolve=False)


def _common(value: Any, default: Any, key: str, dropped: list[str]) -> Any:
    """``value`` restricted to the keys ``default`` has (a default of ``{}`` is free-form: kept whole)."""
    if not isinstance(value, dict) or not isinstance(default, dict) or not default:
        return value
    kept = {}
    for name, item in value.items():
        path = f"{key}.{name}"
        if name not in default or path in _VERL_SKIPPED:
            dropped.append(path)
            continue
        kept[name] = _common(item, default[name], path, dropped)
    return kept


def _get(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value
