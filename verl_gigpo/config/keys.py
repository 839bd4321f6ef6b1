"""The known keys of this project's sections, the deprecated spellings, and the command-line check of both.

:func:`check_argv` runs before Hydra composes (``python -m verl_gigpo.main``) and before the local engine loads
(``python -m verl_gigpo.local.train``): an override of a key under :data:`PROJECT_SECTIONS` that no yaml declares ends
in one line naming the nearest known keys; a deprecated spelling (:data:`DEPRECATED_KEYS`) is rewritten to its new
key with a one-line warning. verl's own keys pass through to Hydra. Standard library and PyYAML only.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEPRECATED_KEYS",
    "GIGPO_YAML",
    "LOCAL_YAML",
    "PROJECT_SECTIONS",
    "Deprecated",
    "check_argv",
    "flat_keys",
    "known_keys",
    "rename_deprecated",
    "unknown_key_message",
]

CONFIG_DIR = Path(__file__).parent
GIGPO_YAML = CONFIG_DIR / "gigpo_trainer.yaml"
LOCAL_YAML = CONFIG_DIR / "local_trainer.yaml"

#: the sections whose keys this project declares (verl's own keys outside them pass through to Hydra); ``trainer``
#: and ``algorithm.filter_groups`` mix verl's keys and ours (:data:`MIXED_SECTIONS`), so both yaml files give their
#: known keys, and they are checked only where the installed verl ships its composed config
PROJECT_SECTIONS = (
    "algorithm.gigpo",
    "algorithm.hgpo",
    "algorithm.graphgpo",
    "algorithm.g2po",
    "algorithm.filter_groups",
    "env",
    "trainer",
    "local",
)
MIXED_SECTIONS = ("algorithm.filter_groups", "trainer")


@dataclass(frozen=True)
class Deprecated:
    """An old spelling still honoured: ``new`` is the key now, ``since`` the version that renamed it, ``note`` what
    changed beyond the name (empty: only the name)."""

    new: str
    since: str
    note: str = ""

    def warning(self, old: str) -> str:
        """The one warning line for a use of ``old``."""
        note = f"; {self.note}" if self.note else ""
        return f"warning: {old} is deprecated since {self.since}, read as {self.new}{note}"


DEPRECATED_KEYS: dict[str, Deprecated] = {
    "trainer.health.length_limit_max": Deprecated(
        "trainer.health.length_limit_rise",
        "0.1.0",
        "the meaning changed: the alarm now fires on a rise of the share of replies at the length limit above the "
        "run's early share (by this much + 2 SE), not on the share itself (docs/watching-a-run.md#calibration)",
    ),
}
"""old key -> :class:`Deprecated` (docs/configuration.md#deprecated-keys)."""

#: undeclared keys that the preflight (:mod:`verl_gigpo.verl_glue.preflight`) names with its own fix, among the
#: config's other problems: :func:`check_argv` lets them through
PREFLIGHT_KEYS = {"algorithm.gigpo.gamma": "not read: the discount is algorithm.gamma"}

_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w.\-]*)(=|$)")


def flat_keys(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of a nested mapping -> its value (mappings are keys too, with their value)."""
    out: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        for name, value in tree.items():
            key = f"{prefix}{name}"
            out[key] = value
            out.update(flat_keys(value, key + "."))
    return out


@cache
def _yaml_keys(path: str) -> dict[str, Any]:
    """The flat keys of one yaml file (Hydra's ``defaults`` and ``hydra`` nodes left out)."""
    tree = yaml.safe_load(Path(path).read_text()) or {}
    return flat_keys({k: v for k, v in tree.items() if k not in ("defaults", "hydra")})


@cache
def _verl_yaml() -> Path | None:
    """verl's composed ``ppo_trainer`` config, where the installed verl ships one (found without importing verl)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return path if path.exists() else None


@cache
def known_keys(local: bool = False) -> dict[str, Any]:
    """The keys an override may name -> their yaml default: the local engine's ``local_trainer.yaml``
    (``local=True``), else ``gigpo_trainer.yaml`` plus verl's composed ``ppo_trainer``."""
    if local:
        return dict(_yaml_keys(str(LOCAL_YAML)))
    verl = _verl_yaml()
    return {**(_yaml_keys(str(verl)) if verl else {}), **_yaml_keys(str(GIGPO_YAML))}


def _free_form(key: str, known: Mapping[str, Any]) -> bool:
    """``key`` lies under a declared key whose value is free-form (an empty mapping or null, e.g. ``env.kwargs``)."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:i])
        if parent in known:
            value = known[parent]
            return value is None or (isinstance(value, Mapping) and not value)
    return False


def unknown_key_message(key: str, known: Mapping[str, Any], *, everywhere: bool = False) -> str | None:
    """None when ``key`` is known, free-form or (unless ``everywhere``) outside :data:`PROJECT_SECTIONS`; else the
    one line naming the nearest known keys."""
    if key in known or key in DEPRECATED_KEYS or key in PREFLIGHT_KEYS or _free_form(key, known):
        return None
    sections = [s for s in PROJECT_SECTIONS if s not in MIXED_SECTIONS or everywhere or _verl_yaml() is not None]
    if not everywhere and not any(key == s or key.startswith(s + ".") for s in sections):
        return None
    section = key.rsplit(".", 1)[0]
    siblings = [k for k in known if k.rsplit(".", 1)[0] == section] or list(known)
    nearest = difflib.get_close_matches(key, siblings, n=3, cutoff=0.6) or difflib.get_close_matches(
        key, list(known), n=3, cutoff=0.6
    )
    hint = f"did you mean {', '.join(nearest)}?" if nearest else "see docs/configuration.md for the keys"
    return f"error: unknown config key {key}; {hint}"


def check_argv(argv: Sequence[str], *, local: bool = False) -> list[str]:
    """The overrides of ``argv`` with deprecated keys renamed (a warning line each on stderr).

    Raises:
        SystemExit(2): an override names an unknown key of :data:`PROJECT_SECTIONS` (with ``local``, the local
            engine's yaml: any unknown key), one line on stderr, no traceback.
    """
    known = known_keys(local)
    out = []
    for arg in argv:
        match = _OVERRIDE.match(arg)
        if match is None or (match.group(3) == "" and match.group(1) != "~"):
            out.append(arg)  # a flag (--cfg job), or a bare word that is no override
            continue
        key = match.group(2)
        if key in DEPRECATED_KEYS:
            arg = rename_override(arg)
        elif (message := unknown_key_message(key, known, everywhere=local)) is not None:
            print(message, file=sys.stderr, flush=True)
            raise SystemExit(2)
        out.append(arg)
    return out


def rename_deprecated(section: MutableMapping[str, Any], prefix: str, *, warn: Any = None) -> None:
    """Rename, in place, the deprecated keys of one config section (``section`` is the node at ``prefix``, e.g.
    ``trainer.health``) to their new names, calling ``warn`` (default: print to stderr) with each warning line."""
    for old, entry in DEPRECATED_KEYS.items():
        head, _, name = old.rpartition(".")
        if head != prefix or name not in section:
            continue
        (warn or _warn)(entry.warning(old))
        value = section.pop(name)
        new_name = entry.new.rpartition(".")[2]
        section.setdefault(new_name, value)  # the new spelling wins when both are set


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def rename_override(item: str, *, warn: Any = _warn) -> str:
    """A ``key=value`` override with a deprecated key renamed (``~`` and ``++`` kept; ``+`` becomes ``++``, since the
    new key is declared and Hydra refuses to add a declared key), ``warn`` called with the warning line; any other
    item unchanged."""
    match = _OVERRIDE.match(item)
    if match is None or match.group(2) not in DEPRECATED_KEYS:
        return item
    entry = DEPRECATED_KEYS[match.group(2)]
    warn(entry.warning(match.group(2)))
    prefix = "++" if match.group(1) == "+" else item[: match.start(2)]
    return prefix + entry.new + item[match.end(2) :]


def rename_deprecated_tree(tree: Mapping[str, Any], *, warn: Any = _warn) -> dict[str, Any]:
    """A copy of a nested config mapping (e.g. a run's saved config) with its deprecated keys renamed."""
    out = _copy_tree(tree)
    for old in DEPRECATED_KEYS:
        head, _, _ = old.rpartition(".")
        node: Any = out
        for part in head.split("."):
            node = node.get(part) if isinstance(node, MutableMapping) else None
        if isinstance(node, MutableMapping):
            rename_deprecated(node, head, warn=warn)
    return out


def _copy_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy_tree(v) if isinstance(v, Mapping) else v for k, v in tree.items()}
