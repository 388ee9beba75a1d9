"""Terms added to the policy loss beside the corrected objective: KL to a reference policy and an
entropy bonus (docs/math.md §5's objective plus verl's ``kl_loss`` and ``entropy_coeff``).

Pure tensor functions; the trainer adds them to the loss in one place (``rlmix.trainers.loss``),
scaled per token like the objective (``aggregation_scale``).
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from rlmix.correction.logprobs import LOG_RATIO_CLAMP


class KLEstimator(enum.Enum):
    """Per-token estimators of KL(π ‖ π_ref) from a token a drawn from π (Schulman, "Approximating
    KL divergence", 2020): with d = log π_ref(a) − log π(a)."""

    k1 = "k1"  # −d: unbiased, can be negative
    k2 = "k2"  # d²/2: low variance, biased; its gradient is the reverse KL's
    k3 = "k3"  # e^d − d − 1: unbiased and ≥ 0 (verl's low_var_kl, GRPO's)


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator | str) -> Tensor:
    """(N,) per-token KL(π ‖ π_ref) estimate, differentiable through ``logprobs`` (N,) log π(a);
    ``ref_logprobs`` (N,) log π_ref(a) is detached. d is clamped to ±20 so e^d stays finite.

        k1 = −d        k2 = d² / 2        k3 = e^d − d − 1

    The tokens come from the sampler, not π; like verl and TRL the estimate ignores that (the
    mismatch it leaves is the mismatch the correction already measures).
    """
    estimator = KLEstimator(estimator)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"ref_logprobs must be {tuple(logprobs.shape)} like logprobs, got {tuple(ref_logprobs.shape)}")
    d = (ref_logprobs.detach().to(logprobs.dtype) - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator is KLEstimator.k1:
        return -d
    if estimator is KLEstimator.k2:
        return 0.5 * d * d
    return d.exp() - d - 1.0


def token_entropy(logits: Tensor) -> Tensor:
    """(N,) entropy −Σ_v p(v) log p(v) of each row of dense ``logits`` (N, V), differentiable."""
    logp = torch.log_softmax(logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
