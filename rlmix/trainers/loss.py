"""From a rollout batch and a model to the corrected loss: the part every trainer backend shares.

The trainer computes its view of the batch once (``token_batch``: fp32 log-softmax of BF16
logits divided by the sampling temperature, docs/math.md §3.3) and hands it, with the sampler's
record, to the pure correction library. The logits arrive as the few columns the loss reads plus
the log-normaliser, computed a chunk of tokens at a time (``rlmix.trainers.lm_head``), so no
(N, V) tensor is made. The variant comes from its row in ``MODES``; the objective picks the
library function through ``OBJECTIVES``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlmix.config.schema import CorrectionConfig
from rlmix.correction import MODES, LossOutput, Objective, ppo_clip_loss, token_loss
from rlmix.rollout import Rollouts, sequence_input_ids  # noqa: F401 - sequence_input_ids: public here too
from rlmix.trainers.tokens import TokenBatch, masked_logits, token_batch  # noqa: F401 - masked_logits: ditto


def _reinforce(tokens: TokenBatch, cfg: CorrectionConfig, common: dict) -> LossOutput:
    return token_loss(mode=cfg.mode, head_ids=tokens.head_ids, head_logprobs=tokens.head_logprobs, **common)


def _ppo_clip(tokens: TokenBatch, cfg: CorrectionConfig, common: dict) -> LossOutput:
    # The variant's weight function multiplies the clipped term (IcePop for mis, §5).
    return ppo_clip_loss(weight=MODES[cfg.mode].weight, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                         old=cfg.old_logprobs, old_logprobs=tokens.old_logprobs, **common)


OBJECTIVES: dict[Objective, Callable[[TokenBatch, CorrectionConfig, dict], LossOutput]] = {
    Objective.reinforce: _reinforce,
    Objective.ppo_clip: _ppo_clip,
}


def batch_loss(
    model: torch.nn.Module,
    batch: Rollouts,
    advantages: torch.Tensor,  # (B,) detached sequence advantages
    cfg: CorrectionConfig,
    *,
    num_tokens: int,
    pad_id: int,
    autocast: torch.dtype | None,
    num_sequences: int | None = None,
) -> LossOutput:
    """The configured objective and correction on one micro-batch (docs/math.md §2–§5).

    ``num_tokens`` and ``num_sequences`` count the whole optimizer step (every micro-batch);
    ``num_sequences`` None: this micro-batch's rows with generated tokens.

    ``token_stats`` gains ``entropy``: (N,) detached trainer entropy per generated token.
    """
    device = next(model.parameters()).device
    batch, advantages = batch.to(device), advantages.to(device)
    centered = MODES[cfg.mode].centered and cfg.objective is Objective.reinforce
    tokens = token_batch(model, batch, pad_id=pad_id, autocast=autocast, replay_support=cfg.replay_support,
                         columns_for=centered)
    adv = advantages[:, None].expand_as(batch.mask)[batch.mask]  # (N,) sequence advantage on each token
    common = dict(
        logits=tokens.logits,
        sampled_ids=tokens.sampled_ids,
        sampler_logprobs=tokens.sampler_logprobs,
        advantages=adv,
        support_ids=tokens.support_ids,
        support_probs=tokens.support_probs,
        low=cfg.low,
        high=cfg.high,
        cap=cfg.cap,
        level=cfg.level,
        aggregation=cfg.aggregation,
        sequence_ids=tokens.sequence_ids,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
    out = OBJECTIVES[cfg.objective](tokens, cfg, common)
    return LossOutput(out.loss, out.stats, out.token_stats | {"entropy": tokens.entropy})
