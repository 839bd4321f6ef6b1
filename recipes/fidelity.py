"""The fidelity table (``recipes/reference_settings.yaml``): load it, check it, compare a recipe's composed config
with it, and render it as Markdown (``docs/fidelity.md``).

    python recipes/fidelity.py            # write docs/fidelity.md from the table
    python recipes/fidelity.py --check    # exit 1 when docs/fidelity.md is not the table's rendering

A row says, for one setting of one recipe: where the recipe's value is read (``key``), the value the recipe composes
(``ours``), the paper's value, the reference implementation's value with its ``source`` (file:line), and why this
project differs (``deviation``) or that nobody has decided yet (``open``). The rules, checked by
:func:`table_problems` and :func:`fidelity_problems` (``tests/test_fidelity.py`` runs both on every recipe):

1. ``ours`` is what ``DRY_RUN=1 bash recipes/run_<recipe>.sh`` composes at ``key`` (a dotted Hydra key), or puts
   after ``prep:--option`` in its data-prep command (``all`` when the option is absent); the LoRA rows, the
   dynamic-sampling rows and each successor's rows (``lora``, ``dynamic``, ``estimators``) hold when the recipe runs
   with their ``env`` (e.g. ``LORA_RANK=64``, ``DYNAMIC=episode``, ``ADV_ESTIMATOR=hgpo``);
2. ``ours`` differs from ``reference`` only with a ``deviation`` (or ``open: true`` and a text saying what is known).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "recipes" / "reference_settings.yaml"
DOC = ROOT / "docs" / "fidelity.md"

#: fields a row may have; the first five are required
ROW_FIELDS = ("setting", "key", "ours", "reference", "source", "paper", "deviation", "open", "note")
PREP = "prep:"
NOT_FOUND = "not found"
_MISSING = object()


def load_table(path: Path = TABLE) -> dict[str, Any]:
    """The parsed table: ``sources``, ``common`` (rows for every recipe), ``recipes`` (name -> script,
    reference_script, rows), ``lora`` (``env``: the variables that turn LoRA on; ``common`` rows; ``recipes``: name
    -> reference_script, rows; the rows that hold with LoRA, :func:`recipe_rows`) and ``estimators`` (method ->
    ``name``, ``env``: ``ADV_ESTIMATOR=<method>``, ``intro``, ``common`` rows, ``recipes``: name -> reference_script,
    rows; the rows that hold when a recipe runs that method with its authors' settings) and ``dynamic`` (``env``: the
    variables that turn dynamic sampling on; ``common`` rows, which hold with them)."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _section_layers(section: dict[str, Any], recipe: str) -> list[list[dict[str, Any]]]:
    """A conditional section's rows for ``recipe`` (none when the section has no table for it), then its common rows."""
    return [((section.get("recipes") or {}).get(recipe) or {}).get("rows", []), section.get("common") or []]


def recipe_rows(
    table: dict[str, Any], recipe: str, *, lora: bool = False, estimator: str | None = None, dynamic: bool = False
) -> list[dict[str, Any]]:
    """The rows that hold for ``recipe``: its own, then the common rows it does not replace (same ``setting``). With
    ``lora`` (the recipe run with ``table["lora"]["env"]``), the recipe's LoRA rows and the LoRA common rows come first
    and replace the rows of the same setting; with ``dynamic`` (the recipe run with ``table["dynamic"]["env"]``), the
    dynamic-sampling rows likewise. With ``estimator`` (the recipe run with
    ``table["estimators"][estimator]["env"]``), that method's rows for the recipe and its common rows come before all
    of them.

    Raises:
        KeyError: ``recipe`` or ``estimator`` is not in the table.
    """
    if recipe not in table["recipes"]:
        raise KeyError(f"recipe {recipe!r} is not in the fidelity table; it has {sorted(table['recipes'])}")
    layers = [table["recipes"][recipe]["rows"], table["common"]]
    if lora:
        layers[:0] = _section_layers(table["lora"], recipe)
    if dynamic:
        layers[:0] = _section_layers(table["dynamic"], recipe)
    if estimator is not None:
        methods = table.get("estimators") or {}
        if estimator not in methods:
            raise KeyError(f"estimator {estimator!r} is not in the fidelity table; it has {sorted(methods)}")
        layers[:0] = _section_layers(methods[estimator], recipe)
    rows: list[dict[str, Any]] = []
    for layer in layers:
        names = {row["setting"] for row in rows}
        rows += [row for row in layer if row["setting"] not in names]
    return rows


def same(a: Any, b: Any) -> bool:
    """Whether two table or config values are equal: numbers by value (``1 == 1.0``; booleans are not numbers),
    anything else by ``==``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a == b


def _row_problems(where: str, row: dict[str, Any]) -> list[str]:
    problems = []
    unknown = sorted(set(row) - set(ROW_FIELDS))
    if unknown:
        problems.append(f"{where}: unknown field(s) {unknown}; a row has {list(ROW_FIELDS)}")
    missing = [field for field in ROW_FIELDS[:5] if field not in row]
    if missing:
        problems.append(f"{where}: missing field(s) {missing}")
        return problems
    key = row["key"]
    if key is not None and (not isinstance(key, str) or not key or (key.startswith(PREP) and len(key) == len(PREP))):
        problems.append(f"{where}: key {key!r} must be a dotted config key, 'prep:--option' or null")
    if not str(row["source"]).strip():
        problems.append(f"{where}: empty source (give the reference's file:line)")
    differs = not same(row["ours"], row["reference"])
    reason = str(row.get("deviation") or "").strip()
    if differs and not reason:
        problems.append(
            f"{where}: ours={row['ours']!r} differs from reference={row['reference']!r} and there is no deviation "
            "(say why this project differs, or make the recipe use the reference's value)"
        )
    if row.get("open") and not reason:
        problems.append(f"{where}: open difference without a deviation text saying what is known")
    if not differs and reason:
        problems.append(f"{where}: a deviation on a row where ours equals the reference ({row['ours']!r})")
    return problems


def table_problems(table: dict[str, Any]) -> list[str]:
    """Everything wrong with the table itself: missing or unknown fields, bad keys, a setting listed twice in one
    recipe, a difference from the reference without a deviation, a deviation on an equal row. Empty when sound."""
    problems = []
    for i, row in enumerate(table.get("common") or []):
        problems += _row_problems(f"common row {i} ({row.get('setting')!r})", row)
    for recipe, spec in (table.get("recipes") or {}).items():
        for field in ("script", "reference_script", "rows"):
            if field not in spec:
                problems.append(f"recipe {recipe}: missing {field!r}")
        problems += _rows_problems(recipe, spec.get("rows") or [])
    lora = table.get("lora")
    if lora is not None:
        if not isinstance(lora.get("env"), dict) or not lora["env"]:
            problems.append("lora: missing 'env' (the variables that turn LoRA on, e.g. LORA_RANK: '64')")
        problems += _rows_problems("lora common", lora.get("common") or [])
        for recipe, spec in (lora.get("recipes") or {}).items():
            if recipe not in (table.get("recipes") or {}):
                problems.append(f"lora recipe {recipe}: not a recipe of the table")
            if "reference_script" not in spec:
                problems.append(f"lora recipe {recipe}: missing 'reference_script'")
            problems += _rows_problems(f"lora {recipe}", spec.get("rows") or [])
    dynamic = table.get("dynamic")
    if dynamic is not None:
        if not isinstance(dynamic.get("env"), dict) or not dynamic["env"]:
            problems.append("dynamic: missing 'env' (the variables that turn it on, e.g. DYNAMIC: episode)")
        problems += _rows_problems("dynamic common", dynamic.get("common") or [])
    for method, section in (table.get("estimators") or {}).items():
        problems += _estimator_problems(table, method, section)
    return problems


def _estimator_problems(table: dict[str, Any], method: str, section: dict[str, Any]) -> list[str]:
    """What is wrong with one method's section of ``estimators``."""
    where = f"estimator {method}"
    problems = []
    unknown = sorted(set(section) - {"name", "env", "intro", "common", "recipes"})
    if unknown:
        problems.append(f"{where}: unknown field(s) {unknown}; a section has name, env, intro, common, recipes")
    if (section.get("env") or {}).get("ADV_ESTIMATOR") != method:
        problems.append(f"{where}: 'env' must set ADV_ESTIMATOR: {method} (the variable that picks the method)")
    for field in ("name", "intro"):
        if not str(section.get(field) or "").strip():
            problems.append(f"{where}: missing {field!r}")
    if method not in (table.get("sources") or {}):
        problems.append(f"{where}: 'sources' has no {method!r} entry (the authors' repository and commit)")
    problems += _rows_problems(f"{where} common", section.get("common") or [])
    for recipe, spec in (section.get("recipes") or {}).items():
        if recipe not in (table.get("recipes") or {}):
            problems.append(f"{where} recipe {recipe}: not a recipe of the table")
        if "reference_script" not in spec:
            problems.append(f"{where} recipe {recipe}: missing 'reference_script' (the authors' script)")
        problems += _rows_problems(f"{where} {recipe}", spec.get("rows") or [])
    return problems


def _rows_problems(where: str, rows: list[dict[str, Any]]) -> list[str]:
    problems = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        problems += _row_problems(f"{where} row {i} ({row.get('setting')!r})", row)
        if row.get("setting") in seen:
            problems.append(f"{where}: setting {row.get('setting')!r} listed twice")
        seen.add(row.get("setting"))
    return problems


def composed_value(cfg: Any, prep_argv: list[str], key: str) -> Any:
    """The value a recipe composes at ``key``: a dotted key of ``cfg`` (an OmegaConf config), or ``prep:--option``
    of the data-prep command ``prep_argv`` (its value, an int when it is one; ``"all"`` when the option is absent).

    Raises:
        KeyError: the dotted key is not in ``cfg``.
    """
    if key.startswith(PREP):
        option = key[len(PREP) :]
        if option not in prep_argv:
            return "all"
        value = prep_argv[prep_argv.index(option) + 1]
        return int(value) if value.lstrip("-").isdigit() else value
    value = OmegaConf.select(cfg, key, default=_MISSING)
    if value is _MISSING:
        raise KeyError(f"{key} is not in the composed config")
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def fidelity_problems(
    table: dict[str, Any],
    recipe: str,
    cfg: Any,
    prep_argv: list[str],
    *,
    lora: bool = False,
    estimator: str | None = None,
    dynamic: bool = False,
) -> list[str]:
    """Where ``recipe``'s composed config (``cfg``) and data-prep command (``prep_argv``) differ from the table's
    ``ours`` column, plus the table's own problems for that recipe's rows. Empty when the recipe is as listed. With
    ``lora``, ``cfg`` is the recipe run with ``table["lora"]["env"]`` and the LoRA rows hold; with ``estimator``, the
    recipe run with ``table["estimators"][estimator]["env"]`` and that method's rows hold; with ``dynamic``, the recipe
    run with ``table["dynamic"]["env"]`` and the dynamic-sampling rows hold (:func:`recipe_rows`)."""
    problems = []
    parts = ("LoRA" if lora else None, estimator, "dynamic" if dynamic else None)
    label = "".join(f" ({part})" for part in parts if part)
    for row in recipe_rows(table, recipe, lora=lora, estimator=estimator, dynamic=dynamic):
        where = f"{recipe}{label}: {row['setting']!r}"
        problems += _row_problems(where, row)
        if row["key"] is None:
            continue
        try:
            value = composed_value(cfg, prep_argv, row["key"])
        except KeyError as err:
            problems.append(f"{where}: {err.args[0]}")
            continue
        if not same(value, row["ours"]):
            problems.append(
                f"{where}: the recipe composes {row['key']}={value!r}, the table says ours={row['ours']!r} "
                f"(reference {row['reference']!r}); change the recipe back or the table, with a deviation"
            )
    return problems


# ------------------------------------------------------------------ rendering


def fmt(value: Any) -> str:
    """A value as a Markdown table cell: booleans and null in YAML spelling, numbers compactly, ``|`` escaped."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = str(value)
    return " ".join(text.split()).replace("|", "\\|")


def _why(row: dict[str, Any]) -> str:
    parts = []
    if row.get("deviation"):
        parts.append(("**open:** " if row.get("open") else "**deviation:** ") + fmt(row["deviation"]))
    if row.get("note"):
        parts.append(fmt(row["note"]))
    return "<br>".join(parts)


def _key(row: dict[str, Any]) -> str:
    return "—" if row["key"] is None else f"`{row['key']}`"


def _table(rows: list[dict[str, Any]], reference: str = "reference (langfengQ/verl-agent)") -> list[str]:
    lines = [
        f"| setting | read from | this recipe | paper | {reference} | {reference.split(' (')[0]} source | "
        "deviation / note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [
            fmt(row["setting"]),
            _key(row),
            fmt(row["ours"]),
            fmt(row.get("paper") or NOT_FOUND),
            fmt(row["reference"]),
            fmt(row["source"]),
            _why(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


_INTRO = """\
# Fidelity to the paper's runs

<!-- generated by `python recipes/fidelity.py` from recipes/reference_settings.yaml: edit the yaml, not this page -->

Every setting that decides training, for each GPU recipe: the value the recipe uses, the paper's value where its
text states one, and the value the paper's reference implementation runs with, with the file and line it comes
from. Where this project differs on purpose, the last column says why; **open** marks a difference nobody has
decided on yet.

- reference: {reference}. A source `run_X.sh:N` is `examples/gigpo_trainer/run_X.sh`; `ppo_trainer.yaml:N` is
  `verl/trainer/config/ppo_trainer.yaml`, the defaults of the keys a script leaves unset.
- paper: {paper}. Only the abstracts could be read here, so most rows say "{not_found}".
- this project: {verl}.

**How it is checked.** `tests/test_fidelity.py` composes each recipe's command (`DRY_RUN=1 bash
recipes/run_<recipe>.sh`, then Hydra over verl's config) and fails when a value it composes differs from *this
recipe*, or *this recipe* from the reference without a deviation. *Read from* is the config key, or
`prep:--option` for an option of the recipe's data-prep command. Change a recipe and the table together;
`python recipes/fidelity.py` rewrites this page.

## Every recipe

These rows hold for each recipe below unless its own table lists the same setting.
"""


_LORA_INTRO = """\
## LoRA runs (`LORA_RANK` set)

With `LORA_RANK=R` a recipe trains a rank-R LoRA adapter instead of every weight (`recipes/driver.py`,
`Recipe.lora`). The rows below then hold, checked by composing every recipe with `{env}`; they replace the rows
of the same setting above, and every other row above still holds. The reference has LoRA scripts for {with_ref}
(their tables follow); {without} have none, and `LORA_RANK` applies the same rule to them.
"""


_DYNAMIC_INTRO = """\
## Dynamic sampling (`{env}`)

With `DYNAMIC=episode` a recipe runs the reference's "GiGPO (dynamic)" settings (`recipes/driver.py`,
`Recipe.dynamic`): a finished group whose episode returns are all equal is dropped and fresh tasks are played
instead ([docs/dynamic-sampling.md](dynamic-sampling.md)). The rows below then hold, checked by composing every
recipe with `{env}`; they replace the rows of the same setting above, and every other row above still holds
(the reference's `examples/gigpo_dynamic_trainer/run_{{alfworld,webshop,sokoban}}.sh` differ from its GiGPO
scripts only in these keys and the experiment name; it has none for search, where `DYNAMIC` applies the same
values). A source `dyn/run_X.sh:N` is `examples/gigpo_dynamic_trainer/run_X.sh`. `DYNAMIC=signal` composes the
same, with `algorithm.filter_groups.filter=signal`.
"""


_ESTIMATORS_INTRO = """\
## HGPO, GraphGPO and G2PO as their authors ran them

With `ADV_ESTIMATOR={methods}` a recipe runs that method with its authors' settings for the recipe's
environment, wherever the variable is not set (`recipes/recipe_defaults.py`, `ESTIMATOR_SETTINGS`): the rows below then
hold, checked by composing every recipe with each method. They replace the rows of the same setting above; every other
row above still holds, as there the authors' script sets what verl-agent's GiGPO script sets (every key of the two was
compared). *Authors' run* is the authors' script for that environment with their trainer and code. Where they ran no
script for an environment, only the method's rows for every recipe change. The deviations of each method's maths from
the authors' code are numbered in [docs/estimators.md](estimators.md#deliberate-deviations-from-the-authors-code)
(items 13-25); the paper equations' forms stay available as overrides (e.g. `algorithm.hgpo.weight_base=depth`,
[docs/estimators.md](estimators.md)).
"""


def _render_estimators(table: dict[str, Any]) -> list[str]:
    methods = table.get("estimators") or {}
    if not methods:
        return []
    out = ["", _ESTIMATORS_INTRO.format(methods="|".join(methods)).rstrip()]
    for method, section in methods.items():
        env = " ".join(f"{k}={v}" for k, v in section["env"].items())
        scripted = section.get("recipes") or {}
        out += ["", f"### {section['name']} (`{env}`)", "", f"Authors' code: {fmt(table['sources'][method])}."]
        out += ["", fmt(section["intro"]), "", "Every recipe:", "", *_table(section["common"], "authors' run")]
        for recipe, spec in scripted.items():
            script = table["recipes"][recipe]["script"]
            out += ["", f"#### {section['name']} on {recipe}", ""]
            out += [f"`{script}` against the authors' `{spec['reference_script']}`.", ""]
            out += _table(spec["rows"], "authors' run")
        unscripted = [name for name in table["recipes"] if name not in scripted]
        if unscripted:
            out += [
                "",
                f"The authors ran no {section['name']} script for {' or '.join(unscripted)}: there only the "
                "method's rows for every recipe change.",
            ]
    return out


def render_markdown(table: dict[str, Any]) -> str:
    """``docs/fidelity.md``: what the table is and how it is checked, its sources, the rows every recipe shares,
    then one table per recipe, then the LoRA rows (every recipe's, and each reference LoRA script's), then the
    dynamic-sampling rows, then one
    section per successor (its rows for every recipe, and each of its authors' scripts')."""
    src = table["sources"]
    intro = _INTRO.format(
        reference=fmt(src["reference"]), paper=fmt(src["paper"]), verl=fmt(src["verl"]), not_found=NOT_FOUND
    )
    out = [intro, *_table(table["common"])]
    for recipe, spec in table["recipes"].items():
        out += ["", f"## {recipe}", "", f"`{spec['script']}` against the reference's `{spec['reference_script']}`."]
        out += ["", *_table(spec["rows"])]
    lora = table.get("lora")
    if lora:
        with_ref = lora.get("recipes") or {}
        without = [name for name in table["recipes"] if name not in with_ref]
        env = " ".join(f"{k}={v}" for k, v in lora["env"].items())
        out += ["", _LORA_INTRO.format(env=env, with_ref=", ".join(with_ref), without=", ".join(without)).rstrip()]
        out += ["", *_table(lora["common"])]
        for recipe, spec in with_ref.items():
            script = table["recipes"][recipe]["script"]
            out += [
                "",
                f"### {recipe} with LoRA",
                "",
                f"`{script}` against the reference's `{spec['reference_script']}`.",
            ]
            out += ["", *_table(spec["rows"])]
    dynamic = table.get("dynamic")
    if dynamic:
        env = " ".join(f"{k}={v}" for k, v in dynamic["env"].items())
        out += ["", _DYNAMIC_INTRO.format(env=env).rstrip(), "", *_table(dynamic["common"])]
    out += _render_estimators(table)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/fidelity.md, or with ``--check`` report whether it is current (exit status 1 when not)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/fidelity.md is current")
    args = parser.parse_args(argv)
    table = load_table()
    problems = table_problems(table)
    if problems:
        print("the fidelity table has problems:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    text = render_markdown(table)
    if args.check:
        if not DOC.exists() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is not the rendering of {TABLE}: run python recipes/fidelity.py", file=sys.stderr)
            return 1
        print(f"{DOC} is current")
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
