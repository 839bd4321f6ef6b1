"""The verl versions the ``gigpo_sync`` trainer mode was checked against, and the guard that refuses others.

:mod:`verl_gigpo.trainer` overrides private methods of verl's V1 trainer (its docstring lists them with verl's file
and line); verl may rename or reshape them in any release. Importing the trainer mode runs
:func:`check_verl_version` on the installed verl, before any verl import, so an untested verl fails at once with
what to do rather than deep inside a training step.

    check_verl_version("0.9.1")    # returns None
    check_verl_version("0.10.0")   # RuntimeError: which verl is installed, which are supported, what to do

Escape hatch: ``VERL_GIGPO_ALLOW_VERL_VERSION=1`` (or true/yes/on) lets an unchecked version through with a logged
warning.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, version

__all__ = ["ALLOW_ENV", "SUPPORTED_VERL_VERSIONS", "check_verl_version", "installed_verl_version"]

logger = logging.getLogger(__name__)

#: the verl releases whose trainer the overrides of :mod:`verl_gigpo.trainer` were read against and tested with
SUPPORTED_VERL_VERSIONS = ("0.9.1",)
#: the environment variable that lets another verl version through (at the user's risk)
ALLOW_ENV = "VERL_GIGPO_ALLOW_VERL_VERSION"


def installed_verl_version() -> str:
    """The version of the installed ``verl`` distribution (its package metadata; ``verl.__version__`` when the
    metadata is missing, e.g. a source tree on ``PYTHONPATH``)."""
    try:
        return version("verl")
    except PackageNotFoundError:
        import verl

        return str(verl.__version__)


def check_verl_version(installed: str) -> None:
    """Refuse a verl version the trainer mode was not checked against.

    Args:
        installed: the installed verl version (:func:`installed_verl_version`), e.g. ``"0.9.1"``.

    Raises:
        RuntimeError: ``installed`` is not in :data:`SUPPORTED_VERL_VERSIONS` and ``$VERL_GIGPO_ALLOW_VERL_VERSION``
            is not set to 1/true/yes/on; the message names the installed and the supported versions and what to do.
    """
    if installed in SUPPORTED_VERL_VERSIONS:
        return
    supported = ", ".join(SUPPORTED_VERL_VERSIONS)
    if os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        logger.warning(
            "verl %s is installed; verl_gigpo's trainer mode was checked against verl %s only (%s=%s lets it run): "
            "the verl methods it overrides (listed in verl_gigpo/trainer.py) may have changed",
            installed,
            supported,
            ALLOW_ENV,
            os.environ[ALLOW_ENV],
        )
        return
    raise RuntimeError(
        f"verl {installed} is installed, but verl_gigpo's gigpo_sync trainer mode was checked against verl "
        f"{supported} only: it overrides private methods of verl's V1 trainer (listed with verl's file and line in "
        f"the docstring of verl_gigpo/trainer.py), which another verl release may have renamed or changed. Install a "
        f"supported verl (pip install 'verl[verl-core]=={SUPPORTED_VERL_VERSIONS[-1]}'), or set {ALLOW_ENV}=1 to run "
        "with this one at your own risk (then check those methods against it)."
    )
