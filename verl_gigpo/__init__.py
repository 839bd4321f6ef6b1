"""verl-gigpo: GiGPO (Group-in-Group Policy Optimization, arXiv 2505.10978) for multi-turn LLM agents on verl 0.9.1.

Importing this package is cheap (no verl, no torch). Each folder is one concern: :mod:`.advantage` (the maths),
:mod:`.config`, :mod:`.rollout` (shared by both engines), :mod:`.verl_glue` (everything that touches verl; the plug-in
entry point is :mod:`.plugin`, the command :mod:`.main`), :mod:`.local` (the single-machine engine), :mod:`.credit`,
the commands :mod:`.evaluate`, :mod:`.probe`, :mod:`.export`, and :mod:`.dev` (off the runtime path). README, "Layout".
"""

import importlib.util
import logging
import os
import sys
from pathlib import Path

__version__ = "0.1.0"

#: name of the advantage estimator registered into verl (``algorithm.adv_estimator=gigpo``)
ESTIMATOR_NAME = "gigpo"
#: every step-credit estimator registered into verl and run by the trainer mode and the local engine: GiGPO and
#: its successors HGPO, GraphGPO and G2PO (``algorithm.adv_estimator=<name>``, options in ``algorithm.<name>``)
STEP_CREDIT_ESTIMATORS = ("gigpo", "hgpo", "graphgpo", "g2po")
#: name of the agent loop registered into verl (``actor_rollout_ref.rollout.agent.default_agent_loop``)
AGENT_LOOP_NAME = "gigpo_env_agent"
#: name of the V1 trainer mode registered into verl (``trainer.v1.trainer_mode``)
TRAINER_MODE = "gigpo_sync"

__all__ = [
    "AGENT_LOOP_NAME",
    "COMMAND_DEPS",
    "ESTIMATOR_NAME",
    "STEP_CREDIT_ESTIMATORS",
    "TRAINER_MODE",
    "__version__",
    "verl_logger",
    "wrong_python_line",
]

#: what every ``python -m verl_gigpo.<command>`` imports (requirements.txt), looked up before the command's own imports
COMMAND_DEPS = ("numpy", "omegaconf", "torch", "transformers")


def verl_logger(name: str) -> logging.Logger:
    """The logger ``name`` at verl's level, as verl's own modules set theirs: ``$VERL_LOGGING_LEVEL``, default INFO
    (the modules that run inside verl's processes log with it)."""
    logger = logging.getLogger(name)
    logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))
    return logger


def wrong_python_line(command: str, missing: list[str], executable: str, root: Path) -> str:
    """The one line saying this Python lacks ``missing`` and which one runs ``python -m command``: the repository's
    ``.venv`` (the one the recipes pick) when ``root/.venv/bin/python`` exists, else the install hint."""
    venv = root / ".venv" / "bin" / "python"
    if venv.is_file():
        fix = f"use {venv} -m {command} ..., or first: source {venv.parent / 'activate'}"
    else:
        fix = f"use the Python this project is installed in (`make install` creates {root / '.venv'})"
    return f"error: this Python ({executable}) lacks {', '.join(missing)}; {fix}"


def _command_python_check() -> None:
    """A Python lacking :data:`COMMAND_DEPS`: one line and exit status 2, not a ``ModuleNotFoundError``."""
    missing = [name for name in COMMAND_DEPS if importlib.util.find_spec(name) is None]
    if missing:
        args = getattr(sys, "orig_argv", [])
        command = args[args.index("-m") + 1] if "-m" in args[:-1] else "verl_gigpo"
        print(wrong_python_line(command, missing, sys.executable, Path(__file__).resolve().parents[1]), file=sys.stderr)
        raise SystemExit(2)


if sys.argv[:1] == ["-m"]:  # Python is finding ``python -m verl_gigpo.<command>``: this package is imported first
    _command_python_check()
