"""Mismatch, importance-weight and score-centering diagnostics (docs/math.md §6).

Pure functions of detached tensors. Per-token functions return (N,) so a caller can aggregate
by pool or staleness bucket; the reducers return 0-dim tensors (no `.item()`: the caller
decides when to synchronise). Means over zero tokens are 0, not NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlmix.correction.centering import Centering
from rlmix.correction.logprobs import log_ratio as clamped_log_ratio

K3_TOKEN_CAP = 10.0  # §6: clamp k3 per token so one outlier cannot dominate the mean
RATIO_TAIL_BAND = (0.2, 5.0)  # §6: share of tokens with r outside this band
# Bins of the trainer's probability of the sampled token, [edges[i], edges[i+1]), the last closed:
# where the mismatch and the gradient sit (the probe's rlmix.eval.where, training's rlmix.metrics.where).
PROB_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 1.0)
# Bins of the ratio r = p/q of the sampled token, [edges[i], edges[i+1]), the last open to ∞: which
# band of the ratio carries the gradient (training's rlmix.metrics.where). Its edges include the
# bands' edges the corrections use (MIS's default [0.5, 5], RATIO_TAIL_BAND's [0.2, 5]).
RATIO_EDGES = (0.0, 0.2, 0.5, 0.8, 1.25, 2.0, 5.0)


def _mean(x: Tensor) -> Tensor:
    return x.sum() / max(x.numel(), 1)


def kl_k3_per_token(log_ratio: Tensor) -> Tensor:
    """`k3 = exp(lr) − 1 − lr` per token, clamped to ≤ 10 (unbiased for KL(q‖p) before the clamp; ≥ 0)."""
    return (log_ratio.exp() - 1.0 - log_ratio).clamp_max(K3_TOKEN_CAP)


@dataclass(frozen=True)
class TokenMismatch:
    """Per-token values, (N,) each, detached: `log_ratio = clamp(log p(a) − log q(a), −20, 20)`, `kl_k3`."""

    log_ratio: Tensor
    kl_k3: Tensor


def token_mismatch(trainer_logprobs: Tensor, sampler_logprobs: Tensor) -> TokenMismatch:
    """Per-token log-ratio and k3 of the sampled tokens, for aggregation per pool / staleness bucket."""
    lr = clamped_log_ratio(trainer_logprobs.detach(), sampler_logprobs.detach().to(trainer_logprobs.dtype))
    return TokenMismatch(lr, kl_k3_per_token(lr))


def kl_k3(log_ratio: Tensor) -> Tensor:
    return _mean(kl_k3_per_token(log_ratio))


def kl_k1(log_ratio: Tensor) -> Tensor:
    """`mean(−lr)`: unbiased for KL(q‖p) with a ~ q, can be negative."""
    return _mean(-log_ratio)


def logprob_abs_diff(log_ratio: Tensor) -> Tensor:
    return _mean(log_ratio.abs())


def multiplicative_error(log_ratio: Tensor) -> Tensor:
    """`exp(mean |lr|)`; ≈ 1.03–1.05 is the usual acceptable line."""
    return logprob_abs_diff(log_ratio).exp()


def ratio_tail_frac(log_ratio: Tensor, low: float = RATIO_TAIL_BAND[0], high: float = RATIO_TAIL_BAND[1]) -> Tensor:
    """Share of tokens whose ratio `r = exp(lr)` lies outside [low, high]."""
    r = log_ratio.exp()
    return _mean(((r < low) | (r > high)).to(log_ratio.dtype))


def effective_sample_size(weights: Tensor) -> Tensor:
    """`(Σw)² / (n · Σw²)` in [0, 1]; 0 when every weight is 0."""
    denom = weights.numel() * weights.square().sum()
    return torch.where(denom > 0, weights.sum().square() / denom.clamp_min(torch.finfo(weights.dtype).tiny), 0.0)


def masked_frac(weights: Tensor) -> Tensor:
    return _mean((weights == 0).to(weights.dtype))


def mismatch_stats(log_ratio: Tensor) -> dict[str, Tensor]:
    return {
        "kl_k3": kl_k3(log_ratio),
        "kl_k1": kl_k1(log_ratio),
        "logprob_abs_diff": logprob_abs_diff(log_ratio),
        "ratio_tail_frac": ratio_tail_frac(log_ratio),
    }


def weight_stats(weights: Tensor, masks: bool) -> dict[str, Tensor]:
    """weight_mean and ess; masked_frac only for weights that can be exactly 0 (MIS)."""
    stats = {"weight_mean": _mean(weights), "ess": effective_sample_size(weights)}
    if masks:
        stats["masked_frac"] = masked_frac(weights)
    return stats


def centering_stats(centering: Centering) -> dict[str, Tensor]:
    """Token means of ρ (sc_tail_ratio; ≫ 1 is a collapse signature), P_H, Q_H and `Σ_H |c_v|`."""
    return {
        "sc_tail_ratio": _mean(centering.tail_ratio),
        "sc_head_mass": _mean(centering.head_mass),
        "sc_sampler_head_mass": _mean(centering.sampler_head_mass),
        "sc_coef_l1": _mean(centering.coefficients.abs().sum(dim=1)),
    }


def check_alignment(
    sampled_ids: Tensor, sampler_logprobs: Tensor, candidate_ids: Tensor, candidate_logprobs: Tensor
) -> Tensor:
    """Max |log q(a) in the candidate row − recorded log q(a)| over tokens whose `a` is a candidate (§3.3).

    Catches misaligned rows. Pass head log-probs for full-vocabulary sampling, or
    `support_probs.log()` with support ids when the sampler truncated (head log-probs are
    full-softmax values and differ from a truncated sampler's log q_S(a) by log S). 0 when no
    sampled token is among its candidates. Shapes: (N,), (N,), (N, K), (N, K).
    """
    match = candidate_ids == sampled_ids[:, None]
    recorded = sampler_logprobs.to(candidate_logprobs.dtype)[:, None].expand_as(candidate_logprobs)
    # Equal infinities are aligned; written this way so −inf − (−inf) never yields NaN.
    diff = torch.where(candidate_logprobs == recorded, 0.0, (candidate_logprobs - recorded).abs())
    diff = torch.where(match, diff, 0.0)
    if diff.numel() == 0:
        return diff.new_zeros(())
    return diff.amax()


def bin_index(values: Tensor, edges: tuple[float, ...], *, closed_last: bool) -> Tensor:
    """(N,) int64 bin of each value: i where ``edges[i] <= v < edges[i+1]``.

    ``closed_last``: ``edges`` bound the values on both sides and the top edge belongs to the last
    bin (len(edges) − 1 bins); otherwise values from ``edges[-1]`` up form one more, open bin
    (len(edges) bins). Values below ``edges[0]`` go to bin 0.
    """
    inner = edges[1:-1] if closed_last else edges[1:]
    return torch.bucketize(values, torch.tensor(inner, dtype=values.dtype), right=True)
