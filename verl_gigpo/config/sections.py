"""Each section of this project's keys and the settings classes that read it (docs/configuration.md, "Where the
sections live"); ``tests/test_config_sections.py`` holds each yaml default equal to its class's.
"""

from __future__ import annotations

import importlib
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

__all__ = ["LOCAL_DEFAULTS", "SECTIONS", "Section", "section_defaults"]


@dataclass(frozen=True)
class Section:
    """A settings class (``"module:Class"``) that reads keys of one section; ``renamed``: yaml key -> field name
    where they differ and the field does not declare its key (:func:`~verl_gigpo.config.rules.whole` ``key=``)."""

    cls: str
    renamed: dict[str, str] = field(default_factory=dict)

    def load(self) -> type:
        """The class itself (its module imported now)."""
        module, name = self.cls.split(":")
        return getattr(importlib.import_module(module), name)


SECTIONS: dict[str, tuple[Section, ...]] = {
    "algorithm": (Section("verl_gigpo.config.algorithm:GiGPOConfig"),),  # algorithm.gamma
    "algorithm.gigpo": (Section("verl_gigpo.config.algorithm:GiGPOConfig"),),
    "algorithm.hgpo": (Section("verl_gigpo.advantage:HGPOOptions"),),
    "algorithm.graphgpo": (Section("verl_gigpo.advantage:GraphGPOOptions"),),
    "algorithm.g2po": (Section("verl_gigpo.advantage:G2POOptions"),),
    "algorithm.filter_groups": (
        Section("verl_gigpo.rollout.dynamic:DynamicSampling", {"max_num_gen_batches": "max_rounds"}),
    ),
    "env": (Section("verl_gigpo.rollout.types:EpisodeConfig"), Section("verl_gigpo.rollout.execution:EnvExecution")),
    "env.prompt": (Section("verl_gigpo.rollout.types:PromptOptions"), Section("environments.base:PromptStyle")),
    "env.parse": (Section("environments.base:ParseStyle"),),
    "trainer": (
        Section("verl_gigpo.credit.records:CreditLogOptions", {"credit_log_groups": "groups"}),
        Section("verl_gigpo.rollout.episode_log:EpisodeLogOptions"),
    ),
    "trainer.health": (Section("verl_gigpo.config.trainer:HealthOptions"),),
    "trainer.v1.gigpo_sync": (Section("verl_gigpo.config.trainer:UpdateSettings"),),
    "local": (Section("verl_gigpo.config.trainer:LocalSettings"),),
}
"""section -> the settings classes that read its keys."""


LOCAL_DEFAULTS: dict[str, Any] = {"algorithm.gigpo.key_mode": "state", "env.max_steps": 10, "env.history_length": 0}
"""Where ``local_trainer.yaml`` departs from the classes' defaults on purpose: its defaults are the gridnav demo's
(``python -m verl_gigpo.local.train`` with no override trains it on a laptop), whose true state is its grid and whose
episodes are short and need no history."""


def section_defaults(section: str) -> dict[str, Any]:
    """The defaults of ``section``'s keys as its settings classes declare them: yaml key -> default (fields without a
    plain default, e.g. nested options, left out)."""
    out: dict[str, Any] = {}
    for entry in SECTIONS[section]:
        names = {v: k for k, v in entry.renamed.items()}
        for spec in fields(entry.load()):
            if spec.default is not MISSING:
                out[spec.metadata.get("key", names.get(spec.name, spec.name))] = spec.default
    return out
