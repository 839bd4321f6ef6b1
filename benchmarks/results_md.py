"""Write one benchmark's section into benchmarks/RESULTS.md, leaving the other sections as they are."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(text: str, heading: str, path: Path = RESULTS) -> None:
    """Replace the section that starts with ``heading`` (a ``## ...`` line) by ``text`` in place, or append it."""
    if not text.startswith(heading):
        raise ValueError(f"the section text must start with its heading {heading!r}")
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if heading not in old:
        path.write_text(old.rstrip() + "\n\n" + text.rstrip() + "\n")
        return
    start = old.index(heading)  # replaced in place: the other sections keep their order
    nxt = old.find("\n## ", start + len(heading))
    rest = "" if nxt == -1 else "\n" + old[nxt + 1 :]
    path.write_text(old[:start] + text.rstrip() + "\n" + rest)
