"""verl's contract (``verl_gigpo.verl_glue.contract``, ``verl_gigpo.verl_glue.verl_version``), the tests to run first
on a new verl (``pytest -m verl_contract``, docs/upgrading.md): the versions the package was checked against pass, any
other fails with what to do, unless the escape hatch is set; every guard of the contract table passes on the installed
verl, and each refuses a verl symbol that is not what it was written for (real verl module objects, patched for the
test and restored by ``monkeypatch``); and the table holds every private verl name the package uses, found by the AST
rule of :func:`private_verl_uses`."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

import verl_gigpo
from verl_gigpo.verl_glue.contract import (
    CONTRACT,
    GUARDS,
    check_contract,
    check_entry,
    check_overrides,
    init_attributes,
    markdown,
)
from verl_gigpo.verl_glue.verl_version import (
    ALLOW_ENV,
    SUPPORTED_VERL_VERSIONS,
    VerlMismatchError,
    check_verl_version,
    installed_verl_version,
)

pytestmark = pytest.mark.verl_contract

PACKAGE_DIR = Path(verl_gigpo.__file__).parent

#: private verl names the AST rule finds in the package that are not verl's: this package's own attributes and methods
#: that happen to share a name with something of verl, (module, name) -> why
NOT_VERL = {
    ("verl_gigpo.rollout.transcripts", "_lock"): "TranscriptWriter's own lock",
    ("verl_gigpo.rollout.episode_log", "_lock"): "PartWriter's own lock",
    ("verl_gigpo.rollout.execution.pool", "_lock"): "EnvPool's own lock",
    ("verl_gigpo.rollout.execution.threads", "_lock"): "the thread pool's own locks",
    ("verl_gigpo.rollout.execution.threads", "_run"): "the thread pool's own method",
    ("verl_gigpo.verl_glue.quiet", "_lock"): "the warning filter's own lock",
    ("verl_gigpo.local.server", "_pending"): "LocalGenerationServer's own queue",
    ("verl_gigpo.local.update", "_rows"): "PPOActor's own method",
    ("verl_gigpo.verl_glue.cpu.hf_rollout", "_server_handle"): "also HFServerAdapter's own method (BaseRollout has "
    "none); HFReplica's assignment of verl's attribute is in the table",
}


def test_the_installed_verl_is_a_supported_one():
    assert SUPPORTED_VERL_VERSIONS == ("0.9.1",)
    assert installed_verl_version() == "0.9.1"
    assert check_verl_version(installed_verl_version()) is None


@pytest.mark.parametrize("version", ["0.10.0", "0.9.0", "0.9.1.dev0", "1.0"])
def test_another_version_is_refused_saying_what_to_do(version, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(RuntimeError) as info:
        check_verl_version(version)
    message = str(info.value)
    assert f"verl {version} is installed" in message and "verl 0.9.1 only" in message
    assert "pip install 'verl[verl-core]==0.9.1'" in message and f"{ALLOW_ENV}=1" in message


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_the_escape_hatch_lets_it_through_with_a_warning(value, monkeypatch, caplog):
    monkeypatch.setenv(ALLOW_ENV, value)
    assert check_verl_version("0.10.0") is None
    assert "verl 0.10.0 is installed" in caplog.text and "verl 0.9.1 only" in caplog.text


@pytest.mark.parametrize("value", ["0", "", "no"])
def test_the_escape_hatch_needs_a_true_value(value, monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, value)
    with pytest.raises(RuntimeError, match="verl 0.10.0 is installed"):
        check_verl_version("0.10.0")


# ------------------------------------------------------------------ what each patch or override replaces
def test_trainer_overrides_match_verl_and_a_changed_method_is_refused(monkeypatch):
    from verl.trainer.ppo.v1 import PPOTrainer, PPOTrainerSync

    from verl_gigpo.verl_glue.trainer import OVERRIDDEN, GiGPOTrainerSync

    check_overrides(GiGPOTrainerSync, PPOTrainerSync, OVERRIDDEN, use="test")  # verl 0.9.1: every one matches
    monkeypatch.setattr(PPOTrainer, "_update_actor", lambda self, batch: batch)
    with pytest.raises(VerlMismatchError, match=r"PPOTrainerSync\._update_actor.*\('self', 'batch'\)") as info:
        check_overrides(GiGPOTrainerSync, PPOTrainerSync, OVERRIDDEN, use="test")
    assert info.value.target == "PPOTrainerSync._update_actor"
    monkeypatch.delattr(PPOTrainer, "_balance_batch")
    with pytest.raises(VerlMismatchError, match=r"PPOTrainerSync\._balance_batch.*no such member"):
        check_overrides(GiGPOTrainerSync, PPOTrainerSync, ("_balance_batch",), use="test")


def test_gloo_shim_refuses_a_changed_signature(monkeypatch):
    from verl.utils import distributed

    from verl_gigpo.verl_glue.cpu.shims import gloo_process_group

    monkeypatch.setattr(distributed, "initialize_global_process_group_ray", lambda timeout_second=None: None)
    with pytest.raises(VerlMismatchError, match=r"initialize_global_process_group_ray.*\('timeout_second',\)"):
        gloo_process_group()


def test_gloo_shim_refuses_a_module_that_binds_something_else(monkeypatch):
    """verl changed an import: verl.workers.engine_workers no longer binds verl.utils.distributed's function."""
    import verl.workers.engine_workers as engine_workers
    from verl.utils import distributed

    from verl_gigpo.verl_glue.cpu.shims import gloo_process_group

    def initialize_global_process_group_ray(timeout_second=None, backend=None):  # verl's own, as before the shim
        return None

    monkeypatch.setattr(distributed, "initialize_global_process_group_ray", initialize_global_process_group_ray)
    monkeypatch.setattr(engine_workers, "initialize_global_process_group_ray", print)
    with pytest.raises(VerlMismatchError, match=r"verl\.workers\.engine_workers\.initialize_global_process_group_ray"):
        gloo_process_group()
    assert distributed.initialize_global_process_group_ray is initialize_global_process_group_ray  # nothing patched


def test_micro_batch_shim_refuses_a_rebound_or_changed_function(monkeypatch):
    from verl.utils import seqlen_balancing
    from verl.workers.engine import utils as engine_utils

    from verl_gigpo.verl_glue.cpu.shims import REARRANGE_PARAMS, length_sorted_micro_batches

    assert tuple(inspect.signature(seqlen_balancing.rearrange_micro_batches).parameters) == REARRANGE_PARAMS
    monkeypatch.setattr(engine_utils, "rearrange_micro_batches", lambda batch, max_token_len: None)
    with pytest.raises(VerlMismatchError, match=r"verl\.workers\.engine\.utils\.rearrange_micro_batches"):
        length_sorted_micro_batches()
    changed = lambda batch, max_token_len, dp_group=None: None  # noqa: E731
    monkeypatch.setattr(engine_utils, "rearrange_micro_batches", changed)
    monkeypatch.setattr(seqlen_balancing, "rearrange_micro_batches", changed)
    with pytest.raises(VerlMismatchError, match=r"rearrange_micro_batches.*\('batch', 'max_token_len', 'dp_group'\)"):
        length_sorted_micro_batches()


def test_offload_shim_refuses_another_policy_class(monkeypatch):
    from verl.workers.engine.fsdp import transformer_impl

    from verl_gigpo.verl_glue.cpu.shims import unpinned_ref_offload

    class CPUOffloadPolicy:  # not torch's, bound where verl's engine looks it up
        def __init__(self, pin_memory=True):
            self.pin_memory = pin_memory

    monkeypatch.setattr(transformer_impl, "CPUOffloadPolicy", CPUOffloadPolicy)
    with pytest.raises(VerlMismatchError, match=r"transformer_impl\.CPUOffloadPolicy"):
        unpinned_ref_offload()


def test_file_logger_patch_refuses_a_changed_logger(monkeypatch):
    from verl.utils import tracking

    from verl_gigpo.verl_glue.metrics_file import append_file_logger

    class FileLogger:  # verl's, had it changed its constructor
        def __init__(self, project_name):
            self.project_name = project_name

        def log(self, data, step):
            pass

        def finish(self):
            pass

    monkeypatch.setattr(tracking, "FileLogger", FileLogger)
    with pytest.raises(VerlMismatchError, match=r"tracking\.FileLogger.*\('self', 'project_name'\)"):
        append_file_logger()
    assert tracking.FileLogger is FileLogger


def test_every_patch_runs_the_version_guard(monkeypatch):
    from verl.utils import distributed, tracking

    from verl_gigpo.verl_glue.cpu.shims import gloo_process_group
    from verl_gigpo.verl_glue.metrics_file import append_file_logger

    monkeypatch.setattr("verl_gigpo.verl_glue.verl_version.installed_verl_version", lambda: "0.10.0")
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setattr(distributed, "initialize_global_process_group_ray", lambda timeout_second=None, backend=None: 0)
    with pytest.raises(RuntimeError, match=r"verl 0\.10\.0 is installed"):
        gloo_process_group()

    class FileLogger:
        def __init__(self, project_name, experiment_name):
            pass

    monkeypatch.setattr(tracking, "FileLogger", FileLogger)
    with pytest.raises(RuntimeError, match=r"verl 0\.10\.0 is installed"):
        append_file_logger()


def test_rollout_adapter_registration_refuses_a_changed_registry(monkeypatch):
    from verl.workers.rollout import base

    from verl_gigpo.verl_glue.cpu import register_rollout_adapter

    monkeypatch.setattr(base, "_ROLLOUT_REGISTRY", None)  # verl replaced its module-private dict
    with pytest.raises(VerlMismatchError, match=r"_ROLLOUT_REGISTRY.*None"):
        register_rollout_adapter()


# ------------------------------------------------------------------ the contract table
def _entry(symbol_end: str):
    return next(e for e in CONTRACT if e.symbol.endswith(symbol_end))


def test_every_guard_of_the_table_passes_on_the_installed_verl():
    for entry in CONTRACT:
        importlib.import_module(entry.ours)
        check_entry(entry)
    assert {e.guard for e in CONTRACT} == set(GUARDS)  # every kind of guard is used (and so tested here)
    kinds = Counter(e.kind for e in CONTRACT)
    assert set(kinds) == {"overrides", "reads", "wraps", "patches", "registers into"}, kinds


def test_the_table_prints_as_markdown_with_one_row_per_entry():
    table = markdown().splitlines()
    assert table[0] == "| verl symbol | kind | used by | why | guard |"
    assert len(table) == 2 + len(CONTRACT)
    assert "| `verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._wait_for_next_poll` | wraps |" in markdown()


def test_the_subclasses_of_verl_classes_override_what_the_table_lists():
    """Every member of verl's class (or attribute its ``__init__`` sets) that our subclass defines is a table row."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase
    from verl.trainer.ppo.v1 import PPOTrainerSync
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.workers.rollout.base import BaseRollout
    from verl.workers.rollout.replica import RolloutReplica

    from verl_gigpo.verl_glue.agent_loop import GiGPOEnvAgentLoop
    from verl_gigpo.verl_glue.cpu.hf_rollout import HFReplica, HFServerAdapter
    from verl_gigpo.verl_glue.replay_buffer import DynamicReplayBuffer
    from verl_gigpo.verl_glue.trainer import OVERRIDDEN, GiGPOTrainerSync

    pairs = (
        (GiGPOTrainerSync, PPOTrainerSync),
        (DynamicReplayBuffer, ReplayBuffer),
        (GiGPOEnvAgentLoop, AgentLoopBase),
        (HFReplica, RolloutReplica),
        (HFServerAdapter, BaseRollout),
    )
    for ours, base in pairs:
        listed = {
            e.name
            for e in CONTRACT
            if e.ours == ours.__module__ and e.kind == "overrides" and e.owner() in base.__mro__
        }
        members = (set(dir(base)) | init_attributes(base)) - {"_abc_impl"}  # _abc_impl: ABCMeta's bookkeeping
        overridden = {name for name in vars(ours) if name in members and (name == "__init__" or name[:2] != "__")}
        if ours is DynamicReplayBuffer:
            overridden.discard("__init__")  # takes verl's arguments through (*args, **kwargs), plus its own
        assert overridden == listed, (ours.__name__, sorted(overridden ^ listed))
    assert set(OVERRIDDEN) == {e.name for e in CONTRACT if e.ours == GiGPOTrainerSync.__module__} & set(
        vars(GiGPOTrainerSync)
    ) - {"trainer_mode"}


@cache
def verl_private_names() -> frozenset[str]:
    """Every underscore name (not dunder) that the installed verl defines: functions, classes, and names and
    attributes it assigns, from verl's own AST."""
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    names = set()
    for path in verl_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.id if isinstance(node, ast.Name) else node.attr)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def private_verl_uses() -> set[tuple[str, str]]:
    """``(module, name)`` for every ``from verl... import _x``, every attribute ``._x`` and every method ``_x`` a
    class defines, in the package, where ``_x`` is an underscore name of the installed verl."""
    private = verl_private_names()
    found = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
                found |= {(module, a.name) for a in node.names if a.name in private}
            elif isinstance(node, ast.Attribute) and node.attr in private:
                found.add((module, node.attr))
            elif isinstance(node, ast.ClassDef):
                found |= {
                    (module, item.name)
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in private
                }
    return found


def test_the_table_holds_every_private_verl_name_the_package_uses():
    uses = private_verl_uses()
    assert ("verl_gigpo.verl_glue.dead_actor", "_wait_for_next_poll") in uses  # the rule sees an attribute
    assert ("verl_gigpo.plugin", "_agent_loop_registry") in uses  # an import
    assert ("verl_gigpo.verl_glue.replay_buffer", "_dapo_filtered_keys") in uses  # a method override
    listed = {(e.ours, e.name) for e in CONTRACT}
    missing = sorted(use for use in uses if use not in listed and use not in NOT_VERL)
    assert not missing, f"private verl names used but not in verl_gigpo/verl_glue/contract.py's CONTRACT: {missing}"
    stale = sorted(set(NOT_VERL) - uses)
    assert not stale, f"NOT_VERL entries the rule no longer finds: {stale}"


# ------------------------------------------------------------------ each kind of guard refuses a changed verl
def test_a_class_member_or_a_missing_instance_attribute_is_refused(monkeypatch):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    check_contract("verl_gigpo.verl_glue.replay_buffer", "._dapo_classification_cache")
    monkeypatch.setattr(ReplayBuffer, "_dapo_classification_cache", {}, raising=False)
    with pytest.raises(VerlMismatchError, match=r"ReplayBuffer\._dapo_classification_cache.*a class member"):
        check_contract("verl_gigpo.verl_glue.replay_buffer", "._dapo_classification_cache")
    monkeypatch.setattr(ReplayBuffer, "__init__", lambda self, refill_fn=None: None)
    with pytest.raises(VerlMismatchError, match=r"ReplayBuffer\.refill_fn.*not assigned in __init__"):
        check_contract("verl_gigpo.verl_glue.replay_buffer", ".refill_fn")


def test_a_trainer_mode_class_member_is_refused(monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    monkeypatch.setattr(PPOTrainer, "trainer_mode", "sync", raising=False)
    with pytest.raises(VerlMismatchError, match=r"PPOTrainer\.trainer_mode.*a class member"):
        check_entry(_entry("PPOTrainer.trainer_mode"))


def test_a_poll_the_wrap_would_not_see_is_refused(monkeypatch):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from verl_gigpo.verl_glue.dead_actor import ActorWatch, guard_replay_buffer

    def sample(self, global_steps, partition_id, batch_size):  # polls some other way
        return None

    monkeypatch.setattr(ReplayBuffer, "sample", sample)
    with pytest.raises(VerlMismatchError, match=r"_wait_for_next_poll.*a method sample calls"):
        guard_replay_buffer(object.__new__(ReplayBuffer), ActorWatch(list))


def test_a_replaced_registry_is_refused(monkeypatch):
    from verl.experimental.agent_loop import agent_loop
    from verl.workers.engine.base import EngineRegistry

    from verl_gigpo.plugin import ensure_registered
    from verl_gigpo.verl_glue.cpu import register_cpu_engines

    monkeypatch.setattr(EngineRegistry, "_engines", None)
    with pytest.raises(VerlMismatchError, match=r"EngineRegistry\._engines.*None"):
        register_cpu_engines()
    monkeypatch.setattr(agent_loop, "_agent_loop_registry", None)
    with pytest.raises(RuntimeError, match=r"_agent_loop_registry.*None"):
        ensure_registered()


def test_a_changed_override_of_the_buffer_is_refused(monkeypatch):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    monkeypatch.setattr(ReplayBuffer, "_select_prompt_uids", lambda self, partition_id, batch_size: None)
    with pytest.raises(VerlMismatchError, match=r"_select_prompt_uids.*\('self', 'partition_id', 'batch_size'\)"):
        check_contract("verl_gigpo.verl_glue.replay_buffer", "._select_prompt_uids")


def test_a_checkpoint_pointer_renamed_by_verl_is_refused(monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def _save_checkpoint(self):
        return "latest.txt"

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", _save_checkpoint)
    with pytest.raises(VerlMismatchError, match=r"_save_checkpoint.*latest_checkpointed_iteration\.txt"):
        check_entry(_entry("PPOTrainer._save_checkpoint"))


def test_a_verl_loss_reading_a_field_the_local_engine_does_not_pass_is_refused(monkeypatch):
    from verl.trainer.ppo import core_algos

    from verl_gigpo.local.update import _LossConfig

    def compute_policy_loss_new(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
        return config.get("tau_pos", 1.0)

    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "new", compute_policy_loss_new)
    with pytest.raises(VerlMismatchError, match=r"verl policy loss 'new'.*\['tau_pos'\]"):
        check_entry(_entry(":ActorConfig"))
    config = _LossConfig(0.2, 0.2, 0.28, 3.0, "token-mean", {})
    assert config.get("clip_ratio_high") == 0.28
    with pytest.raises(KeyError, match=r"actor\.tau_pos, which the local engine does not pass"):
        compute_policy_loss_new(None, None, None, None, "token-mean", config)
