"""The manual holds together: links between README.md and docs/ resolve, commands in its code blocks name files,
modules and make targets that exist, and the "add your own environment" example runs as printed (CPU-only)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: file types a command may name that must then exist in the repository (outputs such as .jsonl/.parquet/.png are
#: what commands write, not what they read)
CHECKED_SUFFIXES = (".sh", ".py", ".md", ".yaml", ".txt", ".toml")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE)}


def _links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_readme_and_docs_resolve(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: {resolved.relative_to(REPO) if REPO in resolved.parents else resolved} missing")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def _commands(page: Path) -> list[list[str]]:
    """Shell commands of the page's bash code blocks (continuation lines joined, comments dropped), as tokens."""
    commands = []
    for lang, body in FENCE.findall(page.read_text()):
        if lang not in ("bash", "sh", "shell"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as exc:
                raise AssertionError(f"{page.relative_to(REPO)}: cannot parse {line!r}: {exc}") from exc
            if tokens:
                commands.append(tokens)
    return commands


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.MULTILINE)}


def _module_exists(module: str) -> bool:
    """Whether ``module`` can be found, without importing it or its packages (importing verl costs seconds):
    the top-level package's location, then one file or folder per dotted part."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return True
    for base in spec.submodule_search_locations or ():
        path = Path(base).joinpath(*rest)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return True
    return False


def _problems(tokens: list[str]) -> list[str]:
    problems = []
    for i, token in enumerate(tokens):
        if token == "-m" and i + 1 < len(tokens) and i > 0 and "python" in tokens[i - 1]:
            module = tokens[i + 1]
            if not _module_exists(module):
                problems.append(f"module {module} does not exist")
        elif token == "make" and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            if tokens[i + 1] not in _make_targets():
                problems.append(f"make target {tokens[i + 1]} does not exist")
        value = token.split("=", 1)[1] if re.match(r"^[A-Za-z_][\w.]*=", token) else token
        if (
            value.endswith(CHECKED_SUFFIXES)
            and "/" in value
            and not value.startswith(("/", "~", "$", "http"))
            and not (REPO / value).exists()
        ):
            problems.append(f"file {value} does not exist")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_commands_in_code_blocks_name_what_exists(page):
    problems = [f"`{' '.join(t)}`: {p}" for t in _commands(page) for p in _problems(t)]
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_command_check_catches_what_is_missing():
    """The check above can fail: a missing module, recipe and make target are each reported."""
    assert _problems(["python", "-m", "verl_gigpo.no_such_module"]) == [
        "module verl_gigpo.no_such_module does not exist"
    ]
    assert _problems(["bash", "recipes/run_nothing.sh"]) == ["file recipes/run_nothing.sh does not exist"]
    assert _problems(["make", "no-such-target"]) == ["make target no-such-target does not exist"]
    assert _problems(["python", "-m", "verl_gigpo.main", "env.name=alfworld"]) == []
    assert _slug("The estimator: paper → code") == "the-estimator-paper--code"
    assert _slug("Invalid actions: `env.invalid_action`") == "invalid-actions-envinvalid_action"


def test_every_docs_page_is_linked_from_the_readme():
    """The README is the front door: each page of docs/ is reachable from it in one click."""
    readme = REPO / "README.md"
    linked = {(readme.parent / target.partition("#")[0]).resolve() for target in _links(readme)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"README.md links no docs page named {unlinked}"


# ---------------------------------------------------------------- the "add your own environment" example, run
def _example_source() -> str:
    for _, body in FENCE.findall((REPO / "docs" / "environments.md").read_text()):
        if body.startswith("# my_envs/counter.py\n"):
            return body
    raise AssertionError("docs/environments.md lost its '# my_envs/counter.py' example")


def test_the_add_your_own_environment_example_runs(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The documented CounterEnv, written to a file as printed, through the documented entry points (called
    in-process): the checker passes, data prep writes its tasks, and the local engine trains it for one iteration
    through ``env.registry``."""
    from environments.checker import main as checker_main
    from verl_gigpo.data.prepare import main as prepare_main
    from verl_gigpo.local.cli import main as train_main

    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "counter.py").write_text(_example_source())
    monkeypatch.syspath_prepend(str(tmp_path))

    assert checker_main(["my_envs.counter:CounterEnv"]) == 0
    assert (
        prepare_main(
            [
                "--env",
                "my_envs.counter:CounterEnv",
                "--train-size",
                "8",
                "--val-size",
                "4",
                "--out",
                str(tmp_path / "d"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "train: 8 tasks of split 'train'" in out and "val: 4 tasks of split 'test'" in out
    assert train_main(
        [
            "env.registry.counter=my_envs.counter:CounterEnv", "env.name=counter",
            f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
            "data.val_size=2", "local.progress=false", "local.plot=false",
        ]
    ) == 0  # fmt: skip
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # validation before training, then iteration 1
