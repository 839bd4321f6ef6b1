"""The modules of :mod:`verl_gigpo.rollout` (its subpackage ``execution/`` included) depend on each other one way
only (CPU only, no model).

A module that imports another which imports it back — even lazily, inside a function — works only by luck of the
import order and hides which piece is the shared one; the fix is to move that piece down a level. This reads every
import statement of the package's files with ``ast`` (function bodies included) and fails on any cycle, and imports
each module alone in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import verl_gigpo.rollout

PACKAGE = "verl_gigpo.rollout"
PACKAGE_DIR = Path(verl_gigpo.rollout.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imported_modules(module: str, path: Path) -> set[str]:
    """Modules of the package that ``module`` imports anywhere in its source (top level or inside functions)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from pkg import name` runs pkg, and runs pkg.name too when name is a submodule
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in MODULES and name != module)
    return found


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None when the graph is acyclic."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_lazy_cycle_and_passes_a_chain():
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_lazy_imports_inside_functions_count(tmp_path):
    source = "def f():\n    from verl_gigpo.rollout.episode import make_task_env\n"
    path = tmp_path / "pool.py"
    path.write_text(source)
    assert _imported_modules(f"{PACKAGE}.execution.pool", path) == {f"{PACKAGE}.episode"}


def test_no_module_of_the_rollout_package_imports_one_that_imports_it_back():
    graph = {module: _imported_modules(module, path) for module, path in MODULES.items()}
    assert {f"{PACKAGE}.episode", f"{PACKAGE}.execution.pool", f"{PACKAGE}.types"} <= set(graph)
    cycle = _find_cycle(graph)
    assert cycle is None, (
        f"import cycle in {PACKAGE}: {' -> '.join(cycle)}; move the piece both need into a module below them "
        f"(e.g. {PACKAGE}.types or a new small module) so the imports go one way"
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_rollout_module_imports_alone_in_a_fresh_interpreter(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"`import {module}` failed in a fresh interpreter:\n{result.stderr[-2000:]}"
