"""Trainer log-probs of the sampled token and of a candidate set (docs/math.md §3.2, §3.3, §4).

Only the sampled column and the K candidate columns are read from the logits: the single
O(V) quantity is the log-normaliser (full-vocabulary logsumexp), and with a recorded support
not even that (the normaliser is over the S support columns). So the loss takes either dense
(N, V) logits or a `GatheredLogits` record (those columns plus the log-normaliser) that the
trainer computes a chunk of tokens at a time without ever holding (N, V).
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


@dataclass(frozen=True)
class GatheredLogits:
    """The logits the correction reads, without the (N, V) matrix (docs/math.md §3.3).

    ids:      (N, C) int64 columns: column 0 is the sampled token, columns 1.. the candidate
              set's ids (padding clamped to 0), in the order `loss_columns` lays them out
    z:        (N, C) float, the logits at `ids` (already divided by the temperature)
    log_norm: (N,)  float, logsumexp of the logits over the FULL vocabulary

    Both `z` and `log_norm` carry gradient; whoever produced them turns `dz` and `dlog_norm`
    into the logit gradient `scatter(ids, dz) + softmax(z_V) · dlog_norm` (one (N, V) buffer for
    dense logits, a chunk at a time in the trainer's lm-head pass).
    """

    ids: Tensor
    z: Tensor
    log_norm: Tensor

    @property
    def num_tokens(self) -> int:
        return self.ids.shape[0]


def loss_columns(sampled_ids: Tensor, candidate_ids: Tensor | None) -> Tensor:
    """(N, 1 + K) the columns a loss reads: the sampled id, then the candidate ids (or (N, 1))."""
    if candidate_ids is None:
        return sampled_ids[:, None]
    return torch.cat([sampled_ids[:, None], candidate_ids.clamp_min(0)], dim=1)


class _DenseGather(torch.autograd.Function):
    """Dense (N, V) logits → `GatheredLogits` fields `(z at ids, logsumexp_V)`, exactly.

    Backward writes the logit gradient into one (N, V) buffer,
    `dz = scatter_add(ids, g_z) + softmax(z) · g_norm`, instead of autograd's several (zero-filled
    gather scatters, logsumexp's softmax, and their sums).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor):
        ctx.set_materialize_grads(False)
        log_norm = torch.logsumexp(logits, dim=1)  # (N,)
        ctx.save_for_backward(logits, log_norm, ids)
        return logits.gather(1, ids), log_norm

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_z: Tensor | None, grad_norm: Tensor | None):
        logits, log_norm, ids = ctx.saved_tensors
        if grad_norm is None:
            grad = torch.zeros_like(logits)
        else:
            grad = torch.sub(logits, log_norm[:, None]).exp_()  # softmax, the one (N, V) allocation
            grad.mul_(grad_norm[:, None])
        if grad_z is not None:
            grad.scatter_add_(1, ids, grad_z)
        return grad, None


def gather_columns(logits: Tensor, ids: Tensor) -> GatheredLogits:
    """The exact adapter from dense (N, V) logits to the record the correction reads."""
    z, log_norm = _DenseGather.apply(logits, ids)
    return GatheredLogits(ids, z, log_norm)


def gather_logprobs(
    logits: Tensor | GatheredLogits, sampled_ids: Tensor, candidates: Candidates | None
) -> tuple[Tensor, Tensor | None]:
    """Differentiable `log p(a)` (N,) and `log p(v), v ∈ H` (N, K) (0 at padding).

    Without an exact candidate set: `log p(v) = z_v − logsumexp_V(z)` (full softmax).
    With a recorded support S: `log p_S(v) = z_v − logsumexp_{u∈S}(z_u)` (§4). A row whose
    support is empty gets `log p_S(a) = 0` and no gradient (nothing was recorded to learn from).
    Padding slots are 0 before anything multiplies them (§3.3).

    `logits` is dense (N, V) or a `GatheredLogits` whose `ids` are
    `loss_columns(sampled_ids, candidates.ids)`; both give the same values and gradients.
    """
    ids = loss_columns(sampled_ids, None if candidates is None else candidates.ids)
    gathered = logits if isinstance(logits, GatheredLogits) else gather_columns(logits, ids)
    if gathered.ids.shape != ids.shape or not torch.equal(gathered.ids, ids):
        raise ValueError(
            f"gathered logits hold columns of shape {tuple(gathered.ids.shape)} but this loss reads "
            f"{tuple(ids.shape)}: build them with loss_columns(sampled_ids, candidate ids)"
        )
    if candidates is not None and candidates.exact:
        logp = _support_logprobs(gathered.z, candidates.valid)
    else:
        logp = gathered.z - gathered.log_norm[:, None]
    if candidates is None:
        return logp[:, 0], None
    return logp[:, 0], logp[:, 1:].masked_fill(~candidates.valid, 0.0)


def _support_logprobs(z: Tensor, valid: Tensor) -> Tensor:
    """`z_v − logsumexp_{u∈S} z_u` for the gathered columns `z` = [a, S...] (N, 1 + S)."""
    empty = ~valid.any(dim=1, keepdim=True)
    # An empty row normalises over {a} alone, so no row is all −inf (whose logsumexp
    # backward would produce NaN).
    first = torch.where(empty, z[:, :1], torch.full_like(z[:, :1], float("-inf")))
    log_norm = torch.logsumexp(torch.cat([first, torch.where(valid, z[:, 1:], float("-inf"))], dim=1), dim=1)
    return z - log_norm[:, None]


def log_ratio(trainer_logprobs: Tensor, sampler_logprobs: Tensor) -> Tensor:
    """`lr = clamp(log p − log q, −20, 20)`, elementwise (§3.3; q underflow gives +20, not inf)."""
    return (trainer_logprobs - sampler_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
