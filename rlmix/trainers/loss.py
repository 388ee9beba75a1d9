"""From a rollout batch and a model to the corrected loss: the part every trainer backend shares.

The trainer recomputes its own log-probs for the tokens the samplers drew (fp32 log-softmax of
BF16 logits, divided by the sampling temperature, docs/math.md §3.3) and hands them, with the
sampler's record, to the pure correction library. The logits reach the library as the few
columns it reads plus the log-normaliser, computed a chunk of tokens at a time
(``rlmix.trainers.lm_head``); ``masked_logits`` is the dense (N, V) form, for output layers that
cannot be chunked and for the probe, which needs whole distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmix.config.schema import CorrectionConfig, Objective
from rlmix.correction import MODES, CorrectionMode, ppo_clip_loss, token_loss
from rlmix.correction.logprobs import loss_columns
from rlmix.rollout import Rollouts
from rlmix.trainers.lm_head import token_logits

# The weight function each correction mode puts on the sampled token inside PPO clip.
_PPO_WEIGHT = {CorrectionMode.none: "none", CorrectionMode.tis: "tis", CorrectionMode.mis: "mis"}


@dataclass
class LossOutput:
    loss: torch.Tensor  # 0-dim, sum over this micro-batch's tokens / the GLOBAL token count
    stats: dict[str, torch.Tensor]  # 0-dim, means over this micro-batch's tokens
    token_stats: dict[str, torch.Tensor]  # (N,) detached, per masked token, row-major
    entropy: torch.Tensor  # (N,) detached trainer entropy per masked token
    num_tokens: int  # N: masked tokens in this micro-batch


def sequence_input_ids(batch: Rollouts, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and completion of each row laid end to end, right-padded.

    Returns ``input_ids`` (B, L) and ``target_pos`` (B, T): the position whose logits predict
    completion token t, i.e. prompt_len + t − 1. Right padding keeps every real token's
    causal context free of padding, so no attention mask is needed for the positions we read.
    """
    B, T = batch.completion_ids.shape
    lens = batch.prompt_lens  # (B,)
    device = batch.completion_ids.device
    L = int(lens.max()) + T
    input_ids = torch.full((B, L), pad_id, dtype=torch.long, device=device)
    P = batch.prompt_ids.shape[1]
    input_ids[:, :P] = batch.prompt_ids
    completion_pos = lens[:, None] + torch.arange(T, device=device)[None, :]  # (B, T)
    input_ids.scatter_(1, completion_pos, batch.completion_ids)
    return input_ids, completion_pos - 1


def masked_logits(model: torch.nn.Module, batch: Rollouts, pad_id: int, bf16: bool) -> torch.Tensor:
    """Trainer logits for the generated tokens, (N, V) fp32, divided by the sampling temperature."""
    input_ids, target_pos = sequence_input_ids(batch, pad_id)
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=input_ids).logits  # (B, L, V)
    V = logits.shape[-1]
    picked = logits.gather(1, target_pos[..., None].expand(-1, -1, V))  # (B, T, V)
    return picked[batch.mask].float() / batch.temperature  # (N, V)


def _per_token(x: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
    return None if x is None else x[mask]


def batch_loss(
    model: torch.nn.Module,
    batch: Rollouts,
    advantages: torch.Tensor,  # (B,) detached sequence advantages
    cfg: CorrectionConfig,
    num_tokens: int,
    pad_id: int,
    bf16: bool = True,
) -> LossOutput:
    """The configured objective and correction on one micro-batch (corrections.md §2–§5)."""
    device = next(model.parameters()).device
    batch, advantages = batch.to(device), advantages.to(device)
    mask = batch.mask
    adv = advantages[:, None].expand_as(mask)[mask]  # (N,) sequence advantage on each token
    support_ids = _per_token(batch.support_ids, mask) if cfg.replay_support else None
    support_probs = _per_token(batch.support_probs, mask) if cfg.replay_support else None
    head_ids = _per_token(batch.head_ids, mask)
    sampled_ids = batch.completion_ids[mask]
    centered = cfg.objective is not Objective.ppo_clip and MODES[cfg.mode].centered
    # The columns the loss reads: the support when replayed, else the head for SC, else none.
    candidate_ids = support_ids if support_ids is not None else head_ids if centered else None
    head = token_logits(model, batch, loss_columns(sampled_ids, candidate_ids), pad_id, bf16)
    common = dict(
        logits=head.logits,
        sampled_ids=sampled_ids,
        sampler_logprobs=batch.sampler_logprobs[mask],
        advantages=adv,
        support_ids=support_ids,
        support_probs=support_probs,
        low=cfg.low,
        high=cfg.high,
        cap=cfg.cap,
        num_tokens=num_tokens,
    )
    if cfg.objective is Objective.ppo_clip:
        out = ppo_clip_loss(
            weight=_PPO_WEIGHT[cfg.mode], eps_low=cfg.eps_low, eps_high=cfg.eps_high, **common
        )
    else:
        out = token_loss(
            mode=cfg.mode,
            head_ids=head_ids,
            head_logprobs=_per_token(batch.head_logprobs, mask),
            **common,
        )
    return LossOutput(out.loss, out.stats, out.token_stats, head.entropy, int(sampled_ids.shape[0]))
