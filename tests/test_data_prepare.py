"""CPU tests of ``python -m verl_gigpo.data.prepare``: the task parquet files verl's dataset loader reads."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from verl_gigpo.data.prepare import main, write_task_files


def test_rows_are_tasks_with_fixed_validation_seeds(tmp_path):
    train, val = write_task_files("webshop", tmp_path, train_size=7)
    tr, va = pd.read_parquet(train), pd.read_parquet(val)
    assert list(tr["seed"]) == list(range(7)) and set(tr["split"]) == {"train"}
    assert list(va["seed"]) == list(range(500)) and set(va["split"]) == {"test"}  # WebShop goals 0-499
    assert set(tr["agent_name"]) == {"gigpo_env_agent"} and set(tr["env_name"]) == {"webshop"}
    row = tr.iloc[3]
    assert list(row["prompt"])[0]["role"] == "user" and row["extra_info"]["index"] == 3
    assert row["data_source"] == "webshop"


def test_writing_twice_gives_identical_files(tmp_path):
    a = write_task_files("sokoban", tmp_path / "a", train_size=5, val_size=3)
    b = write_task_files("sokoban", tmp_path / "b", train_size=5, val_size=3)
    for x, y in zip(a, b, strict=True):
        pd.testing.assert_frame_equal(pd.read_parquet(x), pd.read_parquet(y))


def test_cli(tmp_path):
    assert main(["--env", "gridnav", "--train-size", "4", "--val-size", "2", "--out", str(tmp_path)]) == 0
    assert len(pd.read_parquet(tmp_path / "val.parquet")) == 2


def test_cli_as_module_prints_the_paths(tmp_path):
    args = ["--env", "search", "--train-size", "3", "--out", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "verl_gigpo.data.prepare", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "train.parquet") in proc.stdout


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env_name": "nope", "train_size": 3}, "known environments"),
        ({"env_name": "gridnav", "train_size": 0}, "train_size"),
        ({"env_name": "gridnav", "train_size": 3, "val_size": 0}, "val_size"),
        ({"env_name": "gridnav", "train_size": 3, "val_split": "nope"}, "split"),
        # WebShop's 500 test goals are a fixed list (num_tasks): seeds past it would repeat goals 0, 1, ...
        ({"env_name": "webshop", "train_size": 3, "val_size": 501}, "split 'test' has 500 tasks; val_size=501"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_task_files(out_dir=tmp_path, **kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", ""], "out_dir is empty; name the folder"),
        (["--out", "x", "--val-split", "train"], "the validation split 'train' is the training split"),
        (["--out", "x", "--env-kwargs", "[1,2]"], "--env-kwargs must be a JSON object of constructor arguments"),
        (["--out", "x", "--env-kwargs", '{"size": 100000}'], "gridnav: size must be an int in"),
        (["--out", "x", "--env-kwargs", '{"colour": 1}'], "unexpected keyword argument 'colour'"),
    ],
)
def test_cli_rejects_bad_arguments_before_writing_anything(tmp_path, monkeypatch, capsys, args, message):
    # Each of these used to write files (into the current folder for --out "", or validation tasks that are
    # training tasks for --val-split train) or end in a raw traceback.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--env", "gridnav", "--train-size", "4", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.parquet"))


def test_alfworld_report_counts_every_task_type_written(tmp_path, alfworld_data, capsys):
    """The generated set has one training game of each of the six types; 9 training seeds play each type once,
    then three more (the task-type interleave), and validation is the whole valid_seen list (pick, clean)."""
    args = ["--env", "alfworld", "--train-size", "9", "--out", str(tmp_path)]
    assert main([*args, "--env-kwargs", json.dumps({"data_path": str(alfworld_data)})]) == 0
    report = json.loads((tmp_path / "task_types.json").read_text())
    assert report["env_name"] == "alfworld"
    assert report["train"] == {
        "split": "train",
        "tasks": 9,
        "task_types": {"clean": 2, "cool": 1, "heat": 1, "look": 2, "pick": 2, "pick2": 1},
    }
    assert report["val"] == {"split": "valid_seen", "tasks": 2, "task_types": {"clean": 1, "pick": 1}}
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "train: 9 tasks of split 'train'; task types: clean 2, cool 1, heat 1, look 2, pick 2, pick2 1"
    assert out[3] == "val: 2 tasks of split 'valid_seen'; task types: clean 1, pick 1"


def test_report_of_other_environments(tmp_path):
    write_task_files("webshop", tmp_path / "w", train_size=40, val_size=10)
    report = json.loads((tmp_path / "w" / "task_types.json").read_text())
    assert sum(report["train"]["task_types"].values()) == 40 and len(report["train"]["task_types"]) > 1
    write_task_files("gridnav", tmp_path / "g", train_size=4, val_size=2)
    report = json.loads((tmp_path / "g" / "task_types.json").read_text())
    assert report["train"]["task_types"] == {"goal": 4} and report["val"]["task_types"] == {"goal": 2}
