"""``python -m verl_gigpo.<command>`` run with a Python that lacks the project's dependencies (CPU only, no model)
ends in one line naming the Python to use, not in a ``ModuleNotFoundError`` traceback.

``python -S`` (no site-packages) is such a Python on every machine: it finds this repository through ``PYTHONPATH``
but not numpy, torch or omegaconf.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_gigpo import COMMAND_DEPS, wrong_python_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", ["verl_gigpo.evaluate", "verl_gigpo.export", "verl_gigpo.probe"])
def test_a_python_without_the_dependencies_gets_one_line_naming_the_python_to_use(command):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-S", "-m", command, "some/model"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == wrong_python_line(command, list(COMMAND_DEPS), sys.executable, ROOT)
    assert f"error: this Python ({sys.executable}) lacks numpy, omegaconf, torch, transformers; " in lines[0]


def test_the_line_names_the_repository_venv_when_there_is_one_else_the_install(tmp_path):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    assert wrong_python_line("verl_gigpo.export", ["torch"], "/usr/bin/python3", tmp_path) == (
        f"error: this Python (/usr/bin/python3) lacks torch; use {tmp_path}/.venv/bin/python -m verl_gigpo.export "
        f"..., or first: source {tmp_path}/.venv/bin/activate"
    )
    bare = tmp_path / "bare"
    assert wrong_python_line("verl_gigpo.evaluate", ["torch", "numpy"], "/opt/py", bare) == (
        f"error: this Python (/opt/py) lacks torch, numpy; use the Python this project is installed in "
        f"(`make install` creates {bare}/.venv)"
    )


def test_the_project_python_runs_the_commands():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "verl_gigpo.export", "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m verl_gigpo.export")
