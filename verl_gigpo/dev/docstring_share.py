"""The package's docstring share: docstring lines over all lines of ``verl_gigpo/**/*.py``.

    python -m verl_gigpo.dev.docstring_share            # the share, and the ten files with the most docstring lines
    python -m verl_gigpo.dev.docstring_share --max 0.15 # exit 1 above the bound

A docstring's lines are those of the string node the AST gives for a module, class or function docstring.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def docstring_lines(source: str) -> int:
    """Lines of every module, class and function docstring in ``source`` (end_lineno - lineno + 1 each)."""
    tree = ast.parse(source)
    total = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                total += first.end_lineno - first.lineno + 1
    return total


def measure(root: Path = PACKAGE) -> tuple[int, int, list[tuple[str, int, int]]]:
    """(docstring lines, all lines, per file (path, docstring lines, lines)) over ``root/**/*.py``."""
    files = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        files.append((str(path.relative_to(root.parent)), docstring_lines(text), len(text.splitlines())))
    return sum(f[1] for f in files), sum(f[2] for f in files), files


def main(argv: list[str] | None = None) -> int:
    """Print the share (and the heaviest files); exit 1 when it exceeds ``--max``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=float, default=None, help="fail (exit 1) above this share, e.g. 0.15")
    parser.add_argument("--top", type=int, default=10, help="files listed, most docstring lines first")
    args = parser.parse_args(argv)
    doc, lines, files = measure()
    share = doc / lines
    print(f"docstring share of verl_gigpo/: {doc} / {lines} lines = {share:.1%} ({len(files)} files)")
    for name, d, n in sorted(files, key=lambda f: -f[1])[: args.top]:
        print(f"  {d:5d} / {n:5d}  {name}")
    if args.max is not None and share > args.max:
        print(f"above --max {args.max:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
