"""This project's configuration, in one place (docs/configuration.md): ``algorithm`` (:class:`GiGPOConfig`),
``sections``, ``rules``, ``keys``, ``resume``, ``trainer`` and the yaml files. Names load on first use.
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
