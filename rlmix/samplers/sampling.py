"""One sampling step over a batch of logits: truncation, the draw, and what the record needs.

Pure tensor functions (docs/math.md §3.2 and §4). For logits ``z`` (N, V) at temperature T:

    full distribution      q(v)   = softmax(z / T)_v
    kept set S             top-k first, then top-p on the top-k-renormalised distribution
    sampled distribution   q_S(v) = q(v) / Σ_{u∈S} q(u) · 1[v ∈ S]   (= q when nothing truncates)

Truncation rules (ties are always kept, so the kept set may exceed k):
- top-k: keep every token whose logit is ≥ the k-th largest logit.
- top-p: sort the top-k-renormalised probabilities descending; the smallest prefix whose mass
  reaches ``top_p`` is needed (a token is needed when the mass strictly before it is < top_p);
  keep every token whose probability is ≥ the smallest needed one. At least one token is kept.

The draw is by inverse CDF on q_S with one uniform per row (drawn by the caller, so a row's
draw does not depend on the rest of the batch). Recorded per row:
``logprob = log q_S(a)``; ``head`` = top-K of log q (full vocabulary, NOT renormalised; -1/-inf
padding when K > V); ``support`` = S with q_S probabilities, descending (-1/0 padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepDraw:
    """One step for N rows."""

    tokens: torch.Tensor  # (N,) int64
    logprobs: torch.Tensor  # (N,) float32: log q_S(a)
    head_ids: torch.Tensor | None  # (N, K) int64
    head_logprobs: torch.Tensor | None  # (N, K) float32
    support_ids: torch.Tensor | None  # (N, S) int64
    support_probs: torch.Tensor | None  # (N, S) float32
    kept: torch.Tensor  # (N,) int64: size of the kept set


def keep_mask(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Kept set (N, V) bool for temperature-scaled logits ``scaled`` (rules in the module docstring)."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        keep = scaled >= kth
    if top_p < 1.0:
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        needed = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
        cutoff = sorted_probs.gather(-1, needed - 1)
        keep = keep & (probs >= cutoff)
    return keep


def _top_slots(values: torch.Tensor, slots: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``slots`` entries of ``values`` (N, V) descending, padded with (-1, fill) past V."""
    n, vocab = values.shape
    top = torch.topk(values, min(slots, vocab), dim=-1)
    ids, vals = top.indices, top.values
    if slots > vocab:
        ids = torch.cat([ids, ids.new_full((n, slots - vocab), -1)], dim=-1)
        vals = torch.cat([vals, vals.new_full((n, slots - vocab), fill)], dim=-1)
    return ids, vals


def draw(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_k: int, top_p: float,
         num_candidates: int, support_slots: int) -> StepDraw:
    """Truncate, draw with ``uniforms`` (N,) in [0, 1), and record (see module docstring)."""
    scaled = logits.float() / temperature
    full_logprobs = torch.log_softmax(scaled, dim=-1)
    truncates = top_p < 1.0 or top_k > 0
    keep = keep_mask(scaled, top_k, top_p) if truncates else None
    sampled_logprobs = (
        torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1) if truncates else full_logprobs
    )
    probs = sampled_logprobs.exp()
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:]
    # right=True picks the first index whose cdf exceeds the target: a token with q_S > 0.
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    head_ids = head_logprobs = support_ids = support_probs = None
    if num_candidates > 0:
        head_ids, head_logprobs = _top_slots(full_logprobs, num_candidates, float("-inf"))
    if truncates and support_slots > 0:
        support_ids, support_probs = _top_slots(probs.masked_fill(~keep, -1.0), support_slots, 0.0)
        support_ids = support_ids.masked_fill(support_probs < 0, -1)
        support_probs = support_probs.clamp(min=0.0)
    kept = keep.sum(dim=-1) if truncates else torch.full_like(tokens, logits.shape[-1])
    return StepDraw(
        tokens=tokens,
        logprobs=sampled_logprobs.gather(-1, tokens[:, None]).squeeze(-1),
        head_ids=head_ids,
        head_logprobs=head_logprobs,
        support_ids=support_ids,
        support_probs=support_probs,
        kept=kept,
    )


def check_support(kept_max: int, slots: int) -> None:
    """Refuse a record whose kept set outgrew its ``slots`` support slots (it would be cut silently)."""
    if kept_max > slots:
        raise ValueError(f"the kept set reached {kept_max} tokens but support_slots={slots}; "
                         "raise support_slots to at least the vocabulary size or top_k plus ties")
