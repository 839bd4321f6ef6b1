"""The embedded single-machine engine (CPU or one GPU): generation server, tiny-model builder, trainer.

    python -m verl_gigpo.local.tiny_model --out artifacts/tiny-model
    python -m verl_gigpo.local.train actor_rollout_ref.model.path=artifacts/tiny-model
    make demo                                  # = python -m verl_gigpo.local.demo

Submodules: :mod:`~verl_gigpo.local.server` (``LocalGenerationServer``), :mod:`~verl_gigpo.local.tiny_model`
(``build_tiny_model``), :mod:`~verl_gigpo.local.train` (``LocalTrainer``, the training loop),
:mod:`~verl_gigpo.local.demo` (the CPU demo). Nothing heavy is imported here.
"""
