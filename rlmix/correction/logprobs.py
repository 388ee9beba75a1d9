"""Trainer log-probs of the sampled token and of a candidate set (docs/math.md §3.2, §3.3, §4).

Only the sampled column and the K candidate columns are gathered from the logits: the single
O(V) operation is the log-normaliser (full-vocabulary logsumexp), and with a recorded support
not even that (the normaliser is over the S support columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # §3.3: lr = clamp(log p − log q, −20, 20)


@dataclass(frozen=True)
class Candidates:
    """Per-token candidate set `H` with the sampler's log-probs over it.

    ids:              (N, K) int64, padding slots clamped to column 0 (see `valid`)
    valid:            (N, K) bool, False at padding (id −1 in the record)
    sampler_logprobs: (N, K) log q(v); 0 at padding, −inf where q(v) = 0
    exact:            True when `H` is the recorded sampling support (§4): q has no mass
                      outside it and the trainer renormalises over it, so there is no tail.
    """

    ids: Tensor
    valid: Tensor
    sampler_logprobs: Tensor
    exact: bool


def head_candidates(head_ids: Tensor, head_logprobs: Tensor) -> Candidates:
    """Top-K head (§3.2): log-probs under the sampler's full-vocabulary softmax."""
    valid = head_ids >= 0
    logq = head_logprobs.masked_fill(~valid, 0.0)
    return Candidates(head_ids.clamp_min(0), valid, logq, exact=False)


def support_candidates(support_ids: Tensor, support_probs: Tensor | None, dtype: torch.dtype) -> Candidates:
    """Recorded top-p/top-k support (§4): post-filter probabilities, each row summing to 1."""
    valid = support_ids >= 0
    if support_probs is None:  # renormalisation only needs the ids
        logq = torch.zeros(support_ids.shape, dtype=dtype, device=support_ids.device)
    else:
        probs = support_probs.to(dtype)
        logq = torch.where(valid, probs.log(), torch.zeros_like(probs))
    return Candidates(support_ids.clamp_min(0), valid, logq, exact=True)


class _GatherLogSoftmax(torch.autograd.Function):
    """`log_softmax(z)` at the sampled column (N,) and the head columns (N, K), padding → 0.

    Never materialises the (N, V) log-softmax. Backward writes the logit gradient into one
    (N, V) buffer, `dz = scatter_add(ids, g) − softmax(z) · Σ_j g_j`, instead of autograd's
    several (zero-filled gather scatters, logsumexp's softmax, and their sums).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, sampled_ids: Tensor, head_ids: Tensor, padding: Tensor):
        log_norm = torch.logsumexp(logits, dim=1, keepdim=True)  # (N, 1)
        logp_a = logits.gather(1, sampled_ids[:, None]).sub_(log_norm)[:, 0]
        logp_h = logits.gather(1, head_ids).sub_(log_norm).masked_fill_(padding, 0.0)
        ctx.save_for_backward(logits, log_norm, sampled_ids, head_ids, padding)
        return logp_a, logp_h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_a: Tensor, grad_h: Tensor):
        logits, log_norm, sampled_ids, head_ids, padding = ctx.saved_tensors
        grad_h = grad_h.masked_fill(padding, 0.0)  # padding outputs are constants
        grad = torch.sub(logits, log_norm).exp_()  # softmax, the one (N, V) allocation
        grad.mul_(-(grad_a + grad_h.sum(dim=1))[:, None])
        grad.scatter_add_(1, sampled_ids[:, None], grad_a[:, None])
        grad.scatter_add_(1, head_ids, grad_h)
        return grad, None, None, None


def gather_logprobs(
    logits: Tensor, sampled_ids: Tensor, candidates: Candidates | None
) -> tuple[Tensor, Tensor | None]:
    """Differentiable `log p(a)` (N,) and `log p(v), v ∈ H` (N, K) (0 at padding).

    Without an exact candidate set: `log p(v) = z_v − logsumexp_V(z)` (full softmax).
    With a recorded support S: `log p_S(v) = z_v − logsumexp_{u∈S}(z_u)` (§4). A row whose
    support is empty gets `log p_S(a) = 0` and no gradient (nothing was recorded to learn from).
    Padding slots are 0 before anything multiplies them (§3.3).
    """
    if candidates is not None and candidates.exact:
        ids = torch.cat([sampled_ids[:, None], candidates.ids], dim=1)
        logp = _support_logprobs(logits, ids, candidates.valid)
        return logp[:, 0], logp[:, 1:].masked_fill(~candidates.valid, 0.0)
    if candidates is None:
        no_head = sampled_ids.new_zeros((sampled_ids.shape[0], 0))
        logp_a, _ = _GatherLogSoftmax.apply(logits, sampled_ids, no_head, no_head.bool())
        return logp_a, None
    return _GatherLogSoftmax.apply(logits, sampled_ids, candidates.ids, ~candidates.valid)


def _support_logprobs(logits: Tensor, ids: Tensor, valid: Tensor) -> Tensor:
    """`z_v − logsumexp_{u∈S} z_u` for the columns `ids` = [a, S...] (N, 1 + S)."""
    z = logits.gather(1, ids)
    empty = ~valid.any(dim=1, keepdim=True)
    # An empty row normalises over {a} alone, so no row is all −inf (whose logsumexp
    # backward would produce NaN).
    first = torch.where(empty, z[:, :1], torch.full_like(z[:, :1], float("-inf")))
    log_norm = torch.logsumexp(torch.cat([first, torch.where(valid, z[:, 1:], float("-inf"))], dim=1), dim=1)
    return z - log_norm[:, None]


def log_ratio(trainer_logprobs: Tensor, sampler_logprobs: Tensor) -> Tensor:
    """`lr = clamp(log p − log q, −20, 20)`, elementwise (§3.3; q underflow gives +20, not inf)."""
    return (trainer_logprobs - sampler_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
