"""Turn what a vLLM engine returns into the rollout record's tensors (pure functions).

How the vLLM backend gets the semantics of docs/math.md §3.2 and §4 (see docs/backends.md):

- The engine runs with ``logprobs_mode="raw_logprobs"`` and vLLM temperature 1.0, while the model's
  own logits scale is set to ``1/T``. vLLM then samples from ``softmax(trunc(z/T))`` — the same
  distribution as temperature ``T`` — and its raw log-probs are ``log q(v) = log_softmax(z/T)_v``
  over the FULL vocabulary at ``T``: exactly the head the record needs.
- vLLM 0.32 can return the kept set itself (``return_sampling_mask``) only with Model Runner V2,
  which needs Triton with a CPU backend; the CPU build refuses it. So the kept set is derived here
  from the full-vocabulary head: top-k and top-p keep a prefix of the distribution sorted
  descending, so R recorded slots determine the kept set whenever it fits in them.

vLLM's truncation rules (``apply_top_k_top_p_pytorch`` / ``apply_top_k_only``), on sorted
descending probabilities ``q_(1) ≥ q_(2) ≥ …``:

    top-k:  keep v  iff  z_v ≥ z_(k)                         (ties at the k-th value are kept)
    top-p:  on q^k = q renormalised over the top-k set, keep the i-th  iff  Σ_{j<i} q^k_(j) < p
            (the exclusive prefix mass; at least one token)
    q_S(v) = q(v) / Σ_{u∈S} q(u),   log q_S(a) = log q(a) − logsumexp_{u∈S} log q(u)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmix.samplers.sampling import check_support


@dataclass(frozen=True)
class FlatPositions:
    """vLLM ``FlatLogprobs`` of N generated positions, as tensors.

    With ``flat_logprobs=True`` vLLM writes R + 1 entries per position: the sampled token first,
    then the top-R tokens in rank order (the sampled token may appear twice).
    """

    sampled_ids: torch.Tensor  # (N,) int64
    sampled_logprobs: torch.Tensor  # (N,) float32: log q(a), full vocabulary at T
    top_ids: torch.Tensor  # (N, R) int64, descending log-prob
    top_logprobs: torch.Tensor  # (N, R) float32


def flat_positions(token_ids: list[int], logprobs: list[float], starts: list[int], slots: int) -> FlatPositions:
    """Gather N positions of R + 1 flat entries each into (N,) and (N, R) tensors."""
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    lps = torch.as_tensor(logprobs, dtype=torch.float32)
    start = torch.as_tensor(starts, dtype=torch.long)
    top = start[:, None] + 1 + torch.arange(slots)[None]  # (N, R) flat indices
    return FlatPositions(ids[start], lps[start], ids[top], lps[top])


@dataclass(frozen=True)
class KeptSet:
    """The kept set over R head slots (sorted descending)."""

    keep: torch.Tensor  # (N, R) bool
    log_mass: torch.Tensor  # (N,) float32: log Σ_{v∈S} q(v), 0 when nothing truncates
    covered: torch.Tensor  # (N,) bool: False when the kept set may extend past the R slots


def kept_set(top_logprobs: torch.Tensor, top_k: int, top_p: float, vocab_size: int) -> KeptSet:
    """vLLM's kept set (module docstring) from full-vocabulary log-probs (N, R) sorted descending.

    ``covered`` is False where the recorded slots cannot decide the set: the R-th slot is kept and
    a token outside the head could be kept too (a tie at the top-k value, or top-p mass not yet
    reached). A row whose R slots span the whole vocabulary is always covered.
    """
    n, slots = top_logprobs.shape
    keep = torch.ones((n, slots), dtype=torch.bool)
    open_end = torch.full((n,), slots < vocab_size)
    if 0 < top_k < vocab_size:
        if top_k > slots:
            return KeptSet(keep, torch.zeros(n), torch.zeros(n, dtype=torch.bool))
        kth = top_logprobs[:, top_k - 1 : top_k]
        keep = top_logprobs >= kth
        open_end = open_end & keep[:, -1]
    if top_p < 1.0:
        # q^k over the top-k set: the head covers it whenever top-k is on and covered.
        masked = top_logprobs.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(masked, dim=-1) if 0 < top_k < vocab_size else masked.exp()
        mass_before = torch.cumsum(probs, dim=-1) - probs
        keep = keep & (mass_before < top_p)
        keep[:, 0] = True
        open_end = open_end & keep[:, -1]
    log_mass = torch.logsumexp(top_logprobs.masked_fill(~keep, float("-inf")), dim=-1)
    return KeptSet(keep, log_mass, ~open_end)


def pad_slots(ids: torch.Tensor, values: torch.Tensor, slots: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut or right-pad (N, R) ids/values to ``slots`` columns with (-1, ``fill``)."""
    n, have = ids.shape
    if have >= slots:
        return ids[:, :slots], values[:, :slots]
    return (
        torch.cat([ids, ids.new_full((n, slots - have), -1)], dim=-1),
        torch.cat([values, values.new_full((n, slots - have), fill)], dim=-1),
    )


def support_record(top: FlatPositions, kept: KeptSet, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Support ids and post-filter probabilities q_S (N, slots), descending, (-1, 0) padding. A kept
    set larger than ``slots`` is refused, as the torch backend refuses it: cut, it would be a support
    that misses tokens (the drawn one, maybe) and does not sum to 1."""
    check_support(int(kept.keep.sum(dim=-1).max()) if len(kept.keep) else 0, slots)
    probs = torch.exp(top.top_logprobs - kept.log_mass[:, None]).masked_fill(~kept.keep, 0.0)
    ids = top.top_ids.masked_fill(~kept.keep, -1)
    return pad_slots(ids, probs, slots, 0.0)
