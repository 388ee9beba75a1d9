"""Diagnostics (docs/math.md §6) and group advantages, against hand-computed values."""

from __future__ import annotations

import math

import torch

from rlmix.correction import (
    check_alignment,
    effective_sample_size,
    group_advantages,
    kl_k1,
    kl_k3,
    kl_k3_per_token,
    logprob_abs_diff,
    masked_frac,
    multiplicative_error,
    ratio_tail_frac,
    token_loss,
    token_mismatch,
)


def test_kl_estimators_and_ratio_diagnostics_by_hand():
    lr = torch.tensor([0.0, math.log(2.0), -math.log(4.0), 20.0], dtype=torch.float64)
    k3 = torch.tensor([0.0, 2 - 1 - math.log(2), 0.25 - 1 + math.log(4), 10.0], dtype=torch.float64)
    torch.testing.assert_close(kl_k3_per_token(lr), k3)
    torch.testing.assert_close(kl_k3(lr), k3.mean())
    torch.testing.assert_close(kl_k1(lr), -lr.mean())
    torch.testing.assert_close(logprob_abs_diff(lr), lr.abs().mean())
    torch.testing.assert_close(multiplicative_error(lr), lr.abs().mean().exp())
    # r = [1, 2, 0.25, e^20]: only e^20 lies outside [0.2, 5].
    torch.testing.assert_close(ratio_tail_frac(lr), torch.tensor(0.25, dtype=torch.float64))
    assert ratio_tail_frac(torch.tensor([math.log(0.19), math.log(5.1), 0.0])) == torch.tensor(2 / 3)


def test_token_mismatch_clamps_before_k3():
    m = token_mismatch(torch.tensor([-1.0, -3.0, -1.0]), torch.tensor([-1.0, float("-inf"), -50.0]))
    torch.testing.assert_close(m.log_ratio, torch.tensor([0.0, 20.0, 20.0]))
    torch.testing.assert_close(m.kl_k3, torch.tensor([0.0, 10.0, 10.0]))


def test_weight_diagnostics_by_hand():
    w = torch.tensor([1.0, 1.0, 0.0, 2.0])
    torch.testing.assert_close(effective_sample_size(w), torch.tensor(16.0 / 24.0))
    torch.testing.assert_close(effective_sample_size(torch.ones(5)), torch.tensor(1.0))
    assert effective_sample_size(torch.zeros(3)) == 0.0
    torch.testing.assert_close(masked_frac(w), torch.tensor(0.25))


def test_loss_stats_are_the_token_means_of_token_stats():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(20, 15, generator=gen)
    sampled = torch.randint(0, 15, (20,), generator=gen)
    logq = torch.log_softmax(z + torch.randn(20, 15, generator=gen), dim=1).gather(1, sampled[:, None])[:, 0]
    out = token_loss(z, sampled, logq, torch.ones(20), mode="mis")
    ts = out.token_stats
    torch.testing.assert_close(ts["log_ratio"], (torch.log_softmax(z, 1).gather(1, sampled[:, None])[:, 0] - logq))
    torch.testing.assert_close(out.stats["kl_k3"], ts["kl_k3"].mean())
    torch.testing.assert_close(out.stats["weight_mean"], ts["weight"].mean())
    assert set(out.stats) == {"kl_k3", "kl_k1", "logprob_abs_diff", "ratio_tail_frac", "weight_mean", "ess", "masked_frac"}
    assert not any(t.requires_grad for t in [*out.stats.values(), *ts.values()])
    assert set(token_loss(z, sampled, logq, torch.ones(20), mode="none").stats) == {
        "kl_k3", "kl_k1", "logprob_abs_diff", "ratio_tail_frac"}


def test_check_alignment_finds_misaligned_rows():
    sampled = torch.tensor([2, 5, 7, 1])
    recorded = torch.tensor([-1.0, -2.0, -0.5, float("-inf")])
    ids = torch.tensor([[2, 3], [5, -1], [0, 1], [1, 4]])
    logprobs = torch.tensor([[-1.0, -3.0], [-2.3, float("-inf")], [-0.1, -0.2], [float("-inf"), -1.0]])
    # Row 0 aligned, row 1 off by 0.3, row 2 has a outside H (ignored), row 3 aligned at −inf.
    torch.testing.assert_close(check_alignment(sampled, recorded, ids, logprobs), torch.tensor(0.3))
    assert check_alignment(sampled[:1], recorded[:1], ids[:1], logprobs[:1]) == 0.0


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 2.0, 3.0, 5.0, 4.0])
    groups = torch.tensor([10, 10, 10, 2, 2, 99])
    centred = torch.tensor([0.0, -1.0, 1.0, -1.0, 1.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards, groups, normalize_std=False), centred)
    # Sample std: group 10 → 1, group 2 → √2, group 99 (one sample) → advantage 0.
    eps = 1e-6
    expected = torch.tensor([0.0, -1 / (1 + eps), 1 / (1 + eps), -1 / (math.sqrt(2) + eps), 1 / (math.sqrt(2) + eps), 0.0])
    torch.testing.assert_close(group_advantages(rewards, groups, normalize_std=True, eps=eps), expected)


def test_group_advantages_match_torch_std_and_are_permutation_equivariant():
    gen = torch.Generator().manual_seed(1)
    groups = torch.randint(0, 5, (40,), generator=gen) * 7 + 3
    rewards = torch.randint(0, 2, (40,), generator=gen)  # integer rewards are accepted
    adv = group_advantages(rewards, groups, normalize_std=True)
    for g in groups.unique():
        r = rewards[groups == g].float()
        if r.numel() > 1:
            torch.testing.assert_close(adv[groups == g], (r - r.mean()) / (r.std() + 1e-6))
    perm = torch.randperm(40, generator=gen)
    torch.testing.assert_close(group_advantages(rewards[perm], groups[perm], normalize_std=True), adv[perm])
