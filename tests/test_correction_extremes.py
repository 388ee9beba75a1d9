"""Extremes stay finite and correct (docs/math.md §3.3, §8): underflow, zero mass, all masked, padding."""

from __future__ import annotations

import pytest
import torch

from rlmix.correction import token_loss
from tests.test_correction_oracle import MODES, dense_grad, topk_case


def _run(x, *args, **kwargs):
    x = x.clone().requires_grad_(True)
    out = token_loss(x, *args, **kwargs)
    out.loss.backward()
    return out, x.grad


def _all_finite(out, grad):
    assert torch.isfinite(out.loss)
    assert torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in out.stats.values()), out.stats
    assert all(torch.isfinite(v).all() for v in out.token_stats.values())


@pytest.mark.parametrize("mode", MODES)
def test_sampler_logprob_underflow(mode):
    # q(a) = 0 (−inf), q(a) far below fp32's smallest normal, and an ordinary token.
    z = torch.tensor([[2.0, 0.0, -1.0, 0.5]] * 3)
    sampled = torch.tensor([1, 2, 0])
    logq = torch.tensor([float("-inf"), -200.0, -1.0])
    head_ids = torch.tensor([[0, 1, 2]] * 3)
    head_logprobs = torch.tensor([[-1.0, float("-inf"), -200.0]] * 3)
    out, grad = _run(z, sampled, logq, torch.tensor([1.0, -1.0, 0.5]), mode=mode, head_ids=head_ids, head_logprobs=head_logprobs)
    _all_finite(out, grad)
    torch.testing.assert_close(out.token_stats["log_ratio"][:2], torch.tensor([20.0, 20.0]))
    torch.testing.assert_close(out.token_stats["kl_k3"][:2], torch.tensor([10.0, 10.0]))
    expected_weight = {"none": 1.0, "sc": 1.0, "tis": 2.0, "sc_tis": 2.0, "mis": 0.0, "sc_mis": 0.0}[mode]
    torch.testing.assert_close(out.token_stats["weight"][:2], torch.full((2,), expected_weight))


@pytest.mark.parametrize("mode", MODES)
def test_zero_trainer_probability_on_head_tokens_matches_oracle(mode):
    case = topk_case(4, n=6, v=10, k=10, temperature=1.0, full=True)
    case.raw[:, 3] = -1e4  # p(3) = 0 exactly (in fp64 too), while q(3) > 0 and token 3 is in every head
    case.raw[0, case.sampled[0]] = -1e4  # and one sampled token with p(a) = 0
    x = case.raw.clone().requires_grad_(True)
    out = token_loss(x, case.sampled, case.sampler_logprobs, case.adv, mode=mode, head_ids=case.head_ids, head_logprobs=case.head_logprobs)
    out.loss.backward()
    _all_finite(out, x.grad)
    expected = dense_grad(case.raw, case.sampled, case.q, case.adv, mode)
    # atol: TIS weighs a p(a) = 0 token by the clamped ratio e^-20 (§3.3), the oracle by exactly 0.
    torch.testing.assert_close(x.grad, expected, rtol=1e-9, atol=1e-8)
    # The same in fp32, where the log-space ratios are what keep it finite.
    out32, grad32 = _run(case.raw.float(), case.sampled, case.sampler_logprobs.float(), case.adv.float(), mode=mode,
                         head_ids=case.head_ids, head_logprobs=case.head_logprobs.float())
    _all_finite(out32, grad32)
    torch.testing.assert_close(grad32.double(), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["mis", "sc_mis"])
def test_all_tokens_masked_by_mis(mode):
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(5, 8, generator=gen)
    sampled = torch.arange(5)
    logp = torch.log_softmax(z, dim=1)
    logq = logp.gather(1, sampled[:, None])[:, 0] + 3.0  # r = e^-3 < 0.5 everywhere
    head_ids = torch.arange(8).expand(5, 8)
    out, grad = _run(z, sampled, logq, torch.randn(5, generator=gen), mode=mode, head_ids=head_ids, head_logprobs=logp + 0.2)
    _all_finite(out, grad)
    assert out.stats["masked_frac"] == 1.0 and out.stats["weight_mean"] == 0.0 and out.stats["ess"] == 0.0
    if mode == "mis":
        assert out.loss == 0.0 and torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("mode", ["sc", "sc_tis", "sc_mis"])
def test_all_padding_head_row_is_the_uncentred_loss(mode):
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    sampled = torch.tensor([0, 1, 2, 3])
    logq = torch.log_softmax(z, dim=1).gather(1, sampled[:, None])[:, 0] - 0.3
    adv = torch.randn(4, generator=gen, dtype=torch.float64)
    pad_ids = torch.full((4, 3), -1)
    pad_lp = torch.full((4, 3), float("-inf"), dtype=torch.float64)
    out, grad = _run(z, sampled, logq, adv, mode=mode, head_ids=pad_ids, head_logprobs=pad_lp)
    ref, ref_grad = _run(z, sampled, logq, adv, mode=mode.removeprefix("sc_") if mode != "sc" else "none")
    _all_finite(out, grad)
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("mode", MODES)
def test_one_token_and_empty_supports_contribute_nothing(mode):
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(3, 7, generator=gen)
    sampled = torch.tensor([4, 2, 5])
    support_ids = torch.tensor([[-1, 4, -1], [-1, -1, -1], [5, 1, -1]])
    support_probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.7, 0.3, 0.0]])
    logq = torch.tensor([0.0, 0.0, torch.tensor(0.7).log()])
    adv = torch.tensor([1.0, 2.0, -1.0])
    out, grad = _run(z, sampled, logq, adv, mode=mode, support_ids=support_ids, support_probs=support_probs)
    _all_finite(out, grad)
    # Rows 0 (one-token support) and 1 (empty support): log p_S(a) = 0, no gradient at all.
    assert torch.count_nonzero(grad[:2]) == 0
    assert torch.count_nonzero(grad[2]) > 0
    assert out.token_stats["log_ratio"][0] == 0.0


def test_centering_ignores_whatever_sits_in_padding_slots():
    from rlmix.correction import centering_coefficients, make_weight

    logp = torch.tensor([[-0.9, float("-inf"), float("nan")]])
    logq = torch.tensor([[-0.7, float("-inf"), float("inf")]])
    valid = torch.tensor([[True, False, False]])
    for name in ("none", "tis", "mis"):
        c = centering_coefficients(logp, logq, valid, make_weight(name, low=0.5, high=5.0, cap=2.0))
        assert torch.isfinite(c.coefficients).all() and (c.coefficients[0, 1:] == 0).all()
        torch.testing.assert_close(c.head_mass, torch.tensor([0.9]).neg().exp())
