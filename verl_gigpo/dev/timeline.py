"""Where a launch of verl's pipeline spends its start-up: opt-in timestamps of its phases, from every process.

Set ``GIGPO_TIMELINE=<file>`` in the environment of ``python -m verl_gigpo.main`` (Ray passes it to every worker
process); ``benchmarks/bench_verl_cpu.py`` does. Each process that imports verl (the plug-in calls
:func:`install`) then appends JSON lines to that file:

* ``{"pid", "label": "process", "start", "end"}``: the process's creation time and the moment verl's plug-in
  loading reached this package (``verl/__init__.py``: after Python, torch, tensordict, Ray and ``verl.protocol``
  are imported): its start-up and imports;
* ``{"pid", "label", "start", "end"}`` for each call of the functions in :data:`SPANS`, when the process calls one.

Nothing changes behaviour: each wrapper calls the wrapped function with its arguments and returns its result.
Without ``GIGPO_TIMELINE`` nothing is wrapped or written. Times are ``time.time()`` seconds.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import time
from typing import Any

__all__ = ["ENV", "SPANS", "install", "read_timeline"]

#: the environment variable naming the file the records are appended to
ENV = "GIGPO_TIMELINE"

#: (module, attribute path, label): the calls timed when their module is imported. The driver calls ray.init
#: (``verl.trainer.main_ppo.run_ppo``); the TaskRunner calls the others (``verl.trainer.main_ppo.TaskRunnerV1.run``
#: and the trainer's ``PPOTrainer.init``).
SPANS: tuple[tuple[str, str, str], ...] = (
    ("ray", "init", "ray_init"),
    ("transfer_queue", "init", "transfer_queue_init"),
    ("transfer_queue", "close", "transfer_queue_close"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer.__init__", "trainer_construct"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer.init", "trainer_init"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._init_dataloader", "datasets"),
    ("verl.single_controller.ray.base", "RayWorkerGroup.__init__", "actor_worker_processes"),
    ("verl.experimental.reward_loop.reward_loop", "RewardLoopManager.__init__", "reward_workers"),
    ("verl.workers.rollout.llm_server", "LLMServerManager.create", "rollout_servers"),
    ("verl.checkpoint_engine.base", "CheckpointEngineManager.__init__", "weight_sync_setup"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopManagerTQ.create", "agent_loop_workers"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer.fit", "fit"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._validate", "validation"),
)

_INSTALLED = False
logger = logging.getLogger(__name__)


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if path:
        # one short write per line on a file opened for appending: lines of concurrent processes do not interleave
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _timed(func: Any, label: str) -> Any:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return func(*args, **kwargs)
        finally:
            _write({"pid": os.getpid(), "label": label, "start": start, "end": time.time()})

    wrapper._gigpo_timeline = True  # type: ignore[attr-defined]
    return wrapper


def _wrap(module: Any, path: str, label: str) -> None:
    """Replace ``module.<path>`` (a function, a method or a classmethod) by its timed version; a missing attribute
    (another verl version) is logged and skipped: timing must never stop a run."""
    owner_name, _, name = path.rpartition(".")
    try:
        owner = getattr(module, owner_name) if owner_name else module
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        logger.warning("GIGPO_TIMELINE: %s.%s not found; its phase (%s) is not timed", module.__name__, path, label)
        return
    func = raw.__func__ if isinstance(raw, classmethod) else raw
    if getattr(func, "_gigpo_timeline", False):
        return
    timed = _timed(func, label)
    setattr(owner, name, classmethod(timed) if isinstance(raw, classmethod) else timed)


def install() -> None:
    """With ``GIGPO_TIMELINE`` set: record this process's start-up, and time the :data:`SPANS` calls when their
    modules are imported (at once for modules already imported). Idempotent; does nothing without the variable."""
    global _INSTALLED
    if _INSTALLED or not os.environ.get(ENV):
        return
    _INSTALLED = True
    import psutil
    import wrapt

    _write({"pid": os.getpid(), "label": "process", "start": psutil.Process().create_time(), "end": time.time()})
    for module_name, path, label in SPANS:
        wrapt.register_post_import_hook(lambda module, p=path, lb=label: _wrap(module, p, lb), module_name)


def read_timeline(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``GIGPO_TIMELINE`` file, in order of start time."""
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return sorted(records, key=lambda r: r["start"])
