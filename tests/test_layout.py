"""The package layout keeps its promises (CPU only, no model): the package root holds only its entry points and the
shared validator, and dev-only code (:mod:`verl_gigpo.dev`) stays off the runtime import path, the start-up timeline
included unless ``GIGPO_TIMELINE`` asks for it.

The rules read the package's import graph from its AST (:func:`import_graph`): every ``import`` and ``from ... import``
of a module, at module level or inside a function, is an edge, with two exceptions that cannot form a cycle: an import
of the module's own ancestor package (Python imports it first anyway) and one under ``if __name__ == "__main__":``
(it runs in the ``__main__`` module, not in the module imported by name).

1. No import cycle anywhere in the package.
2. verl is imported only in :data:`VERL_ROOMS` and the modules of :data:`VERL_ELSEWHERE`, each with its reason.
3. The run-time rooms (:data:`RUN_TIME_ROOMS`) and every module they import import nothing from the command rooms
   (:data:`COMMAND_ROOMS`) or ``dev/``: model builders live in ``dev/``; a command (``make demo``) may call one,
   the library's run-time code may not.
4. Every folder of the package is listed in README's Layout section.
5. Docstrings are short: the package's share at most 15 % (``python -m verl_gigpo.dev.docstring_share``), module
   docstrings at most 15 lines, no docstring quoting a file's line numbers; the rationale lives in ``docs/``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import verl_gigpo

PACKAGE_DIR = Path(verl_gigpo.__file__).parent
README = PACKAGE_DIR.parent / "README.md"

#: where verl may be imported: the glue and the two modules verl itself reaches (the plug-in, the entry point)
VERL_ROOMS = ("verl_gigpo.verl_glue", "verl_gigpo.plugin", "verl_gigpo.main")
#: the other modules that import verl (each import inside a function), and why
VERL_ELSEWHERE = {
    "verl_gigpo.local.update": "the local engine's PPO update calls verl's public loss functions (core_algos: "
    "get_policy_loss_fn, agg_loss, kl_penalty; entropy_from_logits), by design: both engines compute one loss",
    "verl_gigpo.local.config": "checks actor.policy_loss.loss_mode against verl's policy-loss registry and the "
    "loggers against verl's Tracking, the ones the local engine then uses",
    "verl_gigpo.local.train": "logs through verl's Tracking, so both engines write to the same loggers",
    "verl_gigpo.advantage.outcome": "grpo and rloo on the local engine are verl's own estimators (core_algos), so "
    "both engines compute the same baselines",
    "verl_gigpo.export": "a verl checkpoint's FSDP shards are merged by verl's own model merger",
}
#: the library's run-time code (what a training process imports)
RUN_TIME_ROOMS = ("verl_gigpo.verl_glue", "verl_gigpo.local", "verl_gigpo.rollout")
#: the user's commands after training, and the development tools: never imported at run time
COMMAND_ROOMS = (
    "verl_gigpo.evaluate",
    "verl_gigpo.export",
    "verl_gigpo.probe",
    "verl_gigpo.inspect",
    "verl_gigpo.prompts",
    "verl_gigpo.dev",
)

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


# ------------------------------------------------------------------ the import graph
def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names ``node`` imports (``from a import b``: ``a.b`` and ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def _is_main_guard(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _imports(tree: ast.AST):
    """Every import node of ``tree`` (at any depth) outside ``if __name__ == "__main__":`` blocks."""
    for child in ast.iter_child_nodes(tree):
        if _is_main_guard(child):
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _imports(child)


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(edges, verl)``: for each module of the package the package modules it imports, and the verl modules it
    imports (a ``from a import b`` counts ``a.b`` when that is a module of the package, else ``a``)."""
    names = _module_names()
    edges: dict[str, set[str]] = {}
    verl: dict[str, set[str]] = {}
    for module, path in names.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text())):
            found = _imported(node, module, path.name == "__init__.py")
            for name in found:
                if name.split(".")[0] == "verl":
                    verl.setdefault(module, set()).add(found[0] if isinstance(node, ast.ImportFrom) else name)
            candidates = found[1:] if isinstance(node, ast.ImportFrom) else found
            for name in candidates:
                target = name if name in names else (found[0] if found[0] in names else None)
                while target is None and "." in name:  # import a.b.c of a module a.b
                    name = name.rsplit(".", 1)[0]
                    target = name if name in names else None
                ancestor = module.startswith(f"{target}.")
                if target is not None and target != module and not ancestor:
                    targets.add(target)
        edges[module] = targets
    return edges, verl


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _in(module: str, rooms: tuple[str, ...]) -> bool:
    return any(module == room or module.startswith(f"{room}.") for room in rooms)


def test_the_graph_sees_imports_at_module_and_function_level():
    """The graph the rules read holds the imports it must: a module-level one, one inside a function, and none of
    a ``__main__`` block (``python -m verl_gigpo.local.train`` imports the command line only there)."""
    edges, verl = import_graph()
    assert "verl_gigpo.rollout.transcripts" in edges["verl_gigpo.verl_glue.agent_loop"]  # module level
    assert "verl_gigpo.verl_glue.launch" in edges["verl_gigpo.main"]  # inside main()
    assert "verl_gigpo.local.cli" not in edges["verl_gigpo.local.train"]
    assert "verl_gigpo.local.train" in edges["verl_gigpo.local.cli"]
    assert "verl.trainer.ppo.core_algos" in verl["verl_gigpo.local.update"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    edges, _ = import_graph()
    cycles = _cycles(edges)
    assert not cycles, f"modules that import each other (move the shared piece down a level): {cycles}"


def test_verl_is_imported_only_by_the_glue_and_the_listed_exceptions():
    _, verl = import_graph()
    outside = {m: sorted(v) for m, v in verl.items() if not _in(m, VERL_ROOMS) and m not in VERL_ELSEWHERE}
    assert not outside, f"verl imported outside verl_glue/, plugin.py, main.py: {outside}"
    assert sorted(VERL_ELSEWHERE) == sorted(m for m in verl if m in VERL_ELSEWHERE), "a listed exception is stale"


def test_run_time_code_imports_no_command_and_no_dev_module():
    edges, _ = import_graph()
    run_time = {m for m in edges if _in(m, RUN_TIME_ROOMS)}
    reached: set[str] = set()
    todo = sorted(run_time)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(edges[module])
    assert "verl_gigpo.credit.records" in reached and "verl_gigpo.config" in reached
    wrong = sorted(
        f"{a} -> {b}" for a in reached for b in edges[a] if _in(b, COMMAND_ROOMS) and not _in(a, COMMAND_ROOMS)
    )
    assert not wrong, f"run-time code imports a command room or dev/: {wrong}"


def test_every_folder_of_the_package_is_in_the_readme_layout():
    layout = re.search(r"^## Layout\n(.*?)^## ", README.read_text(), flags=re.M | re.S)
    assert layout, "README.md has no '## Layout' section"
    listed = set(re.findall(r"([A-Za-z_]\w*)/", layout.group(1)))
    folders = sorted(
        str(path.relative_to(PACKAGE_DIR))
        for path in PACKAGE_DIR.rglob("*")
        if path.is_dir() and path.name != "__pycache__"
    )
    assert folders and "verl_glue/cpu" in folders
    missing = [folder for folder in folders if Path(folder).name not in listed]
    assert not missing, f"folders of verl_gigpo/ missing from README's Layout section: {missing}"


def _unused_module_loggers(path: Path) -> bool:
    """Whether the module at ``path`` binds a module-level ``logger`` (or ``log``) and never reads it."""
    tree = ast.parse(path.read_text())
    bound = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id in ("logger", "log", "_logger")
    }
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return bool(bound - read)


def test_no_module_logger_is_left_unused(tmp_path):
    """``logger = logging.getLogger(__name__)`` that nothing logs to (ruff does not see it: an assignment is a use)."""
    roots = (PACKAGE_DIR, PACKAGE_DIR.parent / "environments")
    unused = [str(p) for root in roots for p in sorted(root.rglob("*.py")) if _unused_module_loggers(p)]
    assert unused == []
    planted = tmp_path / "planted.py"
    planted.write_text("import logging\n\nlogger = logging.getLogger(__name__)\n")
    assert _unused_module_loggers(planted)
    planted.write_text("import logging\n\nlogger = logging.getLogger(__name__)\nlogger.info('x')\n")
    assert not _unused_module_loggers(planted)


def test_every_benchmark_spells_its_print_only_flag_no_results():
    """One spelling of "print, do not write RESULTS.md" over the benchmarks (``--no-write``, the old one of three,
    stays as an alias)."""
    spellings = {"--no-results", "--no-write", "--dry-run", "--no-save"}
    found = {}
    for path in sorted((PACKAGE_DIR.parent / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if spellings & set(names):
                    found[path.name] = names[0]
    assert len(found) >= 6, found
    assert {name for name, first in found.items() if first != "--no-results"} == set()


def test_docstrings_are_short_and_the_package_share_is_at_most_15_percent():
    """Issue 39 item 5: the package's docstring share (``python -m verl_gigpo.dev.docstring_share``) is at most 15 %,
    every module docstring is at most 15 lines, and no docstring quotes another repository's line numbers."""
    from verl_gigpo.dev.docstring_share import docstring_lines, measure

    assert docstring_lines('"""a\nb"""\nclass A:\n    """c"""\n    def f(self):\n        return 1\n') == 3
    doc, lines, _ = measure()
    assert doc / lines <= 0.15, f"docstring share {doc}/{lines} = {doc / lines:.1%}: move rationale to docs/"
    long_modules, line_numbers = [], []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
        if module_doc is not None and isinstance(module_doc.value, ast.Constant):
            if module_doc.end_lineno - module_doc.lineno + 1 > 15:
                long_modules.append(path.relative_to(PACKAGE_DIR).as_posix())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node) or ""
                if re.search(r"\.py[:#]L?\d+|\blines? \d+(-\d+)? of\b", text):
                    line_numbers.append(f"{path.relative_to(PACKAGE_DIR).as_posix()}:{getattr(node, 'name', '')}")
    assert not long_modules, f"module docstrings longer than 15 lines: {long_modules}"
    assert not line_numbers, f"docstrings quoting line numbers of a file: {line_numbers}"
