"""The local engine's rollout: a model, its generation server and the environments, playing episode groups.

    rollout = LocalRollout(cfg)                       # loads actor_rollout_ref.model.path on trainer.device
    episodes = rollout.validation_episodes()          # the fixed validation tasks, as LocalTrainer validates
    rollout.close()

The trainer and :mod:`verl_gigpo.evaluate` both play through it, so an evaluation plays what validation played
(docs/local-engine.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from environments import register_envs
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.local.server import LocalGenerationServer
from verl_gigpo.local.setup import action_token_ids, episode_config, load_model, sampling_params
from verl_gigpo.rollout import ChatPromptEncoder, EnvPool, Episode, TaskSpec, chat_template_kwargs_from, run_episode
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.execution.threads import EnvThreadPool
from verl_gigpo.rollout.seeding import VALIDATION_STREAM, EpisodeSeeds, seeded_sampling_from, training_stream
from verl_gigpo.rollout.vision import is_vision_config, load_processor

__all__ = ["LocalRollout", "local_device"]


def local_device(cfg: DictConfig) -> torch.device:
    """``trainer.device`` as a torch device; ValueError for an unknown name or a CUDA device torch does not see."""
    name = str(cfg.trainer.device)
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"trainer.device={name} (--device): not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.device={name} (--device) but torch sees no CUDA device (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'no'}); use cpu"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"trainer.device={name} (--device): torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


class LocalRollout:
    """A causal LM, its :class:`~verl_gigpo.local.server.LocalGenerationServer` and the environments of ``cfg``.

    ``gigpo``: the step-credit settings (their anchor key mode builds the environments), else None. ``model`` and
    ``tokenizer``: an already loaded pair; None loads ``actor_rollout_ref.model.path``. ``allowed_ids``: the token ids
    decoding is restricted to (``local.constrain_to_actions``; None: all).
    """

    def __init__(
        self, cfg: DictConfig, gigpo: GiGPOConfig | None = None, *, model: Any = None, tokenizer: Any = None
    ) -> None:
        self.cfg = cfg
        register_envs(OmegaConf.to_container(cfg.env.registry, resolve=True))  # env.registry: the user's environments
        self.device = local_device(cfg)
        model_cfg = cfg.actor_rollout_ref.model
        trust = bool(model_cfg.trust_remote_code)
        if model is None:
            tokenizer, model = load_model(model_cfg.path, self.device, seed=cfg.trainer.seed, trust_remote_code=trust)
        self.tokenizer, self.model = tokenizer, model
        # a vision-language model: its processor encodes image prompts and its image processor the pixels
        self.processor = None
        if is_vision_config(model.config):
            self.processor = load_processor(model_cfg.path, trust_remote_code=trust)
        self.image_processor = self.processor.image_processor if self.processor is not None else None
        self.server = LocalGenerationServer(
            self.model,
            self.tokenizer,
            device=str(self.device),
            max_batch_size=cfg.local.max_batch_size,
            default_max_tokens=cfg.actor_rollout_ref.rollout.response_length,
            seed=cfg.trainer.seed,
            image_processor=self.image_processor,
        )
        # data.apply_chat_template_kwargs (e.g. enable_thinking=false): the prompt verl's agent loop renders
        template_kwargs = chat_template_kwargs_from(cfg.data.get("apply_chat_template_kwargs", None))
        self.encoder = ChatPromptEncoder(self.tokenizer, chat_template_kwargs=template_kwargs, processor=self.processor)
        self.episode_config = episode_config(cfg, gigpo)
        self.env_kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True)
        self.allowed_ids = None
        if cfg.local.constrain_to_actions:
            self.allowed_ids = action_token_ids(cfg, self.tokenizer, self.server.eos_token_ids, self.episode_config)
        # environment calls: local.env_workers threads (0 = inline), or, for environments that are not
        # thread-parallel (ALFWorld), env.num_workers worker processes; every call under env.*_timeout_s
        self.execution = EnvExecution.from_config(cfg.env)
        self.env_executor = EnvThreadPool(cfg.local.env_workers, name="env")
        self.env_pool = EnvPool(num_workers=self.execution.resolve_workers(), execution=self.execution)
        self.loop = asyncio.new_event_loop()

    async def _play(
        self, tasks: list[TaskSpec], n: int, params: dict[str, Any], streams: list[str], first_task: int, bar: Any
    ) -> list[Episode]:
        async def counted(coro: Any) -> Episode:
            episode = await coro
            bar.update(1)
            return episode

        seeded = seeded_sampling_from(self.cfg.env)
        coros = []
        for g, (task, stream) in enumerate(zip(tasks, streams, strict=True), start=first_task):
            for k in range(n):
                seeds = EpisodeSeeds(self.rollout_seed, stream, task, k) if seeded else None
                coros.append(
                    run_episode(
                        task,
                        generator=self.server,
                        encoder=self.encoder,
                        tokenizer=self.tokenizer,
                        config=self.episode_config,
                        traj_id=f"{stream}-{g}-{k}",
                        group_id=f"task{g}",  # the id of the drawn task: its n episodes form one group
                        sampling_params=params,
                        seeds=seeds,
                        executor=self.env_executor,
                        env_pool=self.env_pool,
                        execution=self.execution,
                    )
                )
        if bar is not None:
            coros = [counted(c) for c in coros]
        return list(await asyncio.gather(*coros))

    @property
    def rollout_seed(self) -> int:
        """``actor_rollout_ref.rollout.seed`` (the local engine's default: ``trainer.seed``)."""
        return int(self.cfg.actor_rollout_ref.rollout.get("seed", self.cfg.trainer.seed))

    def play(
        self,
        tasks: list[TaskSpec],
        n: int,
        *,
        validation: bool,
        iteration: int | None = None,
        stream: str = VALIDATION_STREAM,
        progress: bool = False,
        first_task: int = 0,
    ) -> list[Episode]:
        """Play each task ``n`` times concurrently; ``len(tasks) * n`` episodes in (task, member) order.

        With ``iteration``, training draws ``first_task, first_task + 1, ...`` of that iteration, each in its training
        stream; without, every task plays in ``stream`` (validation's by default). Seeds: docs/reproducibility.md.
        """
        params = sampling_params(self.cfg, self.allowed_ids, validation=validation)
        self.server.forget_image_logits()  # the weights may have changed since the last rollout
        if iteration is None:
            streams = [stream] * len(tasks)
        else:
            streams = [training_stream(iteration, g) for g in range(first_task, first_task + len(tasks))]
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(tasks) * n, desc=f"{self.cfg.env.name} episodes", unit="ep")
        try:
            return self.loop.run_until_complete(self._play(tasks, n, params, streams, first_task, bar))
        finally:
            if bar is not None:
                bar.close()

    def validation_tasks(self) -> list[TaskSpec]:
        """The fixed validation tasks: seeds ``0 .. data.val_size - 1`` of ``env.val_split``."""
        cfg = self.cfg
        return [TaskSpec(cfg.env.name, s, cfg.env.val_split, self.env_kwargs) for s in range(cfg.data.val_size)]

    def validation_episodes(self, *, progress: bool = False) -> list[Episode]:
        """Each validation task played ``val_kwargs.n`` times with validation's sampling, in (task, member) order."""
        n = self.cfg.actor_rollout_ref.rollout.val_kwargs.n
        return self.play(self.validation_tasks(), n, validation=True, progress=progress)

    def close(self) -> None:
        """Stop the server, the environments and their workers, and the event loop."""
        self.loop.run_until_complete(self.server.aclose())
        self.env_pool.close()
        self.env_executor.shutdown(wait=True)
        self.loop.close()
