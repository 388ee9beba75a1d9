"""Score-centering coefficients, top-K form with a modelled tail (docs/math.md §3.2, §4).

    P_H = Σ_{v∈H} p_v,   Q_H = Σ_{v∈H} q_v
    ρ   = max(1 − Q_H, 1e-6) / max(1 − P_H, 1e-6)      (ρ = 1 for a recorded support: no tail)
    α   = ρ · f(1/ρ)
    c_v = q_v · f(p_v/q_v) − α · p_v,   v ∈ H            (0 at padding)

The loss then carries `+A · Σ_{v∈H} c_v · log p(v)` per token. With `q_v = ρ p_v` on the tail
this equals the exact §3.1 centering term, because `Σ_all p_v s_v = 0` folds the tail into the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlmix.correction.logprobs import log_ratio
from rlmix.correction.weights import WeightFunction

TAIL_FLOOR = 1e-6  # §3.3: 1 − Σ_H can round to ≤ 0 in fp32


@dataclass(frozen=True)
class Centering:
    """coefficients (N, K) c_v; tail_ratio (N,) ρ; head_mass (N,) P_H; sampler_head_mass (N,) Q_H. All detached."""

    coefficients: Tensor
    tail_ratio: Tensor
    head_mass: Tensor
    sampler_head_mass: Tensor


def centering_coefficients(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    valid: Tensor,
    weight: WeightFunction,
    exact: bool = False,
) -> Centering:
    """SC coefficients for candidates `H`.

    trainer_logprobs: (N, K) log p(v) (detached here), sampler_logprobs: (N, K) log q(v),
    valid: (N, K) bool (False at padding; values there are ignored), exact: H is the whole
    support of q (ρ := 1).
    """
    # p = q = 0 at padding (§3.3: mask first). Every head term is then exactly 0 there,
    # whatever the padding log-probs were (even if lr is NaN: min(0, 0), 0·keep and q are 0).
    pad = ~valid
    logp, logq = trainer_logprobs.detach(), sampler_logprobs
    p = logp.exp().masked_fill_(pad, 0.0)
    q = logq.exp().masked_fill_(pad, 0.0)
    head_mass, sampler_head_mass = p.sum(dim=1), q.sum(dim=1)
    if exact:
        tail_ratio = torch.ones_like(head_mass)
    else:
        tail_ratio = (1.0 - sampler_head_mass).clamp_min(TAIL_FLOOR) / (1.0 - head_mass).clamp_min(TAIL_FLOOR)
    alpha = weight.tail_scale(tail_ratio)
    term = weight.head_term(p, q, log_ratio(logp, logq))
    coefficients = torch.addcmul(term, alpha[:, None], p, value=-1.0)  # q_v f(r_v) − α p_v
    return Centering(coefficients, tail_ratio, head_mass, sampler_head_mass)
