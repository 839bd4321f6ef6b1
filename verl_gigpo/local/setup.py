"""What :class:`~verl_gigpo.local.train.LocalTrainer` builds from its config before training: the model, the allowed
token ids, the sampling parameters, the episodes' settings and the update's row split."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.rules import validation_sampling
from verl_gigpo.rollout import EpisodeConfig, TaskSpec, make_task_env
from verl_gigpo.rollout.step_rows import UpdateSettings

__all__ = ["action_token_ids", "load_model", "sampling_params", "update_settings"]

logger = logging.getLogger(__name__)


def load_model(path: str, device: torch.device, *, seed: int, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """``(tokenizer, model)`` of the Hugging Face folder ``path``, float32 on ``device``, built under ``seed`` (global
    torch RNG left as it was); a vision-language model loads with ``AutoModelForImageTextToText``.
    ValueError: no such folder.
    """
    from transformers import AutoTokenizer

    from verl_gigpo.rollout.vision import load_model_only

    if not Path(path).is_dir():
        raise ValueError(
            f"actor_rollout_ref.model.path={path!r} is not a directory; build a tiny model with "
            f"`python -m verl_gigpo.dev.tiny_model --out {path}` or point it at a Hugging Face model folder"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = load_model_only(path, trust_remote_code=trust_remote_code)
    return tokenizer, model.to(device)


def action_token_ids(
    cfg: DictConfig, tokenizer: Any, eos_token_ids: list[int], episode_config: EpisodeConfig
) -> list[int]:
    """Sorted token ids of the environment's action words (plus ``eos_token_ids`` when replies may be longer);
    ValueError when the environment gives no fixed action list."""
    env_kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True)
    env = make_task_env(TaskSpec(cfg.env.name, 0, cfg.env.train_split, env_kwargs), episode_config)
    try:
        _, info = env.reset(seed=0, options={"split": cfg.env.train_split})
        actions = info.get("admissible_actions") or env.example_actions()
    finally:
        env.close()
    if not actions:
        raise ValueError(
            f"local.constrain_to_actions needs an environment with a fixed action list; {cfg.env.name} "
            "gives none: set local.constrain_to_actions=false"
        )
    ids: list[int] = []
    for action in actions:
        for tok in tokenizer.encode(action, add_special_tokens=False):
            if tok not in ids:
                ids.append(tok)
    if cfg.actor_rollout_ref.rollout.response_length > 1:
        ids += [i for i in eos_token_ids if i not in ids]
    logger.info("decoding restricted to %d token ids of the actions %s", len(ids), actions)
    return sorted(ids)


def sampling_params(cfg: DictConfig, allowed_ids: list[int] | None, *, validation: bool) -> dict[str, Any]:
    """The server's sampling parameters of training rollouts or of validation (``val_kwargs``: greedy when
    ``do_sample`` is false), restricted to ``allowed_ids``."""
    rollout = cfg.actor_rollout_ref.rollout
    if validation:
        decoding = validation_sampling(rollout.val_kwargs).params
    else:
        decoding = {"temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": rollout.top_k}
    params: dict[str, Any] = {
        "temperature": float(decoding["temperature"]),
        "top_p": float(decoding["top_p"]),
        "top_k": int(decoding["top_k"]),
        "max_tokens": int(rollout.response_length),
    }
    if allowed_ids is not None:
        params["allowed_token_ids"] = allowed_ids
    return params


def update_settings(cfg: DictConfig) -> UpdateSettings:
    """How the update splits the rows (``trainer.v1.gigpo_sync``); warns that ``ppo_mini_batch_size`` is then unused."""
    update = UpdateSettings.from_config(cfg)
    tasks = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if update.mini_batch_rows is not None and tasks is not None:
        logger.warning(
            "actor_rollout_ref.actor.ppo_mini_batch_size=%s is not used: trainer.v1.gigpo_sync.mini_batch_rows=%d "
            "splits the update by step rows (set ppo_mini_batch_size=null to silence this)",
            tasks,
            update.mini_batch_rows,
        )
    return update


def episode_config(cfg: DictConfig, gigpo: GiGPOConfig | None) -> EpisodeConfig:
    """How an episode is played (:meth:`EpisodeConfig.from_env`, as verl's agent loop builds it); ValueError names the
    key."""
    return EpisodeConfig.from_env(
        cfg.env,
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.actor_rollout_ref.rollout.response_length,
        key_mode=gigpo.env_key_mode if gigpo is not None else "state",
        field_keys={
            "max_prompt_length": "data.max_prompt_length",
            "max_response_length": "actor_rollout_ref.rollout.response_length",
        },
    )
