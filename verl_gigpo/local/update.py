"""The local engine's actor update: PPO on one iteration's step rows with verl's registered policy losses.

    actor = PPOActor(model, cfg.actor_rollout_ref.actor, pad_token_id=pad, device=device, allowed_ids=ids)
    metrics = actor.update(batch, advantages, iteration=k)   # a StepBatch of N rows, advantages (N,): actor/* metrics

Loss per mini-batch: ``pg_loss - entropy_coeff * entropy + kl_loss_coef * kl``. The steps (de-duplicated forwards,
fixed log-probs, mini- and micro-batches): docs/local-engine.md, "The PPO update".

Shapes: N rows, U de-duplicated inputs, R the longest response, V' the allowed-token count (else the vocabulary).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from environments.images import pixel_key
from verl_gigpo.local.tensors import left_pad
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.vision import image_inputs, rope_positions

__all__ = ["PPOActor", "split_rows"]


@dataclass
class _Rows:
    """The batch's rows as tensors, the de-duplicated inputs that score them, and what stays fixed per row."""

    inputs: list[tuple[int, ...]]  # (U,) prompt + response[:-1]
    resp_lens: list[int]  # (U,) response length of each input
    inverse: np.ndarray  # (N,) int64: the input that scores each row
    images: list[list[Any]]  # (U,) the images each input's prompt shows (empty for text)
    tokens: torch.Tensor  # (N, R) int64: response tokens (their columns in allowed_ids when constrained)
    mask: torch.Tensor  # (N, R) float32: 1 on the response tokens
    adv: torch.Tensor | None = None  # (N, R) float32: the row's advantage on its response tokens
    old_logp: torch.Tensor | None = None  # (N, R) before the first optimizer step; None: only one step
    ref_logp: torch.Tensor | None = None  # (N, R) of the reference model; None: no KL loss


@dataclass
class _Sums:
    """The update's metrics as they add up over micro-batches (each loss divided by the optimizer-step count)."""

    totals: dict[str, float] = field(
        default_factory=lambda: {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0, "actor/entropy": 0.0}
    )
    # verl's policy-loss metrics, weighted by each micro-batch's share of the mini-batch's tokens
    weighted: dict[str, float] = field(
        default_factory=lambda: {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0, "actor/pg_clipfrac_lower": 0.0}
    )
    grad_norms: list[float] = field(default_factory=list)
    logprob_diff: float = 0.0  # largest |server - actor| log-prob of the same token


@dataclass
class _LossConfig:
    """The fields of verl's ``ActorConfig`` that the registered policy losses read."""

    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    global_batch_info: dict

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get``-style access for the fields above only (others give ``default``; verl_glue/contract checks)."""
        if key not in self.__dataclass_fields__:
            raise KeyError(
                f"verl's policy loss reads actor.{key}, which the local engine does not pass it (it passes "
                f"{sorted(self.__dataclass_fields__)}): use another actor.policy_loss.loss_mode, or add {key} to "
                "_LossConfig in verl_gigpo/local/update.py"
            )
        return getattr(self, key)

    @classmethod
    def from_actor(cls, actor: DictConfig, *, batch_num_tokens: float, global_batch_size: int) -> _LossConfig:
        """Clip ratios from ``actor`` and the mini-batch normalisers (so micro-batch losses add up exactly)."""
        clip = float(actor.clip_ratio)
        return cls(
            clip_ratio=clip,
            clip_ratio_low=float(actor.get("clip_ratio_low", None) or clip),
            clip_ratio_high=float(actor.get("clip_ratio_high", None) or clip),
            clip_ratio_c=float(actor.get("clip_ratio_c", None) or 3.0),
            loss_agg_mode=actor.loss_agg_mode,
            global_batch_info={
                "dp_size": 1,
                "batch_num_tokens": batch_num_tokens,
                "global_batch_size": global_batch_size,
            },
        )


class PPOActor:
    """The policy's PPO update: owns the optimizer (AdamW) and, with ``actor.use_kl_loss``, the frozen ``ref_model``.

    Args:
        actor: the ``actor_rollout_ref.actor`` config.
        allowed_ids: the sorted token ids decoding is restricted to (``local.constrain_to_actions``); None: all.
        mini_batch_rows: most step rows per optimizer step; None: ``actor.ppo_mini_batch_size`` tasks per step.
        shuffle_rows: with ``mini_batch_rows``, shuffle the rows each pass (RNG seeded by ``(seed, iteration, pass)``).
        image_processor: a vision-language model's image processor; None: a text model.
    """

    def __init__(
        self,
        model: Any,
        actor: DictConfig,
        *,
        pad_token_id: int,
        device: torch.device,
        allowed_ids: Sequence[int] | None = None,
        mini_batch_rows: int | None = None,
        shuffle_rows: bool = True,
        seed: int = 0,
        image_processor: Any = None,
    ) -> None:
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        self.model = model
        self.actor = actor
        self.pad_token_id = pad_token_id
        self.device = device
        self.allowed_ids = list(allowed_ids) if allowed_ids is not None else None
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if actor.use_kl_loss else None
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=float(actor.optim.lr), weight_decay=float(actor.optim.weight_decay)
        )
        self.policy_loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
        self.mini_batch_rows, self.shuffle_rows, self.seed = mini_batch_rows, shuffle_rows, int(seed)
        self.image_processor = image_processor

    def update(self, batch: StepBatch, advantages: np.ndarray, *, iteration: int = 0) -> dict[str, float]:
        """PPO update on the rows with ``row_mask``, per-row ``advantages`` (N,); ``iteration`` seeds the row shuffle.

        Returns ``actor/*``, ``rollout/{rows,forward_rows,logprob_diff_max}`` and, with ``mini_batch_rows``,
        ``update/*`` metrics (empty when no row is unmasked).
        """
        actor = self.actor
        kept = np.flatnonzero(batch.row_mask)  # (K,) rows that train
        if kept.size == 0:
            return {}
        batch, advantages = batch.select(kept), np.asarray(advantages)[kept]
        rows = self._rows(batch)
        rows.adv = torch.as_tensor(advantages, dtype=torch.float32, device=self.device)[:, None] * rows.mask
        passes = [
            split_rows(
                batch.group_ids,
                tasks_per_step=actor.ppo_mini_batch_size,
                mini_batch_rows=self.mini_batch_rows,
                rng=np.random.default_rng([self.seed, int(iteration), epoch]) if self.shuffle_rows else None,
            )
            for epoch in range(actor.ppo_epochs)
        ]
        n_steps = sum(len(minibatches) for minibatches in passes)
        rows.old_logp, rows.ref_logp = self._fixed_logprobs(rows, n_steps)
        sums = _Sums()
        self.model.train()
        for minibatches in passes:
            for rows_mb in minibatches:
                self._optimizer_step(batch, rows, rows_mb, n_steps, sums)
        self.model.eval()
        plan = {}
        if self.mini_batch_rows is not None:  # the names verl's gigpo_sync mode logs for its row split
            plan = {
                "update/rows": float(len(batch)),
                "update/mini_batch_rows": float(max(len(mb) for mb in passes[0])),
                "update/num_mini_batches": float(len(passes[0])),
            }
        return {
            **sums.totals,
            **sums.weighted,
            "actor/grad_norm": float(np.mean(sums.grad_norms)),
            "actor/lr": float(actor.optim.lr),
            "rollout/rows": float(len(batch)),
            "rollout/forward_rows": float(len(rows.inputs)),
            "rollout/logprob_diff_max": sums.logprob_diff,
            **plan,
        }

    def forward_logprobs(
        self,
        model: Any,
        inputs: Sequence[Sequence[int]],
        resp_lens: Sequence[int],
        images: Sequence[Sequence[Any]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies at the response positions of de-duplicated, left-padded inputs.

        ``inputs[u]`` = prompt + response[:-1]; its last R logits score the R response tokens. Inputs with ``images``
        are forwarded alone. Returns ``(logp (U, R_max, V'), entropy (U, R_max))``, left-aligned.
        """
        from verl.utils.torch_functional import entropy_from_logits

        r_max = max(resp_lens)
        if images is not None and any(images):
            logits = torch.cat(
                [self._image_logits(model, ids, shown, r_max) for ids, shown in zip(inputs, images, strict=True)]
            )  # (U, R_max, V)
        else:
            ids, attn, pos = left_pad(inputs, self.pad_token_id, device=self.device)  # (U, W) each
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r_max).logits
        logits = logits.float()  # (U, R_max, V)
        if self.allowed_ids is not None:
            logits = logits.index_select(-1, torch.tensor(self.allowed_ids, device=self.device))  # (U, R_max, V')
        shift = torch.tensor([r_max - r for r in resp_lens], device=self.device)  # (U,)
        index = (torch.arange(r_max, device=self.device)[None, :] + shift[:, None]).clamp(max=r_max - 1)  # (U, R)
        logits = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[-1]))  # (U, R_max, V') aligned
        return torch.log_softmax(logits, dim=-1), entropy_from_logits(logits)

    def _image_logits(self, model: Any, input_ids: Sequence[int], images: Sequence[Any], keep: int) -> torch.Tensor:
        """(1, keep, V) logits of the last ``keep`` positions of one unpadded input, with pixels and 4-row positions."""
        if images and self.image_processor is None:
            raise ValueError("step rows with images need PPOActor(image_processor=...): use a vision-language model")
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.device)  # (1, L)
        attention = torch.ones_like(ids)  # (1, L)
        if not images:
            return model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits
        vision = {k: v.to(self.device) for k, v in image_inputs(self.image_processor, images).items()}
        positions = rope_positions(model, ids, attention, vision["image_grid_thw"])  # (4, 1, L)
        return model(
            input_ids=ids, attention_mask=attention, position_ids=positions, **vision, logits_to_keep=keep
        ).logits

    # ------------------------------------------------------------------ the rows
    def _rows(self, batch: StepBatch) -> _Rows:
        """De-duplicate the batch's inputs and lay its response tokens out as (N, R) tensors on the device."""
        n_rows = len(batch)
        key_index: dict[tuple, int] = {}
        inverse = np.empty(n_rows, dtype=np.int64)  # (N,)
        inputs, resp_lens, images = [], [], []
        shown = batch.images if batch.images is not None else [[] for _ in range(n_rows)]
        for i, (p, r, pics) in enumerate(zip(batch.prompts, batch.responses, shown, strict=True)):
            # the same prompt, images and response-but-last-token: one forward
            key = (tuple(p), tuple(r[:-1]), tuple(pixel_key(image) for image in pics))
            j = key_index.get(key)
            if j is None:
                j = key_index[key] = len(inputs)
                inputs.append(key[0] + key[1])
                resp_lens.append(len(r))
                images.append(list(pics))
            inverse[i] = j
        r_max = max(resp_lens)
        tokens = torch.zeros((n_rows, r_max), dtype=torch.long)  # (N, R) response token columns
        mask = torch.zeros((n_rows, r_max), dtype=torch.float32)  # (N, R)
        col = {t: c for c, t in enumerate(self.allowed_ids)} if self.allowed_ids is not None else None
        for i, r in enumerate(batch.responses):
            tokens[i, : len(r)] = torch.tensor([col[t] for t in r] if col is not None else r)
            mask[i, : len(r)] = 1.0
        return _Rows(inputs, resp_lens, inverse, images, tokens.to(self.device), mask.to(self.device))

    def _fixed_logprobs(self, rows: _Rows, n_steps: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(old, ref)`` log-probs (N, R): old only with several optimizer steps, ref only with ``use_kl_loss``."""
        old_logp = ref_logp = None
        with torch.no_grad():
            if n_steps > 1:
                old_logp = self._row_logprobs(self.model, rows)
            if self.ref_model is not None:
                ref_logp = self._row_logprobs(self.ref_model, rows)
        return old_logp, ref_logp

    def _row_logprobs(self, model: Any, rows: _Rows) -> torch.Tensor:
        """Log-probs (N, R) of every row's response tokens, forwarded in micro-batches (no grad)."""
        micro = self.actor.ppo_micro_batch_size_per_gpu
        out = torch.zeros(rows.tokens.shape, dtype=torch.float32, device=self.device)  # (N, R)
        for start in range(0, len(rows.inputs), micro):
            stop = min(start + micro, len(rows.inputs))
            lp, _ = self.forward_logprobs(
                model, rows.inputs[start:stop], rows.resp_lens[start:stop], rows.images[start:stop]
            )
            picked = np.flatnonzero((rows.inverse >= start) & (rows.inverse < stop))
            rows_t = torch.as_tensor(picked, device=self.device)
            sel = torch.as_tensor(rows.inverse[picked] - start, device=self.device)
            width = lp.shape[1]
            out[rows_t, :width] = lp[sel].gather(-1, rows.tokens[rows_t, :width, None]).squeeze(-1)
        return out

    # ------------------------------------------------------------------ one optimizer step
    def _optimizer_step(self, batch: StepBatch, rows: _Rows, rows_mb: np.ndarray, n_steps: int, sums: _Sums) -> None:
        """Accumulate the gradients of the mini-batch ``rows_mb`` micro-batch by micro-batch, clip, step."""
        micro = self.actor.ppo_micro_batch_size_per_gpu
        n_tokens = float(rows.mask[rows_mb].sum())
        loss_cfg = _LossConfig.from_actor(self.actor, batch_num_tokens=n_tokens, global_batch_size=len(rows_mb))
        uniq = np.unique(rows.inverse[rows_mb])  # forwarded inputs of this mini-batch
        for start in range(0, len(uniq), micro):
            chunk = uniq[start : start + micro]
            picked = rows_mb[np.isin(rows.inverse[rows_mb], chunk)]
            self._micro_batch(batch, rows, chunk, picked, loss_cfg, n_steps, sums)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(self.actor.grad_clip))
        sums.grad_norms.append(float(grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _micro_batch(
        self,
        batch: StepBatch,
        rows: _Rows,
        chunk: np.ndarray,
        picked: np.ndarray,
        loss_cfg: _LossConfig,
        n_steps: int,
        sums: _Sums,
    ) -> None:
        """Forward the inputs ``chunk``, add the loss of their rows ``picked`` to the gradients and to ``sums``."""
        from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

        actor = self.actor
        logp, entropy = self._micro_logprobs(rows, chunk, picked)  # (n, R) each, with grad
        rows_t = torch.as_tensor(picked, device=self.device)
        m = rows.mask[rows_t]  # (n, R)
        if rows.old_logp is None:  # single optimizer step: the parameters are still the old ones
            old = logp.detach()
            sums.logprob_diff = max(sums.logprob_diff, _rollout_diff(batch, picked, old))
        else:
            old = rows.old_logp[rows_t]
        pg_loss, pg_metrics = self.policy_loss_fn(
            old_log_prob=old,
            log_prob=logp,
            advantages=rows.adv[rows_t],
            response_mask=m,
            loss_agg_mode=actor.loss_agg_mode,
            config=loss_cfg,
        )
        ent_loss = agg_loss(entropy, m, actor.loss_agg_mode, **loss_cfg.global_batch_info)
        loss = pg_loss - float(actor.entropy_coeff) * ent_loss
        if rows.ref_logp is not None:
            kld = kl_penalty(logp, rows.ref_logp[rows_t], actor.kl_loss_type)
            kl_loss = agg_loss(kld, m, actor.loss_agg_mode, **loss_cfg.global_batch_info)
            loss = loss + float(actor.kl_loss_coef) * kl_loss
            sums.totals["actor/kl_loss"] += float(kl_loss.detach()) / n_steps
        loss.backward()
        sums.totals["actor/pg_loss"] += float(pg_loss.detach()) / n_steps
        sums.totals["actor/entropy"] += float(ent_loss.detach()) / n_steps
        n_tokens = loss_cfg.global_batch_info["batch_num_tokens"]  # of the whole mini-batch
        share = float(m.sum()) / n_tokens / n_steps
        for k in sums.weighted:
            sums.weighted[k] += float(pg_metrics.get(k, 0.0)) * share

    def _micro_logprobs(self, rows: _Rows, chunk: np.ndarray, picked: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (n, R) of the rows ``picked`` (inputs ``chunk``), right-padded with zeros."""
        local = {int(u): k for k, u in enumerate(chunk)}
        logp_u, ent_u = self.forward_logprobs(
            self.model,
            [rows.inputs[u] for u in chunk],
            [rows.resp_lens[u] for u in chunk],
            [rows.images[u] for u in chunk],
        )
        sel = torch.tensor([local[int(rows.inverse[r])] for r in picked], device=self.device)  # (n,)
        rows_t = torch.as_tensor(picked, device=self.device)
        r_max, width = rows.tokens.shape[1], logp_u.shape[1]  # width: the longest response of this micro-batch
        logp = logp_u[sel].gather(-1, rows.tokens[rows_t, :width, None]).squeeze(-1)  # (n, width)
        logp = torch.nn.functional.pad(logp, (0, r_max - width))  # (n, R)
        entropy = torch.nn.functional.pad(ent_u[sel], (0, r_max - width))  # (n, R)
        return logp, entropy


def split_rows(
    group_ids: np.ndarray,
    *,
    tasks_per_step: int | None = None,
    mini_batch_rows: int | None = None,
    rng: np.random.Generator | None = None,
) -> list[np.ndarray]:
    """The rows (indices) of each mini-batch of one pass over K rows.

    ``mini_batch_rows`` M: ``ceil(K / M)`` near-equal mini-batches of the rows permuted by ``rng`` (None: in order).
    Else ``tasks_per_step`` tasks with all their rows each; None: one mini-batch.
    """
    n = len(group_ids)
    if mini_batch_rows is not None:
        order = rng.permutation(n) if rng is not None else np.arange(n)
        return [part for part in np.array_split(order, math.ceil(n / mini_batch_rows)) if part.size]
    groups = list(dict.fromkeys(group_ids.tolist()))  # first-appearance order
    per_step = tasks_per_step or len(groups)
    return [np.flatnonzero(np.isin(group_ids, groups[i : i + per_step])) for i in range(0, len(groups), per_step)]


def _rollout_diff(batch: StepBatch, picked: np.ndarray, actor_logp: torch.Tensor) -> float:
    """Largest ``|actor - server|`` log-prob over the rows ``picked`` (``actor_logp`` (n, R)); float rounding only."""
    worst = 0.0
    values = actor_logp.detach().cpu()
    for k, r in enumerate(picked):
        lp = batch.rollout_logprobs[r]
        if lp:
            n = len(lp)
            worst = max(worst, float((values[k, :n] - torch.tensor(lp)).abs().max()))
    return worst
