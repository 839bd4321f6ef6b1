"""Export a checkpoint to a Hugging Face model folder: ``python -m verl_gigpo.export CKPT --out HF_DIR``.

    python -m verl_gigpo.export checkpoints/verl_gigpo/alfworld_gigpo_Qwen2.5-1.5B-Instruct --out exported/alfworld
    python -m verl_gigpo.export runs/demo --out exported/demo --dtype float32     # a local-engine run (make demo)

CKPT is a verl checkpoint (``global_step_N[/actor]`` or its experiment folder) or a local-engine one (``iter_K``,
its ``state.pt``, or the run folder). verl's FSDP shards are joined without verl's bfloat16 cast, a LoRA adapter is
merged in (``W' = W + (alpha / r) B A``), and verl's model merger writes the folder with the run's settings
(:data:`RUN_SETTINGS`). The forms, the differences from ``verl.model_merger`` and what is checked: docs/export.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DTYPES",
    "RUN_SETTINGS",
    "ExportError",
    "ExportResult",
    "Source",
    "export_checkpoint",
    "fsdp_full_state_dict",
    "local_base_model",
    "merged_state_dict",
    "resolve_checkpoint",
]

logger = logging.getLogger(__name__)

#: ``--dtype`` choices -> torch dtype
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}

_FSDP_CONFIG = "fsdp_config.json"
#: the file of an exported folder that holds the settings of the run it came from (environment, prompt, limits,
#: validation sampling), which ``python -m verl_gigpo.evaluate`` plays the folder with
RUN_SETTINGS = "gigpo_run_settings.json"
_LORA_META = "lora_train_meta.json"
#: verl's checkpoint folder (not ``global_step_N.partial``: a save that did not finish, set aside by verl_gigpo.main)
_STEP_DIR = re.compile(r"global_step_(\d+)")
_WHAT_TO_PASS = (
    "pass a verl checkpoint (<experiment>/global_step_N/actor, <experiment>/global_step_N or the experiment folder "
    "holding latest_checkpointed_iteration.txt) or a local-engine checkpoint (<run>/checkpoints/iter_K/state.pt, "
    "iter_K, <run>/checkpoints or the run folder)"
)


class ExportError(ValueError):
    """The checkpoint or the target folder cannot be exported to / from; the message names the path and the fix."""


@dataclass(frozen=True)
class Source:
    """A resolved checkpoint: ``kind`` ``"verl"`` (``path``: the ``actor`` folder) or ``"local"`` (``path``:
    ``state.pt``), ``step`` its iteration."""

    kind: str
    path: Path
    step: int


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote: folder, source, dtype, parameter count, the LoRA adapter merged (None:
    none) and where the saved run settings came from (None: unknown)."""

    out: Path
    source: Source
    dtype: str
    num_parameters: int
    lora: dict[str, Any] | None
    settings: str | None = None


# ------------------------------------------------------------------ finding the checkpoint


def _verl_actor(step_dir: Path) -> Source:
    actor = step_dir / "actor"
    if not (actor / _FSDP_CONFIG).is_file():
        raise ExportError(f"{step_dir} has no actor checkpoint ({actor / _FSDP_CONFIG} is missing); {_WHAT_TO_PASS}")
    return Source("verl", actor, int(_STEP_DIR.fullmatch(step_dir.name).group(1)))


def resolve_checkpoint(ckpt: str | Path) -> Source:
    """The checkpoint ``ckpt`` names (the forms of docs/export.md, "Which checkpoint").

    Raises:
        ExportError: no such path, not a checkpoint of either engine, or a pointer that names no complete checkpoint.
    """
    path = Path(ckpt).expanduser().resolve()
    if not path.exists():
        raise ExportError(f"{ckpt} does not exist; {_WHAT_TO_PASS}")
    if path.is_file():
        if path.name == "state.pt":
            return Source("local", path, _local_iteration(path.parent))
        raise ExportError(f"{ckpt} is a file but not a local-engine state.pt; {_WHAT_TO_PASS}")
    if path.name == "huggingface" and (path.parent / _FSDP_CONFIG).is_file():
        path = path.parent  # the config and tokenizer verl saves beside the shards: the checkpoint they belong to
    if (path / _FSDP_CONFIG).is_file():
        if not _STEP_DIR.fullmatch(path.parent.name):
            raise ExportError(f"{path} holds verl shards but is not inside a global_step_N folder; {_WHAT_TO_PASS}")
        return Source("verl", path, int(_STEP_DIR.fullmatch(path.parent.name).group(1)))
    if _STEP_DIR.fullmatch(path.name) and (path / "actor").is_dir():
        return _verl_actor(path)
    if (path / "state.pt").is_file():
        return Source("local", path / "state.pt", _local_iteration(path))
    if any(path.glob("global_step_*")):
        from verl_gigpo.verl_glue.launch import POINTER, read_checkpoint_folder

        state = read_checkpoint_folder(path)
        if not state.latest:
            raise ExportError(
                f"{path} holds global_step_* folders but {path / POINTER} names none of them "
                f"({state.pointer_problem or 'missing or pointing elsewhere'}); pass <experiment>/global_step_N"
            )
        return _verl_actor(path / f"global_step_{state.latest}")
    checkpoints = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if any(checkpoints.glob("iter_*")):
        from verl_gigpo.local.run_folder import checkpoint_candidates

        candidates = checkpoint_candidates(checkpoints)
        if not candidates:
            raise ExportError(f"{checkpoints} holds no complete iter_K/state.pt; {_WHAT_TO_PASS}")
        iteration, state_path = candidates[0]
        return Source("local", state_path, iteration)
    if (path / "config.json").is_file():
        raise ExportError(
            f"{ckpt} is already a Hugging Face model folder (it has config.json): there is nothing to export; "
            "transformers, vLLM and python -m verl_gigpo.evaluate load it as it is"
        )
    raise ExportError(f"{ckpt} is not a checkpoint; {_WHAT_TO_PASS}")


def _local_iteration(folder: Path) -> int:
    tail = folder.name.rsplit("_", 1)[-1]
    return int(tail) if folder.name.startswith("iter_") and tail.isdigit() else -1


# ------------------------------------------------------------------ the full weights


def _load_quietly(path: Path) -> dict[str, Any]:
    # unpickling DTensors outside a process group makes torch warn once per file that the mesh has no group
    quiet = logging.getLogger("torch.distributed.device_mesh")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    finally:
        quiet.setLevel(level)


def fsdp_full_state_dict(actor_dir: str | Path) -> dict[str, torch.Tensor]:
    """The full state dict of a verl FSDP actor checkpoint (``global_step_N/actor``), in the precision it was saved.

    DTensors are joined from one FSDP group's shards along their ``Shard(dim)`` (verl's ``FSDPModelMerger`` rules,
    without its bfloat16 cast); plain tensors must be equal on those ranks. Names as the actor's module has them.

    Raises:
        ExportError: a missing config or shard, a mesh other than verl's, a Partial placement, differing replicas.
    """
    from torch.distributed.tensor import DTensor

    actor_dir = Path(actor_dir)
    try:
        world_size = int(json.loads((actor_dir / _FSDP_CONFIG).read_text())["world_size"])
    except (OSError, KeyError, ValueError) as exc:
        raise ExportError(f"{actor_dir / _FSDP_CONFIG} is missing or has no world_size ({exc})") from exc

    def shard_path(rank: int) -> Path:
        path = actor_dir / f"model_world_size_{world_size}_rank_{rank}.pt"
        if not path.is_file():
            raise ExportError(f"{path} is missing: the checkpoint is incomplete (world size {world_size})")
        return path

    first = _load_quietly(shard_path(0))
    pivot = next((t for t in first.values() if isinstance(t, DTensor)), None)
    ranks = [0]
    if pivot is not None:
        names = tuple(pivot.device_mesh.mesh_dim_names or ())
        if names not in (("fsdp",), ("ddp", "fsdp")):
            raise ExportError(f"{actor_dir}: device mesh {names} is not verl's FSDP mesh ('fsdp' or 'ddp','fsdp')")
        ranks = pivot.device_mesh.mesh.reshape(-1, pivot.device_mesh.mesh.shape[-1])[0].tolist()
    elif world_size > 1:
        ranks = list(range(world_size))
    shards = [first if rank == 0 else _load_quietly(shard_path(rank)) for rank in ranks]
    full = {}
    for key, tensor in first.items():
        parts = [shard[key] for shard in shards]
        if isinstance(tensor, DTensor):
            placement = tensor.placements[-1]
            local = [p.to_local() for p in parts]
            if placement.is_shard():
                full[key] = torch.cat(local, dim=placement.dim).contiguous()
            elif placement.is_replicate():
                full[key] = local[0]
            else:
                raise ExportError(f"{actor_dir}: {key} has placement {placement}; only Shard and Replicate are joined")
        else:
            if any(p.shape != tensor.shape or not torch.equal(p, tensor) for p in parts[1:]):
                raise ExportError(f"{actor_dir}: the replicated tensor {key} differs between ranks")
            full[key] = tensor
    return full


def merged_state_dict(
    state: Mapping[str, torch.Tensor], lora_config: Mapping[str, Any] | None = None
) -> tuple[dict[str, torch.Tensor], int]:
    """``(weights, layers merged)``: ``state``'s peft names made plain and each adapted weight ``W + (alpha / r) B A``
    (``lora_config``: ``r``, ``lora_alpha``). ExportError: adapter tensors without ``lora_config``."""
    from verl_gigpo.verl_glue.lora import PEFT_PREFIX, adapted_weight_name, merge_lora

    adapter = {k: v for k, v in state.items() if adapted_weight_name(k) is not None}
    base = {}
    for key, tensor in state.items():
        if key in adapter:
            continue
        name = key[len(PEFT_PREFIX) :] if key.startswith(PEFT_PREFIX) else key
        base[name.replace(".base_layer.", ".")] = tensor
    if not adapter:
        return base, 0
    if lora_config is None:
        raise ExportError(f"the checkpoint holds a LoRA adapter ({len(adapter)} tensors) but no {_LORA_META}")
    merged = merge_lora(base, adapter, lora_config)
    return {**base, **merged}, len(merged)


def _lora_config(actor_dir: Path) -> dict[str, Any] | None:
    meta = actor_dir / _LORA_META
    if not meta.is_file():
        return None
    config = json.loads(meta.read_text())
    return {"r": int(config["r"]), "lora_alpha": config["lora_alpha"]}


# ------------------------------------------------------------------ writing


def _prepare_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"--out {out} exists and is not empty; pass --overwrite to replace it, or another --out")
    out.parent.mkdir(parents=True, exist_ok=True)


class _NoTorchDtypeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "`torch_dtype` is deprecated" not in record.getMessage()


@contextlib.contextmanager
def _without_torch_dtype_warning():
    """Drop transformers' ``torch_dtype`` deprecation line, which verl's merger triggers on every export."""
    loggers = [logging.getLogger(f"transformers.{name}") for name in ("modeling_utils", "configuration_utils")]
    quiet = _NoTorchDtypeWarning()
    for log in loggers:
        log.addFilter(quiet)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(quiet)


def _write_folder(weights: dict[str, torch.Tensor], hf_config_dir: Path, target: Path, dtype: str) -> int:
    """Write ``weights`` cast to ``dtype`` through verl's model merger; returns the number of parameters."""
    from safetensors import safe_open
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    torch_dtype = DTYPES[dtype]
    for name in list(weights):  # one tensor at a time: the full-precision copy is freed as its cast is made
        if weights[name].is_floating_point():
            weights[name] = weights[name].to(torch_dtype)
    config = ModelMergerConfig(
        operation="merge", backend="fsdp", target_dir=str(target), hf_model_config_path=str(hf_config_dir)
    )
    printed = io.StringIO()  # verl's merger prints progress lines naming the staging folder
    with contextlib.redirect_stdout(printed), _without_torch_dtype_warning():
        FSDPModelMerger(config).save_hf_model_and_tokenizer(weights)
    logger.debug("verl's model merger: %s", printed.getvalue().strip())
    config_file = target / "config.json"
    saved = json.loads(config_file.read_text())
    saved.pop("torch_dtype", None)  # the older name of the key
    saved["dtype"] = dtype
    config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    num_parameters = 0  # as saved: a tied weight once
    for file in target.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            num_parameters += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return num_parameters


def export_checkpoint(
    ckpt: str | Path,
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    overwrite: bool = False,
    base_model: str | Path | None = None,
) -> ExportResult:
    """Write the checkpoint ``ckpt`` as a Hugging Face model folder at ``out`` (empty or new unless ``overwrite``).

    ``dtype``: a key of :data:`DTYPES`; ``base_model``: a local run's start folder when its recorded path has moved.

    Raises:
        ExportError: an unknown dtype, ``out`` not empty, or a checkpoint that cannot be read (naming path and fix).
    """
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: use one of {sorted(DTYPES)}")
    out = Path(out).expanduser().resolve()
    source = resolve_checkpoint(ckpt)
    _prepare_target(out, overwrite)
    lora = None
    if source.kind == "verl":
        hf_config_dir = source.path / "huggingface"
        if not (hf_config_dir / "config.json").is_file():
            raise ExportError(f"{hf_config_dir / 'config.json'} is missing: verl writes it with every checkpoint")
        lora_config = _lora_config(source.path)
        weights, layers = merged_state_dict(fsdp_full_state_dict(source.path), lora_config)
        if layers:
            lora = {**lora_config, "layers": layers}
    else:
        state = _load_quietly(source.path)
        weights, _ = merged_state_dict(state["model"])
        hf_config_dir = local_base_model(source.path, state, base_model)
    settings = _run_settings(source, state if source.kind == "local" else None)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)  # mkdtemp makes the folder private (0700); the export gets a new folder's usual mode
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    try:
        num_parameters = _write_folder(weights, hf_config_dir, staging, dtype)
        if settings is not None:
            (staging / RUN_SETTINGS).write_text(json.dumps(settings, indent=1, default=str) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("exported %s (step %d) to %s", source.path, source.step, out)
    return ExportResult(out, source, dtype, num_parameters, lora, settings["origin"] if settings else None)


def _run_settings(source: Source, state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The settings of the run that wrote ``source`` as :data:`RUN_SETTINGS` holds them; None when unknown."""
    from verl_gigpo.export.run_settings import local_run_layer, verl_run_settings

    if source.kind == "local":
        return {"origin": f"local run {source.path}", "layer": local_run_layer(state["config"]), "dropped": []}
    found = verl_run_settings(source.path.parent, source.step)
    if found is None:
        return None
    return {"origin": found.origin, "layer": found.layer, "dropped": list(found.dropped)}


def local_base_model(state_path: Path, state: Mapping[str, Any], base_model: str | Path | None) -> Path:
    """The folder a local run started from: ``base_model``, else its recorded ``actor_rollout_ref.model.path``."""
    if base_model is not None:
        candidates = [Path(base_model).expanduser()]
        given = "--base-model"
    else:
        recorded = state.get("config", {}).get("actor_rollout_ref", {}).get("model", {}).get("path")
        if not recorded:
            raise ExportError(f"{state_path} records no actor_rollout_ref.model.path; pass --base-model DIR")
        run_dir = state_path.parents[2]  # <run>/checkpoints/iter_K/state.pt
        candidates = [Path(recorded).expanduser(), run_dir / recorded]
        given = f"the checkpoint's actor_rollout_ref.model.path ({recorded})"
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    raise ExportError(
        f"{given} is not a model folder with config.json (tried {', '.join(map(str, candidates))}); pass --base-model "
        "DIR, the model folder the run started from (its config and tokenizer are copied)"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m verl_gigpo.export",
        description="Export a verl or local-engine checkpoint to a Hugging Face model folder (tokenizer included; "
        "a LoRA adapter is merged in)",
    )
    parser.add_argument(
        "ckpt",
        help="global_step_N[/actor] or the experiment folder (its latest checkpoint); or a "
        "local-engine iter_K[/state.pt], checkpoints folder or run folder",
    )
    parser.add_argument("--out", required=True, help="the Hugging Face folder to write")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="dtype of the exported weights (default bfloat16, as verl's model merger; float32 keeps "
        "the trained weights exactly)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists and is not empty")
    parser.add_argument(
        "--base-model",
        default=None,
        help="local-engine checkpoints: the model folder the run started from, when the recorded "
        "actor_rollout_ref.model.path is not there",
    )
    args = parser.parse_args(argv)
    try:
        result = export_checkpoint(
            args.ckpt, args.out, dtype=args.dtype, overwrite=args.overwrite, base_model=args.base_model
        )
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out cannot be made or written (a file on its path, no permission, a full disk)
        print(f"error: cannot write --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    kind = "verl FSDP checkpoint" if result.source.kind == "verl" else "local-engine checkpoint"
    lora = (
        f"; LoRA adapter merged (rank {result.lora['r']}, alpha {result.lora['lora_alpha']}, "
        f"{result.lora['layers']} layers)"
        if result.lora
        else ""
    )
    print(
        f"exported {result.source.path} ({kind}, step {result.source.step}{lora}) to {result.out}: "
        f"{result.num_parameters:,} parameters in {result.dtype}, tokenizer included"
    )
    if result.settings:
        print(
            f"run settings ({result.settings}) saved in {result.out / RUN_SETTINGS}: python -m verl_gigpo.evaluate "
            f"plays the folder with them"
        )
    else:
        print(
            f"no run settings found (no launch record): python -m verl_gigpo.evaluate {result.out} needs --env "
            "and the run's settings as key=value, or --settings RUN"
        )
    return 0
