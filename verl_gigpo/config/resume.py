"""Which config keys may change when a run is resumed: one rule and one checker for both engines.

    changes = VERL_RESUME.check(saved, current, allow=False, resuming=f"{folder} from step 2", ...)
    changes = LOCAL_RESUME.check(saved, current, allow=False, resuming=str(checkpoint), defaults=defaults, ...)

A key may differ from the checkpointed run's only when the engine's allow-list names it (each entry with its
reason); any other difference stops the resume unless ``trainer.allow_config_change=true``. Why an allow-list:
docs/runs.md#resuming. Entries: ``a.b`` a key; ``a.`` a section; ``*.b`` key ``b`` in any section; ``*.b.`` any
section ``b``. :data:`LORA_ADAPTER_KEYS` are not compared when the saved run had no adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ABSENT",
    "COMMON_RESUMABLE",
    "LOCAL_RESUME",
    "LOCAL_RESUMABLE",
    "LORA_ADAPTER_KEYS",
    "LR_KEY",
    "POINTER",
    "ResumePolicy",
    "ResumeRefused",
    "VERL_RESUME",
    "VERL_RESUMABLE",
    "describe",
    "flatten_config",
]

#: verl's pointer to the last complete checkpoint (written by ``PPOTrainer._save_checkpoint``); the local engine's
#: ``checkpoints/`` folder uses the same name (:func:`verl_gigpo.local.run_folder.write_latest`)
POINTER = "latest_checkpointed_iteration.txt"

#: how a key present in only one of the two configs shows its missing value
ABSENT = "(absent)"

#: the learning rate: the local engine sets the config's value in the restored optimizer; verl restores the
#: checkpoint's optimizer and lr-scheduler state (``FSDPCheckpointManager.load_checkpoint``), so there a new lr does
#: not simply apply and the key may not change
LR_KEY = "actor_rollout_ref.actor.optim.lr"

#: The LoRA adapter's settings, which a run without an adapter (``lora_rank`` 0) does not use.
LORA_ADAPTER_KEYS = ("actor_rollout_ref.model.lora_alpha", "actor_rollout_ref.model.target_modules")

_RUN = "how long the run goes and how often it validates, saves and logs"
_FOLDER = "the run folder and how it is resumed"
_SPEED = "where and how fast the same computation runs (memory, parallelism, batching of the same rows)"
_ENV_EXEC = "where and under which deadlines the same episodes run (docs/environments-execution.md)"

COMMON_RESUMABLE: dict[str, str] = {
    "trainer.total_training_steps": _RUN,
    "trainer.test_freq": _RUN,
    "trainer.save_freq": _RUN,
    "trainer.default_local_dir": _FOLDER,
    "trainer.allow_config_change": _FOLDER,
    "trainer.credit_log_freq": "the credit records (logging only)",
    "trainer.credit_log_groups": "the credit records (logging only)",
    "trainer.credit_log_max_chars": "the credit records (logging only)",
    "trainer.log_episodes": "the episode table (logging only)",
    "trainer.log_episodes_train_freq": "the episode table (logging only)",
    "trainer.log_episodes_max_chars": "the episode table (logging only)",
    "trainer.health.": "the training-health alarms (what they check and do; the run's computation is the same)",
    "env.num_workers": _ENV_EXEC,
    "env.step_timeout_s": _ENV_EXEC,
    "env.reset_timeout_s": _ENV_EXEC,
    "env.transcript_dir": "evaluation transcripts (logging only)",
}
"""Keys both engines' configs have that may change on resume, with the reason."""

VERL_RESUMABLE: dict[str, str] = {
    **COMMON_RESUMABLE,
    "trainer.total_epochs": _RUN,
    "trainer.val_before_train": _RUN,
    "trainer.val_only": _RUN,
    "trainer.log_val_generations": _RUN,
    "trainer.logger": _RUN,
    "trainer.project_name": _RUN,
    "trainer.experiment_name": _FOLDER,
    "trainer.resume_mode": _FOLDER,
    "trainer.resume_from_path": _FOLDER,
    "trainer.default_hdfs_dir": _FOLDER,
    "trainer.del_local_ckpt_after_load": _FOLDER,
    "trainer.max_actor_ckpt_to_keep": _FOLDER,
    "trainer.max_critic_ckpt_to_keep": _FOLDER,
    "trainer.rollout_data_dir": _RUN,
    "trainer.validation_data_dir": _RUN,
    "*.n_gpus_per_node": "the ranks, here and in verl's copies of it (a checkpoint of another world size is "
    "refused on its own: verl_gigpo.verl_glue.launch.world_size_problem)",
    "*.nnodes": "the ranks (as n_gpus_per_node)",
    "trainer.device": _SPEED,
    "trainer.ray_wait_register_center_timeout": _SPEED,
    "trainer.esi_redundant_time": _SPEED,
    "ray_kwargs.": "how Ray is started (the metrics file's path is passed there, docs/runs.md)",
    "global_profiler.": "profiling",
    "*.profiler.": "profiling",
    "data.val_files": "the validation tasks (validation only)",
    "data.val_batch_size": "validation only",
    "data.val_max_samples": "validation only",
    "data.validation_shuffle": "validation only",
    "data.dataloader_num_workers": _SPEED,
    "data.filter_overlong_prompts_workers": _SPEED,
    "data.use_shm": _SPEED,
    "actor_rollout_ref.rollout.val_kwargs.": "the sampling of validation episodes (validation only)",
    "actor_rollout_ref.rollout.agent.num_workers": _SPEED,
    "actor_rollout_ref.nccl_timeout": _SPEED,
    "*.ppo_micro_batch_size": _SPEED,
    "*.ppo_micro_batch_size_per_gpu": _SPEED,
    "*.log_prob_micro_batch_size": _SPEED,
    "*.log_prob_micro_batch_size_per_gpu": _SPEED,
    "*.forward_micro_batch_size": _SPEED,
    "*.forward_micro_batch_size_per_gpu": _SPEED,
    "*.use_dynamic_bsz": _SPEED,
    "*.log_prob_use_dynamic_bsz": _SPEED,
    "*.ppo_max_token_len_per_gpu": _SPEED,
    "*.log_prob_max_token_len_per_gpu": _SPEED,
    "*.forward_max_token_len_per_gpu": _SPEED,
    "*.ulysses_sequence_parallel_size": _SPEED,
    "*.gpu_memory_utilization": _SPEED,
    "*.tensor_model_parallel_size": _SPEED,
    "*.max_num_batched_tokens": _SPEED,
    "*.max_num_seqs": _SPEED,
    "*.enforce_eager": _SPEED,
    "*.free_cache_engine": _SPEED,
    "*.enable_chunked_prefill": _SPEED,
    "*.param_offload": _SPEED,
    "*.optimizer_offload": _SPEED,
    "*.offload_policy": _SPEED,
    "*.enable_gradient_checkpointing": _SPEED,
    "*.use_remove_padding": _SPEED,
}
"""The keys of a verl launch (``verl_gigpo/config/gigpo_trainer.yaml`` and verl's config under it) that may change
on resume, with the reason."""

LOCAL_RESUMABLE: dict[str, str] = {
    **COMMON_RESUMABLE,
    "trainer.total_training_episodes": _RUN,
    "trainer.resume": _FOLDER,
    "trainer.overwrite": _FOLDER,
    "trainer.logger": _RUN,
    "trainer.project_name": _RUN,
    "trainer.experiment_name": _RUN,
    "local.progress": _RUN,
    "local.plot": _RUN,
    "local.num_threads": _SPEED,
    "local.env_workers": _ENV_EXEC,
    LR_KEY: "set in the restored optimizer (verl_gigpo.local.checkpoint.set_learning_rate), with a warning",
}
"""The keys of a local-engine run (``verl_gigpo/config/local_trainer.yaml``) that may change on resume."""


class ResumeRefused(ValueError):
    """The config differs from the checkpointed run's in a key that may not change on resume (one-line message)."""


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": {}}`` -> ``{"a.b": 1}``: the dotted key of every leaf (an empty mapping adds none)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


def _matches(entry: str, key: str) -> bool:
    """Whether the dotted ``key`` is covered by the list entry ``entry`` (syntax in the module docstring)."""
    if entry.startswith("*."):
        tail = entry[2:]
        if tail.endswith("."):
            return key.startswith(tail) or f".{tail}" in key
        return key == tail or key.endswith(f".{tail}")
    if entry.endswith("."):
        return key.startswith(entry)
    return key == entry


@dataclass(frozen=True)
class ResumePolicy:
    """One engine's allow-list ``resumable`` (``{entry: reason}``); ``flag`` allows other changes."""

    resumable: Mapping[str, str]
    flag: str

    def may_change(self, key: str) -> bool:
        """Whether an entry of :attr:`resumable` covers the dotted ``key``."""
        return any(_matches(entry, key) for entry in self.resumable)

    def changes(
        self, saved: Mapping[str, Any], current: Mapping[str, Any], *, defaults: Mapping[str, Any] | None = None
    ) -> dict[str, tuple[Any, Any]]:
        """``{dotted key: (saved, current)}`` of every differing key (:data:`ABSENT` where missing); a key missing
        from ``saved`` at its ``defaults`` value is unchanged."""
        old, new = flatten_config(saved), flatten_config(current)
        flat_defaults = flatten_config(defaults or {})
        unused = set(LORA_ADAPTER_KEYS) if not old.get("actor_rollout_ref.model.lora_rank") else set()
        changed = {}
        for key in sorted(set(old) | set(new)):
            before, after = old.get(key, ABSENT), new.get(key, ABSENT)
            if key in unused or before == after:
                continue
            if key not in old and key in flat_defaults and after == flat_defaults[key]:
                continue
            changed[key] = (before, after)
        return changed

    def check(
        self,
        saved: Mapping[str, Any],
        current: Mapping[str, Any],
        *,
        allow: bool,
        resuming: str,
        source: str,
        start_over: str,
        defaults: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
        """Compare ``saved`` with ``current``: ``(may_change, refused)``, each ``{key: (saved, current)}``.

        Raises ResumeRefused (one line naming every refused key) unless ``allow``; ``resuming``, ``source`` and
        ``start_over`` word the message.
        """
        changed = self.changes(saved, current, defaults=defaults)
        refused = {k: v for k, v in changed.items() if not self.may_change(k)}
        if refused and not allow:
            raise ResumeRefused(
                f"cannot resume {resuming}: this launch differs from the run that wrote the checkpoint ({source}) in "
                f"key(s) that change training: {describe(refused)}. Keep the run's values, {start_over}, or pass "
                f"{self.flag} to resume anyway (docs/runs.md#resuming lists the keys that may change)"
            )
        return {k: v for k, v in changed.items() if k not in refused}, refused


def describe(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """``key: saved -> current; ...`` of ``changes`` (one line)."""
    return "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())


VERL_RESUME = ResumePolicy(VERL_RESUMABLE, "trainer.allow_config_change=true")
"""The rule for ``python -m verl_gigpo.main`` (:func:`verl_gigpo.verl_glue.launch.prepare_launch`)."""

LOCAL_RESUME = ResumePolicy(LOCAL_RESUMABLE, "--allow-config-change (trainer.allow_config_change=true)")
"""The rule for the local engine (:func:`verl_gigpo.local.checkpoint.read_checkpoint`)."""
