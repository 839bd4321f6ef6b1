"""The embedded single-machine engine (CPU or one GPU): generation server, tiny-model builder, trainer.

    python -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model
    python -m verl_gigpo.local.train actor_rollout_ref.model.path=artifacts/tiny-model
    make demo                                  # = python -m verl_gigpo.dev.demo

Submodules, one responsibility each: :mod:`~verl_gigpo.local.train` (``LocalTrainer``, the training loop),
:mod:`~verl_gigpo.local.cli` (the command line), :mod:`~verl_gigpo.local.config` (defaults, overrides, checks),
:mod:`~verl_gigpo.local.setup` (model, action tokens, sampling parameters, row split),
:mod:`~verl_gigpo.local.server` (``LocalGenerationServer``), :mod:`~verl_gigpo.local.sampling` (its sampling
parameters and token draws), :mod:`~verl_gigpo.local.tensors` (``left_pad``), :mod:`~verl_gigpo.local.update`
(``PPOActor``, the PPO update of an iteration's step rows, :class:`verl_gigpo.rollout.step_rows.StepBatch`),
:mod:`~verl_gigpo.local.checkpoint` and :mod:`~verl_gigpo.local.run_folder` (checkpoints, the run folder's rules),
:mod:`~verl_gigpo.local.plots` (the learning curve). The tiny-model builder and the CPU demo live in
:mod:`verl_gigpo.dev`. Nothing heavy is imported here.
"""
