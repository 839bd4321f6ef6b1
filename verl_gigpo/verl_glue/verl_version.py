"""The verl versions verl_gigpo's patches and overrides of verl internals were checked against, and the guards.

verl_gigpo reaches into verl where verl offers no extension point: the ``gigpo_sync`` trainer mode overrides private
methods of verl's V1 trainer (:mod:`verl_gigpo.verl_glue.trainer`, its docstring lists them), the CPU platform patches a
few verl functions (:mod:`verl_gigpo.verl_glue.cpu.shims`), and the metrics file patches verl's file logger
(:func:`verl_gigpo.verl_glue.metrics_file.append_file_logger`). verl may rename or reshape any of them in a release. Two
guards, both run when a patch or override is installed:

* :func:`check_verl_version`: the installed verl must be one of :data:`SUPPORTED_VERL_VERSIONS` (importing the
  trainer mode runs it before any verl import; each shim runs it too);
* the guards of :mod:`verl_gigpo.verl_glue.contract` (the table of every verl symbol touched): what is patched or
  overridden must still be what it was written for, else :class:`VerlMismatchError` says which verl symbol changed
  and what to do, instead of a patch silently not applying.

    check_verl_version("0.9.1")    # returns None
    check_verl_version("0.10.0")   # RuntimeError: which verl is installed, which are supported, what to do

Escape hatch: ``VERL_GIGPO_ALLOW_VERL_VERSION=1`` (or true/yes/on) lets an unchecked version through with a logged
warning.
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
        "private methods of verl's V1 trainer (the gigpo_sync trainer mode, listed in the docstring of "
        "verl_gigpo/verl_glue/trainer.py) and patches a few verl functions (verl_gigpo/verl_glue/cpu/shims.py, "
        "verl_gigpo/verl_glue/metrics_file.py), which another verl release may have renamed or changed. Install a "
        f"supported verl (pip install 'verl[verl-core]=={SUPPORTED_VERL_VERSIONS[-1]}'), or set {ALLOW_ENV}=1 to run "
        "with this one at your own risk (then check those methods against it)."
    )


class VerlMismatchError(RuntimeError):
    """A verl function, method or class that verl_gigpo patches or overrides is not what it was written for.

    Attributes:
        target: the verl symbol, e.g. ``"PPOTrainer._update_actor"``.
    """

    def __init__(self, target: str, expected: str, found: str, *, use: str):
        self.target = target
        supported = ", ".join(SUPPORTED_VERL_VERSIONS)
        super().__init__(
            f"verl {installed_verl_version()}: {target} is not what verl_gigpo's {use} was written for (verl "
            f"{supported}): expected {expected}, found {found}. Install a supported verl (pip install "
            f"'verl[verl-core]=={SUPPORTED_VERL_VERSIONS[-1]}'), or adapt verl_gigpo to this verl."
        )
