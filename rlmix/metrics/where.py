"""Which generated tokens of a step hold the sampler–trainer mismatch and carry the gradient.

Per generated token t: the trainer's probability of the sampled token p_t (at the sampling
temperature), the mismatch |lr_t| = |log p_t − log q_t| and the norm of the loss's gradient with
respect to the token's logits, g_t = ‖∂loss/∂ℓ_t‖ (``TokenBatch.logit_grad_norm``; every parameter
gradient reaches the model through these). Σ_t g_t² is the squared norm of the step's whole
logit gradient, so g_t² / Σ g² is each token's exact share of it; a gradient-norm spike shows up
as a few tokens holding most of that sum (``where/grad_top1pct``).

Tokens are binned by p_t with the probe's edges (``rlmix.correction.diagnostics.PROB_EDGES``). Per bin the step
logs the bin's share of the tokens, of Σ |lr| and of Σ g² (names.py, where/). They are binned a
second time by the ratio r_t = p_t / q_t (``RATIO_EDGES``), with each band's share of the tokens
and of Σ g²: which side of a correction's band the gradient comes from. Under a mask the bands it
drops carry none; without one they show what a mask would drop. A step with no mismatch at all,
or no gradient (every advantage zero), leaves the corresponding shares out.
"""

from __future__ import annotations

import math

import torch

from rlmix.correction.diagnostics import PROB_EDGES, RATIO_EDGES, RATIO_TAIL_BAND, bin_index
from rlmix.metrics import names as m
from rlmix.rollout import Rollouts

TOP_FRACTION = 0.01  # where/grad_top1pct


def prob_bin_names(edges: tuple[float, ...] = PROB_EDGES) -> tuple[str, ...]:
    """``p0-0.001``, ``p0.001-0.01``, ... ``p0.9-1``: metric-name suffixes of the probability bins."""
    return tuple(f"p{a:g}-{b:g}" for a, b in zip(edges[:-1], edges[1:]))


def ratio_bin_names(edges: tuple[float, ...] = RATIO_EDGES) -> tuple[str, ...]:
    """``r0-0.2``, ``r0.2-0.5``, ... ``r5-inf``: metric-name suffixes of the ratio bands."""
    return tuple(f"r{a:g}-{b:g}" for a, b in zip(edges, (*edges[1:], math.inf)))


def _shares(values: torch.Tensor, index: torch.Tensor, prefix: str,
            names: tuple[str, ...] = prob_bin_names()) -> dict[str, float]:
    total = float(values.sum())
    if not total > 0:
        return {}
    sums = torch.zeros(len(names), dtype=torch.float64).index_add_(0, index, values)
    return {f"{prefix}/{name}": float(sums[i]) / total for i, name in enumerate(names)}


def where_metrics(batch: Rollouts, token_stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """The where/ metrics of one step; empty without the per-token log-ratios."""
    log_ratio = token_stats.get("log_ratio")
    if log_ratio is None or not log_ratio.numel():
        return {}
    lr = log_ratio.detach().double().cpu()
    logp = token_stats.get("logp")
    if logp is None or logp.shape != lr.shape:  # lr + log q is log p wherever the clamp did not act
        logp = lr + batch.sampler_logprobs[batch.mask].detach().double().cpu()
    index = bin_index(logp.detach().double().cpu().exp(), PROB_EDGES, closed_last=True)
    band = bin_index(lr.exp(), RATIO_EDGES, closed_last=False)
    ones, bands = torch.ones_like(lr), ratio_bin_names()
    out = _shares(ones, index, m.WHERE_TOKENS) | _shares(lr.abs(), index, m.WHERE_MISMATCH)
    out |= _shares(ones, band, m.WHERE_TOKENS, bands)
    norms = token_stats.get("logit_grad_norm")
    if norms is None or norms.shape != lr.shape or bool(norms.isnan().any()):
        return out  # no backward reached the logits (or a path that does not record them)
    energy = norms.detach().double().cpu().square()
    total = float(energy.sum())
    if not total > 0:
        return out
    out |= _shares(energy, index, m.WHERE_GRAD) | _shares(energy, band, m.WHERE_GRAD, bands)
    top = max(1, math.ceil(TOP_FRACTION * energy.numel()))
    out[m.WHERE_GRAD_TOP] = float(energy.topk(top).values.sum()) / total
    low, high = RATIO_TAIL_BAND
    tail = (lr < math.log(low)) | (lr > math.log(high))
    out[m.WHERE_GRAD_RATIO_TAIL] = float(energy[tail].sum()) / total
    return out
