"""Importance ratios at token, sequence and geometric level, and the three loss aggregations
(docs/math.md §2, §5), against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlmix.correction import (
    ISLevel,
    LossAggregation,
    aggregation_scale,
    level_log_ratio,
    ppo_clip_loss,
    token_loss,
)

# Two sequences (ids 7 and 3) of 3 and 2 tokens.
SEQ = torch.tensor([7, 7, 7, 3, 3])
LR = torch.tensor([0.1, -0.3, 0.5, 0.2, 0.4], dtype=torch.float64)


def test_sequence_and_geometric_ratios_by_hand():
    seq = level_log_ratio(LR, SEQ, ISLevel.sequence)
    geo = level_log_ratio(LR, SEQ, ISLevel.geometric)
    torch.testing.assert_close(seq, torch.tensor([0.3, 0.3, 0.3, 0.6, 0.6], dtype=torch.float64))
    torch.testing.assert_close(geo, torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3], dtype=torch.float64))
    assert level_log_ratio(LR, None, ISLevel.token) is LR


def test_sequence_ratio_is_clamped_like_a_token_ratio():
    lr = torch.full((30,), 19.0, dtype=torch.float64)
    assert float(level_log_ratio(lr, torch.zeros(30, dtype=torch.long), ISLevel.sequence).max()) == 20.0


def test_sequence_levels_need_sequence_ids():
    with pytest.raises(ValueError, match="sequence_ids"):
        level_log_ratio(LR, None, ISLevel.sequence)


def _case(n_vocab: int = 6):
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(5, n_vocab, generator=gen, dtype=torch.float64)
    sampled = torch.tensor([0, 1, 2, 3, 4]) % n_vocab
    logp = torch.log_softmax(z, 1).gather(1, sampled[:, None])[:, 0]
    logq = logp - LR  # so that log p − log q = LR exactly
    adv = torch.tensor([1.0, 1.0, 1.0, -2.0, -2.0], dtype=torch.float64)
    return z, sampled, logq, adv


@pytest.mark.parametrize("mode,low,high,expected", [
    # sequence ratios: e^0.3 = 1.35 (in [0.5, 2]), e^0.6 = 1.82 (in) -> weight rho itself
    ("mis", 0.5, 2.0, [math.exp(0.3)] * 3 + [math.exp(0.6)] * 2),
    # band [0.5, 1.5]: the second sequence (1.82) is dropped whole
    ("mis", 0.5, 1.5, [math.exp(0.3)] * 3 + [0.0] * 2),
    # TIS cap 1.5 on the sequence ratio
    ("tis", 0.5, 5.0, [math.exp(0.3)] * 3 + [1.5] * 2),
])
def test_sequence_level_weights_by_hand(mode, low, high, expected):
    z, sampled, logq, adv = _case()
    out = token_loss(z, sampled, logq, adv, mode=mode, level="sequence", sequence_ids=SEQ, low=low, high=high, cap=1.5)
    torch.testing.assert_close(out.token_stats["weight"], torch.tensor(expected, dtype=torch.float64))


def test_geometric_mask_keeps_sequences_whose_mean_ratio_is_near_one():
    z, sampled, logq, adv = _case()
    out = token_loss(z, sampled, logq, adv, mode="mis", level="geometric", sequence_ids=SEQ, low=0.9, high=1.2)
    # geometric means e^0.1 = 1.105 (kept, weight 1.105) and e^0.3 = 1.35 (dropped)
    torch.testing.assert_close(out.token_stats["weight"],
                               torch.tensor([math.exp(0.1)] * 3 + [0.0] * 2, dtype=torch.float64))


def test_score_centering_refuses_a_sequence_level_weight():
    z, sampled, logq, adv = _case()
    head = torch.arange(6).expand(5, 6)
    with pytest.raises(ValueError, match="per token"):
        token_loss(z, sampled, logq, adv, mode="sc_mis", level="sequence", sequence_ids=SEQ,
                   head_ids=head, head_logprobs=torch.log_softmax(z, 1))


def test_bypass_ppo_at_sequence_level_masks_whole_sequences():
    z, sampled, logq, adv = _case()
    out = ppo_clip_loss(z, sampled, logq, adv, old="sampler", weight="mis", level="sequence", sequence_ids=SEQ,
                        low=0.5, high=1.5)
    torch.testing.assert_close(out.token_stats["weight"], torch.tensor([1.0, 1, 1, 0, 0], dtype=torch.float64))


@pytest.mark.parametrize("aggregation,expected", [
    ("token_mean", [1 / 5] * 5),
    ("seq_mean_token_mean", [1 / (2 * 3)] * 3 + [1 / (2 * 2)] * 2),
    ("seq_mean_token_sum", [1 / 2] * 5),
])
def test_aggregation_scales_by_hand(aggregation, expected):
    scale = aggregation_scale(LossAggregation(aggregation), SEQ, 5, num_tokens=None, num_sequences=None,
                              dtype=torch.float64, device=torch.device("cpu"))
    torch.testing.assert_close(scale, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("aggregation", list(LossAggregation))
def test_aggregation_with_global_counts_does_not_depend_on_the_split(aggregation):
    """Two calls over whole sequences with the step's global counts add up to one call's loss."""
    z, sampled, logq, adv = _case()
    kw = dict(mode="none", aggregation=aggregation, num_tokens=5, num_sequences=2)
    whole = token_loss(z, sampled, logq, adv, sequence_ids=SEQ, **kw).loss
    a, b = slice(0, 3), slice(3, 5)
    parts = (token_loss(z[a], sampled[a], logq[a], adv[a], sequence_ids=SEQ[a], **kw).loss
             + token_loss(z[b], sampled[b], logq[b], adv[b], sequence_ids=SEQ[b], **kw).loss)
    torch.testing.assert_close(parts, whole)


def test_seq_mean_token_sum_is_dr_grpo_loss_by_hand():
    z, sampled, logq, adv = _case()
    out = token_loss(z, sampled, logq, adv, mode="none", aggregation="seq_mean_token_sum", sequence_ids=SEQ)
    logp = torch.log_softmax(z, 1).gather(1, sampled[:, None])[:, 0]
    torch.testing.assert_close(out.loss, -(adv * logp).sum() / 2)
