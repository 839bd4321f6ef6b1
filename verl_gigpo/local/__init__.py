"""The embedded single-machine engine (CPU or one GPU): generation server, tiny-model builder, trainer.

    python -m verl_gigpo.local.tiny_model --out artifacts/tiny-model
    python -m verl_gigpo.local.train actor_rollout_ref.model.path=artifacts/tiny-model

Submodules: :mod:`~verl_gigpo.local.server` (``LocalGenerationServer``), :mod:`~verl_gigpo.local.tiny_model`
(``build_tiny_model``), :mod:`~verl_gigpo.local.train` (the training loop). Nothing heavy is imported here.
"""
