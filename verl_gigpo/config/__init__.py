"""This project's configuration, in one place (docs/configuration.md).

* :mod:`~verl_gigpo.config.algorithm` — :class:`GiGPOConfig`, the ``algorithm`` section of the step-credit
  estimators (``algorithm.gamma``, ``algorithm.gigpo``, ``algorithm.{hgpo,graphgpo,g2po}``);
* :mod:`~verl_gigpo.config.sections` — every section of this project's keys mapped to its settings class;
* :mod:`~verl_gigpo.config.rules` — :class:`~verl_gigpo.config.rules.Range` (number and flag checks), the rules
  both engines check;
* :mod:`~verl_gigpo.config.keys` — the known keys, the command-line typo check, the deprecated spellings;
* :mod:`~verl_gigpo.config.resume` — the resume policy; ``*.yaml`` — Hydra's configs (verl's and the local engine's).

The names below load on first use: :mod:`~verl_gigpo.config.rules` and :mod:`~verl_gigpo.config.keys` import only
the standard library (environment worker processes import the rules), the estimator settings import the maths.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EPISODE_STATS", "METHOD_OPTIONS", "NORMS", "STEP_CREDIT_ESTIMATORS", "GiGPOConfig", "group_size_warning"]


def __getattr__(name: str) -> Any:
    """``GiGPOConfig`` and the other names of :data:`__all__`, from :mod:`verl_gigpo.config.algorithm`."""
    if name in __all__:
        from verl_gigpo.config import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module 'verl_gigpo.config' has no attribute {name!r}")
