"""CPU tests of what a launch does with its run folder, without starting verl's pipeline (docs/runs.md):

* verl's metrics file survives resumed launches: the real ``verl.utils.tracking.Tracking`` appends under
  ``python -m verl_gigpo.main`` (the plug-in's shim) and truncates otherwise (verl's own behaviour); the rows of the
  iterations a resumed launch trains again are moved aside; iterations checkpointed but never logged are reported;
* partial checkpoints (a ``global_step_K`` newer than verl's pointer) are named and moved aside;
* a launch that resumes says so, and stops when a key that changes training differs from the checkpointed run's;
* preflight checks the model, data and environment paths and names every key as the user typed it;
* a group size of 1 gets a true warning on both engines;
* the local engine reports an unwritable run folder or metrics file in one line, with no traceback;
* the recipes log to the console and verl's file logger by default.

Checkpoint folders are built by hand with verl's layout (verl/trainer/ppo/v1/trainer_base.py:948-1025); configs are
composed by Hydra from the real ``verl_gigpo/config/gigpo_trainer.yaml``. The end-to-end run (a launch killed after its
step-2 checkpoint, a refused config change, the resume) is ``tests/test_e2e_verl_cpu.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------- helpers
@pytest.fixture
def files(tmp_path):
    """A model folder (config.json) and task files that exist: the overrides that make preflight's path checks pass."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for split in ("train", "val"):
        (tmp_path / f"{split}.parquet").write_bytes(b"")
    return {
        "actor_rollout_ref.model.path": str(tmp_path / "model"),
        "data.train_files": str(tmp_path / "train.parquet"),
        "data.val_files": str(tmp_path / "val.parquet"),
    }


def compose_gigpo(overrides: list[str], files: dict[str, str] | None = None):
    """Compose verl_gigpo/config/gigpo_trainer.yaml with ``files`` (keys the overrides do not set) and overrides."""
    given = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    paths = [f"{k}={v}" for k, v in (files or {}).items() if k not in given]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=[*paths, *overrides])


def verl_line(step: int, **data) -> str:
    """One line as verl's FileLogger writes it."""
    return json.dumps({"step": step, "data": data}) + "\n"


def train_line(step: int) -> str:
    """A training iteration's line (verl logs training/global_step with every iteration)."""
    return verl_line(step, **{"training/global_step": step, "actor/pg_loss": 0.1 * step})


def checkpoint(folder: Path, step: int, *, pointer: bool = True) -> None:
    """A checkpoint of ``step`` in verl's layout; ``pointer`` then points latest_checkpointed_iteration.txt at it."""
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    # the composed config's ranks: trainer.nnodes 1 x trainer.n_gpus_per_node 8 (verl's default)
    (folder / f"global_step_{step}" / "actor" / "model_world_size_8_rank_0.pt").write_bytes(b"weights")
    (folder / f"global_step_{step}" / "data.pt").write_bytes(b"dataloader")
    if pointer:
        (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def run_config(folder: Path, files: dict[str, str], *extra: str):
    """A composed launch config whose experiment folder is ``folder``, with the file logger on."""
    return compose_gigpo([f"trainer.default_local_dir={folder}", "trainer.logger=[console,file]", *extra], files)


# ---------------------------------------------------------------------------------------------- metrics (21.2, 17.6)
def _log_one_launch(path: Path, step: int) -> None:
    from verl.utils.tracking import Tracking

    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    tracking.log(data={"training/global_step": step}, step=step)
    tracking.finish()


def test_verls_file_logger_appends_in_a_verl_gigpo_launch_and_truncates_otherwise(tmp_path, monkeypatch):
    import verl_gigpo.plugin  # noqa: F401 - what `import verl` loads in every process of a run: its post-import hooks

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    monkeypatch.setenv("GIGPO_METRICS_APPEND", "1")  # what python -m verl_gigpo.main sets for its launch
    _log_one_launch(path, 1)
    _log_one_launch(path, 2)  # a second launch (a resume) continues the file
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    monkeypatch.delenv("GIGPO_METRICS_APPEND")  # any other verl launch: verl's own behaviour ("wb")
    _log_one_launch(path, 3)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [3]


def test_a_resumed_launch_keeps_the_rows_up_to_its_checkpoint_and_moves_the_rest_aside(tmp_path):
    from verl_gigpo.verl_glue.metrics_file import prepare_metrics_file, superseded_path

    path = tmp_path / "metrics.jsonl"
    val0 = verl_line(0, **{"val-core/gridnav/acc/mean@1": 0.25})
    path.write_text(val0 + train_line(1) + train_line(2) + train_line(3) + '{"step": 4, "da')  # killed mid-write
    report = prepare_metrics_file(path, resume_step=2)
    assert path.read_text() == val0 + train_line(1) + train_line(2)
    assert superseded_path(path).read_text() == train_line(3) + '{"step": 4, "da\n'
    assert (report.kept, report.superseded_steps, report.unreadable, report.missing) == (3, [3], 1, [])
    [line] = report.messages(2)
    assert line == (
        f"metrics: moved 1 row(s) of step(s) 3 and 1 unreadable line(s) (logged after the checkpoint of step 2; this "
        f"launch trains those iterations again) to {superseded_path(path)}"
    )


def test_an_iteration_checkpointed_but_never_logged_is_reported_missing(tmp_path):
    from verl_gigpo.verl_glue.metrics_file import format_steps, iteration_gaps, prepare_metrics_file, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text(verl_line(0, v=1.0) + train_line(1) + train_line(3))  # 2 was checkpointed, its line never written
    report = prepare_metrics_file(path, resume_step=4)
    assert report.missing == [2, 4]
    assert report.messages(4) == [
        f"metrics: iteration(s) 2, 4 of the checkpointed run have no row in {path}: the launch that trained them "
        "stopped before verl logged them (or logged without trainer.logger=file); their metrics are missing"
    ]
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [0, 1, 3]
    path.write_text(path.read_text() + train_line(3))
    assert iteration_gaps(read_metrics(path)) == ([2], [3])  # what the readers (smoke test, benchmark) report
    assert format_steps([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"


def test_a_fresh_start_moves_an_earlier_runs_rows_aside(tmp_path):
    from verl_gigpo.verl_glue.metrics_file import prepare_metrics_file, superseded_path

    path = tmp_path / "metrics.jsonl"
    path.write_text(verl_line(0, v=1.0) + train_line(1))
    report = prepare_metrics_file(path, resume_step=0)
    assert path.read_text() == "" and superseded_path(path).read_text() == verl_line(0, v=1.0) + train_line(1)
    [line] = report.messages(0)
    assert line.endswith(f"(of an earlier launch; this launch starts from scratch) to {superseded_path(path)}")


def test_the_metrics_file_lives_in_the_experiment_folder_and_reaches_every_ray_process(tmp_path, files):
    from verl_gigpo.verl_glue.launch import prepare_launch

    folder = tmp_path / "exp"
    cfg = run_config(folder, files)
    environ: dict[str, str] = {}
    plan = prepare_launch(cfg, environ=environ)
    path = folder / "metrics.jsonl"
    assert plan.metrics == path and environ == {"VERL_FILE_LOGGER_PATH": str(path), "GIGPO_METRICS_APPEND": "1"}
    assert dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars) == environ  # Ray processes on every node
    assert plan.messages == [f"metrics: {path} (one JSON line per logged step, kept across launches; docs/runs.md)"]
    record = json.loads(plan.record.read_text())
    assert record["resume_step"] == 0 and record["config"]["trainer"]["default_local_dir"] == str(folder)
    cfg = run_config(folder, files, "trainer.logger=[console]")
    assert prepare_launch(cfg, environ={}).metrics is None  # no file logger, no file


def test_an_explicit_verl_file_logger_path_wins(tmp_path, files):
    from verl_gigpo.verl_glue.metrics_file import metrics_path

    cfg = run_config(tmp_path / "exp", files)
    assert metrics_path(cfg, {"VERL_FILE_LOGGER_PATH": str(tmp_path / "m.jsonl")}) == tmp_path / "m.jsonl"
    root = {"VERL_FILE_LOGGER_ROOT": str(tmp_path / "logs")}
    assert (
        metrics_path(cfg, root) == tmp_path / "logs" / cfg.trainer.project_name / f"{cfg.trainer.experiment_name}.jsonl"
    )


# ------------------------------------------------------------------------------------------ partial checkpoints (21.3)
def test_a_checkpoint_newer_than_verls_pointer_is_named_and_moved_aside(tmp_path, files):
    from verl_gigpo.verl_glue.launch import prepare_launch

    folder = tmp_path / "exp"
    checkpoint(folder, 1)
    checkpoint(folder, 2, pointer=False)  # killed while saving step 2: the pointer still names 1
    plan = prepare_launch(run_config(folder, files), environ={})
    assert plan.resume_step == 1
    assert plan.messages[0] == (
        f"checkpoint {folder / 'global_step_2'} is newer than latest_checkpointed_iteration.txt (step 1): a save that "
        f"did not finish; moved to {folder / 'global_step_2.partial'}"
    )
    assert (folder / "global_step_2.partial" / "data.pt").is_file() and not (folder / "global_step_2").exists()
    assert (folder / "global_step_1").is_dir()


def test_without_a_pointer_every_checkpoint_folder_is_partial(tmp_path, files):
    from verl_gigpo.verl_glue.launch import prepare_launch, read_checkpoint_folder

    folder = tmp_path / "exp"
    checkpoint(folder, 1, pointer=False)  # killed during the first save
    (folder / "global_step_1.partial").mkdir()  # an earlier one already set aside
    assert read_checkpoint_folder(folder).partial == [1]
    plan = prepare_launch(run_config(folder, files), environ={})
    assert plan.resume_step == 0 and (folder / "global_step_1.partial2").is_dir()
    assert "(step none): a save that did not finish; moved to" in plan.messages[0]


# ------------------------------------------------------------------------------------------- no silent resume (17.7)
def _checkpointed_run(folder: Path, files: dict[str, str], *settings: str):
    """A run launched with ``settings`` (its launch record) that saved checkpoints 1 and 2."""
    from verl_gigpo.verl_glue.launch import prepare_launch

    prepare_launch(run_config(folder, files, *settings), environ={})
    checkpoint(folder, 1)
    checkpoint(folder, 2)


def test_a_launch_that_resumes_says_from_where_and_how_to_start_over(tmp_path, files):
    from verl_gigpo.verl_glue.launch import prepare_launch

    folder = tmp_path / "exp"
    _checkpointed_run(folder, files)
    (folder / "metrics.jsonl").write_text(train_line(1) + train_line(2) + train_line(3))
    cfg = run_config(folder, files, "trainer.total_training_steps=10", "trainer.test_freq=2")  # may change
    plan = prepare_launch(cfg, environ={})
    assert plan.resume_step == 2
    assert plan.messages[0] == (
        f"resuming experiment 'gsm8k' from {folder / 'global_step_2'} (trainer.resume_mode=auto): the next iteration "
        f"is 3. To start over instead, delete {folder} or choose another trainer.experiment_name (EXPERIMENT=... in "
        "the recipes)"
    )
    assert plan.messages[1].startswith("metrics: moved 1 row(s) of step(s) 3 (logged after the checkpoint of step 2")
    assert json.loads(plan.record.read_text())["resume_step"] == 2


@pytest.mark.parametrize(
    ("override", "key", "before", "after"),
    [
        ("actor_rollout_ref.actor.optim.lr=2e-6", "actor_rollout_ref.actor.optim.lr", 1e-6, 2e-6),
        ("actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n", 1, 4),
        ("+env.kwargs.dim_room=[7,7]", "env.kwargs.dim_room", "(absent)", [7, 7]),
    ],
)
def test_a_changed_training_key_stops_the_resume_unless_allowed(tmp_path, files, override, key, before, after):
    from verl_gigpo.verl_glue.launch import LaunchError, prepare_launch

    folder = tmp_path / "exp"
    _checkpointed_run(folder, files)
    with pytest.raises(LaunchError) as info:
        prepare_launch(run_config(folder, files, override), environ={})
    message = str(info.value)
    assert message.startswith(f"cannot resume {folder} from step 2: this launch differs from the run that wrote the ")
    assert f"{key}: {before!r} -> {after!r}" in message.split("in key(s) that change training: ")[1]
    assert "pass trainer.allow_config_change=true to resume anyway" in message
    assert len(list((folder / "launches").iterdir())) == 1  # the refused launch left no record
    plan = prepare_launch(run_config(folder, files, override, "trainer.allow_config_change=true"), environ={})
    allowed = "resuming with changed training settings (trainer.allow_config_change=true): "
    assert any(m.startswith(allowed) and f"{key}: " in m for m in plan.messages), plan.messages


def test_the_saved_config_of_a_checkpoint_is_that_of_the_launch_that_wrote_it(tmp_path, files):
    """lr changed (allowed) at the resume from step 2, which then saved 3: resuming from 3 compares with that launch."""
    from verl_gigpo.verl_glue.launch import LaunchError, prepare_launch, saved_launch_config

    folder = tmp_path / "exp"
    _checkpointed_run(folder, files)
    prepare_launch(
        run_config(folder, files, "actor_rollout_ref.actor.optim.lr=2e-6", "trainer.allow_config_change=true"),
        environ={},
    )
    checkpoint(folder, 3)
    _, record = saved_launch_config(folder, 3)
    assert record["launch"] == 2 and record["config"]["actor_rollout_ref"]["actor"]["optim"]["lr"] == 2e-6
    assert saved_launch_config(folder, 2)[1]["launch"] == 1
    prepare_launch(run_config(folder, files, "actor_rollout_ref.actor.optim.lr=2e-6"), environ={})  # as launch 2
    with pytest.raises(LaunchError, match=r"actor_rollout_ref.actor.optim.lr: 2e-06 -> 1e-06"):
        prepare_launch(run_config(folder, files), environ={})


def test_checkpoints_without_a_launch_record_are_resumed_with_a_note(tmp_path, files):
    from verl_gigpo.verl_glue.launch import prepare_launch

    folder = tmp_path / "exp"
    checkpoint(folder, 3)  # e.g. launched with python -m verl.trainer.main_ppo
    plan = prepare_launch(run_config(folder, files), environ={})
    assert plan.resume_step == 3
    assert plan.messages[1].startswith(f"no launch record in {folder / 'launches'} for checkpoint 3")


def test_resume_modes_disable_and_resume_path_and_an_unreadable_pointer(tmp_path, files):
    from verl_gigpo.verl_glue.launch import LaunchError, prepare_launch

    folder = tmp_path / "exp"
    _checkpointed_run(folder, files, "actor_rollout_ref.rollout.n=2")
    plan = prepare_launch(run_config(folder, files, "trainer.resume_mode=disable"), environ={})
    assert plan.resume_step == 0 and "trainer.resume_mode=disable: starting from scratch" in plan.messages[0]
    path = f"trainer.resume_from_path={folder / 'global_step_1'}"
    with pytest.raises(
        LaunchError, match="actor_rollout_ref.rollout.n: 2 -> 1"
    ):  # compared with the launch that saved 1
        prepare_launch(run_config(folder, files, "trainer.resume_mode=resume_path", path), environ={})
    plan = prepare_launch(
        run_config(folder, files, "trainer.resume_mode=resume_path", path, "actor_rollout_ref.rollout.n=2"), environ={}
    )
    assert plan.resume_step == 1
    with pytest.raises(LaunchError, match="trainer.resume_mode=resume_path needs trainer.resume_from_path"):
        prepare_launch(run_config(folder, files, "trainer.resume_mode=resume_path"), environ={})
    (folder / "latest_checkpointed_iteration.txt").write_text("2\x00")
    with pytest.raises(LaunchError, match="latest_checkpointed_iteration.txt holds '2\\\\x00', not a step number"):
        prepare_launch(run_config(folder, files), environ={})


def test_the_resume_rule_lets_listed_keys_change_and_refuses_every_other_key():
    """An allow-list: run length, logging, ranks and speed settings may change; training keys and keys nobody
    listed (a new verl or plug-in option, a section switched on) may not."""
    from verl_gigpo.config.resume import LOCAL_RESUME, VERL_RESUME

    for key in (
        "algorithm.adv_estimator",
        "algorithm.gigpo.key_mode",
        "env.max_steps",
        "env.kwargs.data_path",
        "actor_rollout_ref.model.path",
        "actor_rollout_ref.actor.optim.lr",  # verl restores the checkpoint's optimizer state
        "actor_rollout_ref.rollout.n",
        "trainer.v1.gigpo_sync.mini_batch_rows",
        "data.train_batch_size",
        "actor_rollout_ref.actor.an_option_of_a_later_verl",  # unknown: refused, never silently let through
        "distillation.enabled",
        "actor_rollout_ref.model.path_extra",  # an entry covers its key, not a key that starts with it
    ):
        assert not VERL_RESUME.may_change(key), key
    for key in (
        "trainer.total_training_steps",
        "trainer.save_freq",
        "trainer.logger",
        "trainer.n_gpus_per_node",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.val_kwargs.temperature",
        "actor_rollout_ref.actor.profiler.enable",
        "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH",
        "env.step_timeout_s",
        "env.reset_timeout_s",
        "env.num_workers",
    ):
        assert VERL_RESUME.may_change(key), key
    assert LOCAL_RESUME.may_change("actor_rollout_ref.actor.optim.lr")  # set in the restored optimizer there
    assert not LOCAL_RESUME.may_change("env.name") and not LOCAL_RESUME.may_change("local.a_new_option")


def test_docs_list_every_key_that_may_change_on_resume():
    from verl_gigpo.config.resume import LOCAL_RESUMABLE, VERL_RESUMABLE

    text = (ROOT / "docs" / "runs.md").read_text()
    for entry in {**VERL_RESUMABLE, **LOCAL_RESUMABLE}:
        shown = f"`{entry}*`" if entry.endswith(".") else f"`{entry}`"
        assert shown in text, entry


def test_an_empty_mapping_holds_no_setting_on_both_engines_resume_checks(files):
    """``env.kwargs: {}`` (the default of both configs) then ``+env.kwargs.dim_room=[7,7]`` is a change of
    ``env.kwargs.dim_room`` alone on verl's path and the local engine's: one flattening, where an empty mapping adds
    no key (so no ``env.kwargs: {} -> None`` beside the real change)."""
    from omegaconf import OmegaConf

    from verl_gigpo.config.resume import LOCAL_RESUME, VERL_RESUME, ResumeRefused, flatten_config
    from verl_gigpo.local.config import DEFAULT_CONFIG, load_config

    assert flatten_config({"a": {"b": 1, "c": {}}, "d": [1, {}], "e": {}}) == {"a.b": 1, "d": [1, {}]}
    assert VERL_RESUME.changes(
        OmegaConf.to_container(compose_gigpo([], files)),
        OmegaConf.to_container(compose_gigpo(["+env.kwargs.dim_room=[7,7]"], files)),
    ) == {"env.kwargs.dim_room": ("(absent)", [7, 7])}
    defaults = OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG), resolve=True)
    assert defaults["env"]["kwargs"] == {}
    current = OmegaConf.to_container(load_config(["env.kwargs.dim_room=[7,7]"]), resolve=True)
    where = {"resuming": "run", "source": "state.pt", "start_over": "start over", "defaults": defaults}
    with pytest.raises(ResumeRefused, match=r"env\.kwargs\.dim_room: '\(absent\)' -> \[7, 7\]") as info:
        LOCAL_RESUME.check(defaults, current, allow=False, **where)
    assert "env.kwargs:" not in str(info.value)
    assert LOCAL_RESUME.check(defaults, current, allow=True, **where) == (
        {},
        {"env.kwargs.dim_room": ("(absent)", [7, 7])},
    )


# ---------------------------------------------------------------------------------------- preflight: paths (21.5)
def _problems(overrides: list[str], files: dict[str, str] | None = None) -> list[str]:
    """Every problem preflight reports: the keys' and the paths'."""
    from verl_gigpo.verl_glue.preflight import GiGPOConfigError, preflight

    try:
        preflight(compose_gigpo(overrides, files))
    except GiGPOConfigError as exc:
        return exc.problems
    return []


def test_a_missing_model_folder_is_rejected_naming_the_key(tmp_path, files):
    [problem] = _problems([f"actor_rollout_ref.model.path={tmp_path / 'nope'}"], files)
    assert problem.startswith(f"actor_rollout_ref.model.path={tmp_path / 'nope'} does not exist: set it to a model ")
    (tmp_path / "empty").mkdir()
    [problem] = _problems([f"actor_rollout_ref.model.path={tmp_path / 'empty'}"], files)
    assert problem.startswith(f"actor_rollout_ref.model.path={tmp_path / 'empty'} is not a Hugging Face model folder")


def test_a_hub_id_needs_the_hub_or_the_local_cache(files, monkeypatch):
    hub_id = "verl-gigpo-tests/no-such-model"  # a well-formed id that no cache holds
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    [problem] = _problems([f"actor_rollout_ref.model.path={hub_id}"], files)
    assert problem.startswith(
        f"actor_rollout_ref.model.path={hub_id} is no local folder, and as a Hugging Face hub id it cannot be fetched: "
        "HF_HUB_OFFLINE=1 disables the hub and the model is not in the local cache"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert _problems([f"actor_rollout_ref.model.path={hub_id}"], files) == []  # verl downloads it
    [problem] = _problems(["actor_rollout_ref.model.path=models/a/b"], files)  # neither a folder nor an id
    assert problem.startswith("actor_rollout_ref.model.path=models/a/b does not exist")


def test_missing_task_files_are_rejected_naming_the_key(tmp_path, files):
    problems = _problems(
        [f"data.train_files={tmp_path / 'no' / 'train.parquet'}", f"data.val_files=[{files['data.val_files']}]"], files
    )
    assert problems == [
        f"data.train_files={tmp_path / 'no' / 'train.parquet'} does not exist: write the task files with `python -m "
        "verl_gigpo.data.prepare --env sokoban --train-size N --out DIR` (train.parquet and val.parquet) and set "
        "data.train_files and data.val_files to them"
    ]


def test_alfworld_data_is_checked_through_the_environments_hook(tmp_path, files, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    [problem] = _problems(["env.name=alfworld"], files)
    assert problem.startswith("env.name=alfworld: ALFWorld games not found: no data_path given and ALFWORLD_DATA is")
    [problem] = _problems(["env.name=alfworld", f"+env.kwargs.data_path={tmp_path / 'games'}"], files)
    assert problem.startswith(f"env.kwargs.data_path={tmp_path / 'games'}: ALFWorld games not found: ")
    (tmp_path / "games" / "json_2.1.1" / "train").mkdir(parents=True)
    assert _problems(["env.name=alfworld", f"+env.kwargs.data_path={tmp_path / 'games'}"], files) == []
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "games"))
    assert _problems(["env.name=alfworld"], files) == []


def test_search_files_are_checked_through_the_environments_hook(tmp_path, files):
    [problem] = _problems(["env.name=search", f"+env.kwargs.questions_path={tmp_path / 'q.jsonl'}"], files)
    assert (
        problem == f"env.kwargs.questions_path={tmp_path / 'q.jsonl'}: {tmp_path / 'q.jsonl'} is not a file: give "
        "the path of an existing JSONL file"
    )


# ---------------------------------------------------------------------------------- preflight: key names (21.5)
@pytest.mark.parametrize(
    ("override", "start"),
    [
        ("env.max_steps=0", "env.max_steps=0 must be a whole number >= 1 (steps per episode)"),
        ("env.history_length=-1", "env.history_length=-1 must be a whole number >= 0"),
        ("env.invalid_action_penalty=-5", "env.invalid_action_penalty=-5 must be a finite number >= 0 (subtracted"),
        ("data.max_prompt_length=0", "data.max_prompt_length=0 must be a whole number >= 1"),
        ("data.max_response_length=0", "data.max_response_length=0 must be a whole number >= 1"),
        ("algorithm.gigpo.step_advantage_w=-1", "algorithm.gigpo.step_advantage_w=-1 must be a finite number >= 0"),
        ("algorithm.gamma=-0.5", "algorithm.gamma=-0.5 must be a number in [0, 1]"),
        ("algorithm.gigpo.norm=foo", "algorithm.gigpo.norm='foo' is not a norm"),
        ("algorithm.gigpo.key_mode=history", "algorithm.gigpo.key_mode='history' is not valid"),
        ("algorithm.gigpo.similarity_threshold=1.5", "algorithm.gigpo.similarity_threshold=1.5"),
        ("+algorithm.gigpo.step_weight=2", "unknown algorithm.gigpo key(s) ['step_weight']"),
    ],
)
def test_every_rejection_names_the_key_as_typed(files, override, start):
    [problem] = _problems([override], files)
    assert problem.startswith(start), problem


def test_the_agent_loops_reader_names_the_keys_too(files):
    """Launched past preflight (verl's own entry point), the agent loop's reader gives the same key names."""
    from verl_gigpo.verl_glue.agent_loop import episode_config_from

    with pytest.raises(ValueError, match=r"^env\.max_steps=0 .*>= 1"):
        episode_config_from(compose_gigpo(["env.max_steps=0"], files))


# -------------------------------------------------------------------------- group size 1: a true warning (21.5)
def test_group_size_one_warns_what_each_estimator_then_computes(files, caplog):
    from verl_gigpo.verl_glue.preflight import config_warnings, preflight

    [gigpo] = config_warnings(compose_gigpo(["actor_rollout_ref.rollout.n=1"], files))
    assert gigpo == (
        "actor_rollout_ref.rollout.n=1: every episode group holds one trajectory, so gigpo's episode term is 0 on "
        "every row; its step term compares only actions taken from an anchor state that the same episode revisits, "
        "and is 0 for every other step. Groups of several trajectories (the paper: rollout.n=8) give both terms"
    )
    with caplog.at_level(logging.WARNING, logger="verl_gigpo.verl_glue.preflight"):
        preflight(compose_gigpo(["actor_rollout_ref.rollout.n=1"], files))
    assert gigpo in caplog.messages
    [grpo] = config_warnings(compose_gigpo(["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=grpo"], files))
    assert "verl's grpo gives a one-member group mean 0, so each advantage is the episode's raw return" in grpo
    [off] = config_warnings(
        compose_gigpo(["actor_rollout_ref.rollout.n=1", "algorithm.gigpo.step_advantage_w=0"], files)
    )
    assert off.endswith("(algorithm.gigpo.step_advantage_w=0) every advantage is 0")
    assert config_warnings(compose_gigpo(["actor_rollout_ref.rollout.n=2"], files)) == []


def test_group_size_one_on_the_local_engine_gets_the_same_warning(caplog):
    from verl_gigpo.config import group_size_warning
    from verl_gigpo.local.config import load_config

    with caplog.at_level(logging.WARNING, logger="verl_gigpo.local.config"):
        load_config(["actor_rollout_ref.rollout.n=1"])
        load_config(["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=rloo"])
    assert caplog.messages == [
        group_size_warning("gigpo", 1, step_advantage_w=1.0),
        group_size_warning("rloo", 1),
    ]
    assert not any("all advantages are 0" in m for m in caplog.messages)


def test_a_one_member_group_really_gives_gigpo_a_step_term_from_revisits():
    """What the warning says, on the estimator: one trajectory that revisits a state gets non-zero advantages."""
    import numpy as np
    import torch

    from verl_gigpo.config import GiGPOConfig

    terms = GiGPOConfig().advantage_terms(
        torch.tensor([0.0, 0.0, 1.0]),
        torch.ones((3, 1)),
        np.array(["g", "g", "g"], dtype=object),
        np.array(["t", "t", "t"], dtype=object),
        np.array([0, 1, 2]),
        np.array(["A", "B", "A"], dtype=object),  # state A visited at steps 0 and 2
    )
    assert np.all(np.asarray(terms.advantage)[[0, 2]] != 0) and np.asarray(terms.advantage)[1] == 0


# --------------------------------------------------------------------------- local engine: unwritable paths (21.6)
@pytest.fixture
def unwritable():
    """Make a path unwritable even for root: ``chattr +i`` (immutable) as root, ``chmod a-w`` otherwise."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if os.geteuid() == 0:
            if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
                pytest.skip("running as root and chattr +i is unavailable here: no way to make a path unwritable")
        else:
            path.chmod(0o555 if path.is_dir() else 0o444)
        made.append(path)

    yield make
    for path in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        else:
            path.chmod(0o755 if path.is_dir() else 0o644)


def _local_cli_error(argv: list[str], capsys) -> str:
    from verl_gigpo.local.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if "error:" in x]
    return line


def test_local_resume_with_a_read_only_metrics_file_is_a_one_line_error(tmp_path, tiny_model_dir, unwritable, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"training_step": 0.0}\n')
    unwritable(run / "metrics.jsonl")
    line = _local_cli_error(
        ["--resume", f"trainer.default_local_dir={run}", f"actor_rollout_ref.model.path={tiny_model_dir}"], capsys
    )
    assert f"error: cannot write {run / 'metrics.jsonl'}: " in line
    assert line.endswith(
        f"(run folder trainer.default_local_dir={run}); make it writable or choose another trainer.default_local_dir"
    )


def test_local_run_in_an_unwritable_folder_is_a_one_line_error(tmp_path, tiny_model_dir, unwritable, capsys):
    model = f"actor_rollout_ref.model.path={tiny_model_dir}"
    run = tmp_path / "run"
    run.mkdir()
    unwritable(run)
    line = _local_cli_error([f"trainer.default_local_dir={run}", model], capsys)
    assert f"error: cannot write in {run}: " in line
    unwritable(tmp_path)
    line = _local_cli_error([f"trainer.default_local_dir={tmp_path / 'new' / 'run'}", model], capsys)
    assert f"error: cannot create {tmp_path / 'new'}: " in line


def test_local_run_folder_that_is_a_file_is_a_one_line_error(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "taken").write_text("a file where the run folder should be")
    line = _local_cli_error(
        [f"trainer.default_local_dir={tmp_path / 'taken'}", f"actor_rollout_ref.model.path={tiny_model_dir}"], capsys
    )
    assert f"error: cannot create {tmp_path / 'taken'}: " in line


# --------------------------------------------------------------------------------------------- recipes (17.6)
def _recipe_logger(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "LOGGER")}
    return subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh")],
        env={**base, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _printed_overrides(stdout: str) -> list[str]:
    """The words of the printed launch command as the shell would pass them (quotes and escapes undone)."""
    return shlex.split(stdout.replace("\\\n", " "), comments=True)


def test_recipes_log_to_the_console_and_verls_file_logger_by_default():
    proc = _recipe_logger()
    assert proc.returncode == 0, proc.stderr
    assert "trainer.logger=[console,file]" in _printed_overrides(proc.stdout)
    proc = _recipe_logger(LOGGER="console,file,tensorboard")
    assert "trainer.logger=[console,file,tensorboard]" in _printed_overrides(proc.stdout)
    proc = _recipe_logger(LOGGER="console;rm")
    assert (
        proc.returncode == 1 and "LOGGER=console;rm is not a comma-separated list of verl logger names" in proc.stderr
    )


def test_a_checkpoint_of_another_number_of_ranks_stops_the_resume_with_the_ranks_to_use(tmp_path, files):
    """verl loads only FSDP shards of its own world size: 2 nodes x 1 GPU wrote the checkpoint, so one node needs 2
    GPUs (a node that left the cluster, docs/multi-node.md); the refusal leaves no launch record."""
    from verl_gigpo.verl_glue.launch import LaunchError, prepare_launch

    folder = tmp_path / "exp"
    two_nodes = ("trainer.nnodes=2", "trainer.n_gpus_per_node=1")
    prepare_launch(run_config(folder, files, *two_nodes), environ={})
    actor = folder / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    for rank in (0, 1):
        (actor / f"model_world_size_2_rank_{rank}.pt").write_bytes(b"weights")
    (folder / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(LaunchError, match=r"cannot resume: .*global_step_3 was written by 2 rank\(s\)") as info:
        prepare_launch(run_config(folder, files, "trainer.nnodes=1", "trainer.n_gpus_per_node=1"), environ={})
    assert "trainer.nnodes x trainer.n_gpus_per_node = 1 x 1 = 1" in str(info.value)
    assert "NNODES=1 N_GPUS=2" in str(info.value)
    assert len(list((folder / "launches").iterdir())) == 1
    plan = prepare_launch(run_config(folder, files, "trainer.nnodes=1", "trainer.n_gpus_per_node=2"), environ={})
    assert plan.resume_step == 3  # the same 2 ranks on one node: nnodes is not a training key
