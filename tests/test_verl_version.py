"""The guards of verl_gigpo's patches and overrides of verl internals (``verl_gigpo.verl_glue.verl_version``): the
versions they were checked against pass, any other fails with what to do, unless the escape hatch is set; and each patch
or override refuses, when installed, a verl symbol that is not what it was written for (real verl module objects,
patched for the test and restored by ``monkeypatch``)."""

from __future__ import annotations

import inspect

import pytest

from verl_gigpo.verl_glue.verl_version import (
    ALLOW_ENV,
    SUPPORTED_VERL_VERSIONS,
    VerlMismatchError,
    check_overrides,
    check_verl_version,
    installed_verl_version,
)


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
