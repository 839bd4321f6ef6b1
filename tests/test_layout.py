"""The package layout keeps its promises (CPU only, no model): the package root holds only its entry points and the
shared validator, and dev-only code (:mod:`verl_gigpo.dev`) stays off the runtime import path, the start-up timeline
included unless ``GIGPO_TIMELINE`` asks for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import verl_gigpo

PACKAGE_DIR = Path(verl_gigpo.__file__).parent

# the plug-in registers the CPU platform (and installs the timeline when asked) in every process that imports verl
PLUGIN = "import verl"
REPORT = """
import json, sys
print(json.dumps(sorted(name for name in sys.modules if name.startswith("verl_gigpo.dev"))))
"""


def test_package_root_holds_its_entry_points_and_at_most_four_modules():
    modules = sorted(path.name for path in PACKAGE_DIR.glob("*.py"))
    assert {"__init__.py", "main.py", "plugin.py"} <= set(modules), modules
    assert len(modules) <= 4, f"verl_gigpo/ holds {modules}: put new modules in the folder of their concern"


def _dev_modules_imported(code: str, env: dict[str, str]) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", code + REPORT], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_timeline_is_imported_only_when_asked(tmp_path):
    """With GIGPO_TIMELINE set, ``import verl`` loads the timeline (and nothing else of verl_gigpo.dev); without
    it, what a run imports loads nothing of verl_gigpo.dev (checked in test_verl_plugin's fresh process)."""
    env = {k: v for k, v in os.environ.items() if k != "GIGPO_TIMELINE"}
    asked = _dev_modules_imported(PLUGIN, {**env, "GIGPO_TIMELINE": str(tmp_path / "timeline.jsonl")})
    assert asked == ["verl_gigpo.dev", "verl_gigpo.dev.timeline"]
