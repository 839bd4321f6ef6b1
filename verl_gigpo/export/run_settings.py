"""The settings of the run that wrote a checkpoint, as a layer of the local engine's config: read by
``python -m verl_gigpo.export`` (saved beside the weights) and by the evaluation command
(:mod:`verl_gigpo.evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunSettings", "local_run_layer", "no_launch_record", "verl_run_settings"]


@dataclass(frozen=True)
class RunSettings:
    """The settings of the run that made a model as a local-engine config ``layer``, where they were read
    (``origin``), and the run's keys the local engine has no counterpart for (``dropped``, not applied)."""

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
    """The settings of the verl launch that wrote ``checkpoint``, from ``<experiment>/launches/launch_NNN.json`` (the
    newest when none matches), as local-engine keys, with ``local.constrain_to_actions=false``; None without a record.
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


#: keys of a local run's saved ``trainer`` section that belong to the run folder, not to what an episode plays
_RUN_ONLY_KEYS = ("resume", "overwrite", "allow_config_change", "default_local_dir")


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
    """``(environment, split, task count)`` of a launch's ``data.val_files`` rows, else ``(None, default, None)``."""
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
