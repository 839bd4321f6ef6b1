"""The embedded single-machine engine (CPU or one GPU): generation server, PPO update, training loop.

    python -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model
    python -m verl_gigpo.local.train actor_rollout_ref.model.path=artifacts/tiny-model

The modules and how an iteration runs: docs/local-engine.md. Nothing heavy is imported here.
"""
