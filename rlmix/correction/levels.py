"""Sequence structure inside the flat token losses: the importance ratio's level and the loss's
aggregation (docs/math.md §2 and §5).

Both take ``sequence_ids`` (N,): for each token, the index of the sequence it belongs to (any
integers; tokens of one sequence share one). A call must hold whole sequences — the trainer's
micro-batches are whole rows — so per-sequence sums are complete inside it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmix.correction.logprobs import LOG_RATIO_CLAMP
from rlmix.correction.weights import ISLevel, LossAggregation


def _per_sequence(sequence_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(inverse (N,) into 0..S-1, token counts (S,), S) for the sequences present."""
    _, inverse, counts = torch.unique(sequence_ids, return_inverse=True, return_counts=True)
    return inverse, counts, counts.shape[0]


def level_log_ratio(log_ratio: Tensor, sequence_ids: Tensor | None, level: ISLevel) -> Tensor:
    """The log-ratio the weight function reads, on each token (N,), detached inputs expected.

        token:      lr_t
        sequence:   clamp(Σ_{t∈y} lr_t, ±20)       log ρ(y), ρ = Π_t r_t
        geometric:  Σ_{t∈y} lr_t / |y|             log of the geometric mean of y's ratios

    ``log_ratio`` is already clamped per token (§3.3); the sequence sum is clamped again, so a
    weight never exponentiates more than e^20. (Liu, Li et al., "When Speed Kills Stability";
    verl's rollout correction.)
    """
    level = ISLevel(level)
    if level is ISLevel.token:
        return log_ratio
    if sequence_ids is None:
        raise ValueError(f"level={level.value} needs sequence_ids (N,): the sequence of each token")
    if sequence_ids.shape != log_ratio.shape:
        raise ValueError(f"sequence_ids must be {tuple(log_ratio.shape)} like the tokens, got {tuple(sequence_ids.shape)}")
    inverse, counts, n_seq = _per_sequence(sequence_ids)
    sums = log_ratio.new_zeros(n_seq).index_add(0, inverse, log_ratio)
    if level is ISLevel.sequence:
        return sums.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)[inverse]
    return (sums / counts.to(sums.dtype))[inverse]


def aggregation_scale(
    aggregation: LossAggregation,
    sequence_ids: Tensor | None,
    n: int,
    *,
    num_tokens: int | Tensor | None,
    num_sequences: int | Tensor | None,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor:
    """Per-token factors s_t (N,) with loss = Σ_t s_t · ℓ_t.

        token_mean:           s_t = 1 / num_tokens                      (the study's)
        seq_mean_token_mean:  s_t = 1 / (num_sequences · |y(t)|)
        seq_mean_token_sum:   s_t = 1 / num_sequences                   (Dr. GRPO)

    ``num_tokens`` and ``num_sequences`` are the GLOBAL counts of the optimizer step (every
    micro-batch and rank), so the loss does not depend on how the step was split; None: this
    call's own (N, or the sequences present).
    """
    aggregation = LossAggregation(aggregation)
    if aggregation is LossAggregation.token_mean:
        count = max(n, 1) if num_tokens is None else num_tokens
        return torch.ones(n, dtype=dtype, device=device) / count
    if sequence_ids is None:
        raise ValueError(f"aggregation={aggregation.value} needs sequence_ids (N,): the sequence of each token")
    inverse, counts, n_seq = _per_sequence(sequence_ids)
    sequences = max(n_seq, 1) if num_sequences is None else num_sequences
    scale = torch.ones(n, dtype=dtype, device=device) / sequences
    if aggregation is LossAggregation.seq_mean_token_mean:
        scale = scale / counts.to(device=device, dtype=dtype)[inverse]
    return scale
