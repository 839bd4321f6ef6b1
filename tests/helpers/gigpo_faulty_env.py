"""A gridnav that fails at ``reset`` now and then: drives the verl pipeline's failed-episode path in the CPU e2e test.

Registered in the agent-loop workers through ``env.registry`` (``{gridnav_faulty: "gigpo_faulty_env:FaultyGridNav"}``)
with this folder on ``PYTHONPATH``. Every ``FAIL_EVERY``-th reset in a process raises, so each training iteration
has failed episodes while most episodes play normally; every ``SLOW_EVERY``-th reset takes ``SLOW_S`` seconds more, so
an iteration's rollout ends a little after most of its episodes (the e2e kills its agent-loop worker in between).
"""

from __future__ import annotations

import itertools
import os
import time

from environments.gridnav.env import GridNavEnv

#: every n-th reset (per process) raises; GIGPO_FAULTY_EVERY overrides
FAIL_EVERY = int(os.environ.get("GIGPO_FAULTY_EVERY", "5"))

#: every n-th reset (per process) sleeps SLOW_S seconds first; GIGPO_SLOW_EVERY overrides (0: never)
SLOW_EVERY, SLOW_S = int(os.environ.get("GIGPO_SLOW_EVERY", "7")), 2.0

_resets = itertools.count(1)


class FaultyGridNav(GridNavEnv):
    """``GridNavEnv`` whose every ``FAIL_EVERY``-th reset in this process raises ``RuntimeError``."""

    def reset(self, *, seed=None, options=None):
        count = next(_resets)
        if count % FAIL_EVERY == 0:
            raise RuntimeError("gridnav_faulty: injected failure at reset (tests/helpers/gigpo_faulty_env.py)")
        if SLOW_EVERY and count % SLOW_EVERY == 0:
            time.sleep(SLOW_S)
        return super().reset(seed=seed, options=options)


class FaultyGridNavProc(FaultyGridNav):
    """``FaultyGridNav`` hosted in environment worker processes (``thread_parallel = False``): every
    ``FAIL_EVERY``-th reset in each worker process raises (the CPU e2e test kills one of those processes)."""

    thread_parallel = False


class StepFaultyGridNav(GridNavEnv):
    """``GridNavEnv`` whose tasks with an even seed raise ``RuntimeError`` at their ``fail_step``-th step (default 2):
    deterministic failed episodes, the same in every process (the local engine's tests)."""

    def __init__(self, *, fail_step: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.fail_step, self.seed, self.steps = int(fail_step), None, 0

    def reset(self, *, seed=None, options=None):
        self.seed, self.steps = seed, 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.seed is not None and self.seed % 2 == 0 and self.steps == self.fail_step:
            raise RuntimeError("gridnav_stepfault: injected failure at step (tests/helpers/gigpo_faulty_env.py)")
        return super().step(action)
