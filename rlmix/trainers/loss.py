"""From a rollout batch and a model to the corrected loss: the part every trainer backend shares.

The trainer computes its view of the batch once (``token_batch``: fp32 log-softmax of BF16
logits divided by the sampling temperature, docs/math.md §3.3) and hands it, with the sampler's
record, to the pure correction library. The logits arrive as the few columns the loss reads plus
the log-normaliser, computed a chunk of tokens at a time (``rlmix.trainers.lm_head``), so no
(N, V) tensor is made. The variant arrives resolved (``Correction``: its weight function and
whether it centres); the objective picks the library function through ``OBJECTIVES``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlmix.correction import (
    Correction,
    KLEstimator,
    LossOutput,
    Objective,
    aggregation_scale,
    kl_estimate,
    ppo_clip_loss,
    token_entropy,
    token_loss,
)
from rlmix.correction.logprobs import GatheredLogits, gather_logprobs
from rlmix.rollout import Rollouts
from rlmix.trainers.tokens import TokenBatch, token_batch


def _reinforce(tokens: TokenBatch, cfg: Correction, common: dict) -> LossOutput:
    return token_loss(mode=cfg.variant, head_ids=tokens.head_ids, head_logprobs=tokens.head_logprobs, **common)


def _ppo_clip(tokens: TokenBatch, cfg: Correction, common: dict) -> LossOutput:
    # The variant's weight function multiplies the clipped term (IcePop for mis, §5).
    return ppo_clip_loss(weight=cfg.variant.weight, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                         old=cfg.old_logprobs, old_logprobs=tokens.old_logprobs, **common)


OBJECTIVES: dict[Objective, Callable[[TokenBatch, Correction, dict], LossOutput]] = {
    Objective.reinforce: _reinforce,
    Objective.ppo_clip: _ppo_clip,
}


def batch_loss(
    model: torch.nn.Module,
    batch: Rollouts,
    advantages: torch.Tensor,  # (B,) detached sequence advantages
    cfg: Correction,
    *,
    num_tokens: int,
    pad_id: int,
    autocast: torch.dtype | None,
    num_sequences: int | None = None,
) -> LossOutput:
    """The configured objective and correction on one micro-batch (docs/math.md §2–§5).

    ``num_tokens`` and ``num_sequences`` count the whole optimizer step (every micro-batch);
    ``num_sequences`` None: this micro-batch's rows with generated tokens.

    ``token_stats`` gains ``entropy``: (N,) detached trainer entropy per generated token, and
    ``logit_grad_norm``: (N,) each token's logit-gradient norm, filled once ``loss`` is backpropagated.
    With ``cfg.kl_coef`` or ``cfg.entropy_coef`` above 0 the loss gains their terms (``regularized``).
    """
    device = next(model.parameters()).device
    batch, advantages = batch.to(device), advantages.to(device)
    centered = cfg.centered
    # The entropy bonus differentiates the whole distribution: dense (N, V) logits, not the chunked columns.
    tokens = token_batch(model, batch, pad_id=pad_id, autocast=autocast, replay_support=cfg.replay_support,
                         columns_for=None if cfg.entropy_coef > 0 else centered, replay_routes=cfg.routing_replay)
    adv = advantages[:, None].expand_as(batch.mask)[batch.mask]  # (N,) sequence advantage on each token
    common = dict(
        logits=tokens.logits,
        sampled_ids=tokens.sampled_ids,
        sampler_logprobs=tokens.sampler_logprobs,
        advantages=adv,
        support_ids=tokens.support_ids,
        support_probs=tokens.support_probs,
        level=cfg.level,
        aggregation=cfg.aggregation,
        sequence_ids=tokens.sequence_ids,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
    )
    out = OBJECTIVES[cfg.objective](tokens, cfg, common)
    if tokens.router_flip is not None:  # a mixture-of-experts model: its routing against the sampler's
        out = LossOutput(out.loss, out.stats, out.token_stats | {"router_flip": tokens.router_flip})
    if tokens.logit_grad_norm is not None:  # which tokens carry the gradient (rlmix.metrics.where)
        out = LossOutput(out.loss, out.stats, out.token_stats | {"logit_grad_norm": tokens.logit_grad_norm})
    if cfg.kl_coef == 0 and cfg.entropy_coef == 0:  # the study's loss, untouched
        return LossOutput(out.loss, out.stats, out.token_stats | {"entropy": tokens.entropy})
    scale = aggregation_scale(cfg.aggregation, tokens.sequence_ids, tokens.num_tokens, num_tokens=num_tokens,
                              num_sequences=num_sequences, dtype=out.loss.dtype, device=out.loss.device)
    return regularized(out, tokens, scale, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
                       entropy_coef=cfg.entropy_coef)


def regularized(out: LossOutput, tokens: TokenBatch, scale: torch.Tensor, *, kl_coef: float,
                kl_estimator: KLEstimator, entropy_coef: float) -> LossOutput:
    """``out`` plus Σ_t s_t (kl_coef · KL_t − entropy_coef · H_t): the one place these terms join the loss.

    KL_t: ``kl_estimator`` on log p(a) (renormalised over the recorded support when replayed, as
    π_ref's is) against ``tokens.ref_logprobs``; H_t: the entropy of the dense logits. s_t: the
    objective's own aggregation (``scale``), so the terms weigh tokens as the objective does.
    """
    loss, stats = out.loss, dict(out.stats)
    entropy = tokens.entropy
    if kl_coef > 0:
        if tokens.ref_logprobs is None:
            raise ValueError("correction.kl_coef > 0 needs the batch's ref_logprobs (the trainer's reference model)")
        # the columns the objective asked for: the support when replayed (log p renormalised over
        # it), the head when centered (full softmax), else the sampled token alone
        gathered = isinstance(tokens.logits, GatheredLogits) and tokens.logits.ids.shape[1] > 1
        candidates = tokens.candidates() if tokens.support_ids is not None or gathered else None
        logp_a, _ = gather_logprobs(tokens.logits, tokens.sampled_ids, candidates)
        kl = kl_estimate(logp_a, tokens.ref_logprobs, kl_estimator)
        loss = loss + kl_coef * (scale * kl).sum()
        stats["kl_ref"] = kl.detach().mean()
    if entropy_coef > 0:
        h = token_entropy(tokens.logits)
        loss = loss - entropy_coef * (scale * h).sum()
        entropy = h.detach()
        stats["entropy_bonus"] = entropy_coef * entropy.mean()
    return LossOutput(loss, stats, out.token_stats | {"entropy": entropy})
