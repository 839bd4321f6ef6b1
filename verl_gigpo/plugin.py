"""verl plug-in entry point (``[project.entry-points."verl.plugins"] gigpo = "verl_gigpo.plugin"``).

``import verl`` imports this module in every process; it registers, through verl's own registries, the advantage
estimators (:data:`verl_gigpo.STEP_CREDIT_ESTIMATORS`), the agent loop ``gigpo_env_agent``, the V1 trainer mode
``gigpo_sync``, the ``cpu`` platform and ``hf`` rollout backend, the once-per-process warning filter and the
appending file logger, each when verl imports its registry. A failure is logged at ERROR (verl would hide it at
DEBUG); :func:`ensure_registered` lets entry points check. docs/configuration.md ("How the plug-in fits into verl").
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from verl_gigpo import AGENT_LOOP_NAME, ESTIMATOR_NAME, STEP_CREDIT_ESTIMATORS, TRAINER_MODE, verl_logger

__all__ = [
    "ADV_ESTIMATORS",
    "AGENT_LOOP_NAME",
    "ESTIMATOR_NAME",
    "TRAINER_MODE",
    "ensure_registered",
    "gigpo_adv_estimator",
    "make_adv_estimator",
]

logger = verl_logger(__name__)
#: the plug-in's lines (loaded, failed) in one format, whoever configured logging first (verl's basicConfig in its
#: processes, a command's own before it imports verl)
LINE_FORMAT = "%(levelname)s %(name)s: %(message)s"
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter(LINE_FORMAT))
    logger.addHandler(_handler)
logger.propagate = False


_STEP_FIELDS = ("step_rewards", "group_ids", "traj_ids", "step_ids", "anchor_keys")


def make_adv_estimator(method: str) -> Any:
    """The function registered as verl's ``method`` advantage estimator (``"gigpo"``, ``"hgpo"``, ``"graphgpo"`` or
    ``"g2po"``): ``(token_level_rewards (N, L), response_mask (N, L), config=None, index=None, **kwargs) ->
    (advantages (N, L), returns (N, L))``.

    It needs ``step_rewards``, ``traj_ids``, ``step_ids``, ``anchor_keys`` (``group_ids`` defaults to ``index``;
    optional ``row_mask``, ``won``, ``action_valid``) as keyword arguments, which only the ``gigpo_sync`` trainer mode
    passes, and computes :meth:`GiGPOConfig.advantage_terms` from ``config`` (verl's ``algorithm`` section); without
    them it raises ``ValueError`` naming the trainer mode.
    """
    if method not in STEP_CREDIT_ESTIMATORS:
        raise ValueError(f"{method!r} is not a step-credit estimator; use one of {list(STEP_CREDIT_ESTIMATORS)}")

    def adv_estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any = None,
        index: np.ndarray | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if index is not None and "group_ids" not in kwargs:
            kwargs["group_ids"] = index
        missing = [name for name in _STEP_FIELDS if kwargs.get(name) is None]
        if missing:
            raise ValueError(
                f"adv_estimator='{method}' needs per-step data ({', '.join(missing)}) that verl's generic "
                f"advantage path does not pass. Use the GiGPO trainer mode, which supplies it: "
                f"trainer.v1.trainer_mode={TRAINER_MODE} (set by `python -m verl_gigpo.main`, i.e. the config "
                f"verl_gigpo/config/gigpo_trainer.yaml), with actor_rollout_ref.rollout.agent.default_agent_loop="
                f"{AGENT_LOOP_NAME}."
            )
        from verl_gigpo.config import GiGPOConfig

        terms = GiGPOConfig.from_algorithm(config, method=method).advantage_terms(
            kwargs["step_rewards"],
            response_mask,
            np.asarray(kwargs["group_ids"], dtype=object),
            np.asarray(kwargs["traj_ids"], dtype=object),
            np.asarray(kwargs["step_ids"]),
            np.asarray(kwargs["anchor_keys"], dtype=object),
            row_mask=kwargs.get("row_mask"),
            won=kwargs.get("won"),
            action_valid=kwargs.get("action_valid"),
        )
        return terms.token_level(response_mask)  # (N, L), (N, L)

    adv_estimator.__name__ = adv_estimator.__qualname__ = f"{method}_adv_estimator"
    adv_estimator.__doc__ = f"verl's ``{method}`` advantage estimator (see :func:`make_adv_estimator`)."
    return adv_estimator


#: method -> the function registered under that name (one object each, so registering again is accepted)
ADV_ESTIMATORS = {method: make_adv_estimator(method) for method in STEP_CREDIT_ESTIMATORS}
#: the ``"gigpo"`` estimator function (see :func:`make_adv_estimator`)
gigpo_adv_estimator = ADV_ESTIMATORS[ESTIMATOR_NAME]


def _register_estimator(_module: Any = None) -> None:
    from verl.trainer.ppo.core_algos import register_adv_est

    for method, function in ADV_ESTIMATORS.items():
        register_adv_est(method)(function)  # the same function again is accepted


def _register_agent_loop(_module: Any = None) -> None:
    import verl_gigpo.verl_glue.agent_loop  # noqa: F401  - @register("gigpo_env_agent")


def _register_trainer_mode(_module: Any = None) -> None:
    import verl_gigpo.verl_glue.trainer  # noqa: F401  - @register_trainer("gigpo_sync")


def _append_metrics(_module: Any = None) -> None:
    from verl_gigpo.verl_glue.metrics_file import append_file_logger

    append_file_logger()  # verl's file logger appends in launches of verl_gigpo.main (GIGPO_METRICS_APPEND=1)


#: verl module -> the registration into it, run when (and only if) that module is imported in this process
_LAZY = (
    ("verl.trainer.ppo.core_algos", _register_estimator),
    ("verl.experimental.agent_loop.agent_loop", _register_agent_loop),
    ("verl.trainer.ppo.v1", _register_trainer_mode),
    ("verl.utils.tracking", _append_metrics),
)


def _register() -> None:
    """Register the CPU platform now, every other piece when verl imports its registry (a post-import hook)."""
    import wrapt

    from verl_gigpo.verl_glue.cpu import register_cpu_backends
    from verl_gigpo.verl_glue.quiet import quiet_repeated_warnings

    if os.environ.get("GIGPO_TIMELINE"):
        # start-up timestamps (benchmarks/bench_verl_cpu.py), dev-only: imported only when asked for
        from verl_gigpo.dev.timeline import install as install_timeline

        install_timeline()
    register_cpu_backends()
    quiet_repeated_warnings()  # TransferQueue's thread-count warning: once per process, not on every put and get
    for module, hook in _LAZY:
        wrapt.register_post_import_hook(hook, module)


def ensure_registered() -> None:
    """Run every registration now and raise ``RuntimeError`` (with the cause) unless the estimators, agent loop and
    trainer mode are registered: verl hides plug-in import errors, so entry points check."""
    try:
        from verl_gigpo.verl_glue.cpu import register_cpu_backends

        register_cpu_backends()
        for _, hook in _LAZY:
            hook()
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        from verl_gigpo.verl_glue.contract import check_contract

        check_contract(__name__)  # the registries read below
    except Exception as exc:
        raise RuntimeError(f"verl_gigpo could not register itself into verl: {exc!r}") from exc
    registries = (
        *((m, ADV_ESTIMATOR_REGISTRY) for m in STEP_CREDIT_ESTIMATORS),
        (AGENT_LOOP_NAME, _agent_loop_registry),
    )
    missing = [name for name, registry in (*registries, (TRAINER_MODE, TRAINER_REGISTRY)) if name not in registry]
    if missing:
        raise RuntimeError(f"verl_gigpo did not register {missing} into verl")


try:
    _register()
except Exception:
    logger.error("verl_gigpo plug-in failed to load; GiGPO will be unavailable in verl", exc_info=True)
    raise
else:
    logger.info(
        "verl_gigpo plug-in loaded: adv_estimator=%s, agent loop %r, trainer mode %r (registered when verl imports "
        "their registries)",
        "|".join(STEP_CREDIT_ESTIMATORS),
        AGENT_LOOP_NAME,
        TRAINER_MODE,
    )
