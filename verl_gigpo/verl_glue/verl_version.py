"""The verl versions verl_gigpo's patches and overrides of verl internals were checked against, and the guards.

:func:`check_verl_version` refuses a verl outside :data:`SUPPORTED_VERL_VERSIONS` (``VERL_GIGPO_ALLOW_VERL_VERSION=1``
lets it through with a warning); :class:`VerlMismatchError` is what the guards of
:mod:`verl_gigpo.verl_glue.contract` raise. docs/upgrading.md.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, version

__all__ = [
    "ALLOW_ENV",
    "SUPPORTED_VERL_VERSIONS",
    "VerlMismatchError",
    "check_verl_version",
    "installed_verl_version",
]

logger = logging.getLogger(__name__)

#: the verl releases the overrides of :mod:`verl_gigpo.verl_glue.trainer`, the CPU shims and the file-logger patch
#: were read against and tested with
SUPPORTED_VERL_VERSIONS = ("0.9.1",)
#: the environment variable that lets another verl version through (at the user's risk)
ALLOW_ENV = "VERL_GIGPO_ALLOW_VERL_VERSION"


def installed_verl_version() -> str:
    """The installed ``verl``'s version (package metadata, else ``verl.__version__``)."""
    try:
        return version("verl")
    except PackageNotFoundError:
        import verl

        return str(verl.__version__)


def check_verl_version(installed: str) -> None:
    """Raise RuntimeError (installed, supported, what to do) for a verl version outside
    :data:`SUPPORTED_VERL_VERSIONS`, unless ``$VERL_GIGPO_ALLOW_VERL_VERSION`` is 1/true/yes/on (then a warning)."""
    if installed in SUPPORTED_VERL_VERSIONS:
        return
    supported = ", ".join(SUPPORTED_VERL_VERSIONS)
    if os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        logger.warning(
            "verl %s is installed; verl_gigpo's patches of verl were checked against verl %s only (%s=%s lets it "
            "run): the verl methods they override (verl_gigpo/verl_glue/trainer.py, "
            "verl_gigpo/verl_glue/cpu/shims.py, verl_gigpo/verl_glue/metrics_file.py) may have changed",
            installed,
            supported,
            ALLOW_ENV,
            os.environ[ALLOW_ENV],
        )
        return
    raise RuntimeError(
        f"verl {installed} is installed, but verl_gigpo was checked against verl {supported} only: it overrides "
        "private methods of verl's V1 trainer (the gigpo_sync trainer mode, verl_gigpo/verl_glue/trainer.py; every "
        "one is a row of verl_gigpo/verl_glue/contract.py, docs/upgrading.md) and patches a few verl functions "
        "(verl_gigpo/verl_glue/cpu/shims.py, "
        "verl_gigpo/verl_glue/metrics_file.py), which another verl release may have renamed or changed. Install a "
        f"supported verl (pip install 'verl[verl-core]=={SUPPORTED_VERL_VERSIONS[-1]}'), or set {ALLOW_ENV}=1 to run "
        "with this one at your own risk (then check those methods against it)."
    )


class VerlMismatchError(RuntimeError):
    """A verl symbol that verl_gigpo patches or overrides (``target``) is not what it was written for."""

    def __init__(self, target: str, expected: str, found: str, *, use: str):
        self.target = target
        supported = ", ".join(SUPPORTED_VERL_VERSIONS)
        super().__init__(
            f"verl {installed_verl_version()}: {target} is not what verl_gigpo's {use} was written for (verl "
            f"{supported}): expected {expected}, found {found}. Install a supported verl (pip install "
            f"'verl[verl-core]=={SUPPORTED_VERL_VERSIONS[-1]}'), or adapt verl_gigpo to this verl."
        )
