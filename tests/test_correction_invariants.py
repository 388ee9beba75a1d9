"""Invariants of the correction loss (docs/math.md §1, §3, §4, §8): p == q, drift, top-p, worked example."""

from __future__ import annotations

import math

import pytest
import torch

from rlmix.correction import (
    MODES,
    WEIGHTS,
    CorrectionMode,
    Weight,
    centering_coefficients,
    make_weight,
    token_loss,
)
from tests.test_correction_oracle import MODES as MODE_NAMES

SC_MODES = [m for m in MODE_NAMES if m.startswith("sc")]


def _loss_and_grad(logits_leaf, logits, *args, **kwargs):
    out = token_loss(logits, *args, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, logits_leaf)
    return out, grad


# ------------------------------------------------------------------ p == q


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("source", ["head", "support"])
def test_p_equals_q_gives_zero_coefficients_and_plain_reinforce(mode, source):
    gen = torch.Generator().manual_seed(3)
    n, v, k = 12, 40, 6
    x = torch.randn(n, v, generator=gen, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    if source == "head":
        logp = torch.log_softmax(x.detach(), dim=1)
        ids = torch.topk(logp, k, dim=1).indices
        sampled = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]  # often outside the head
        kw = dict(head_ids=ids, head_logprobs=logp.gather(1, ids))
    else:
        ids = torch.topk(x.detach(), k, dim=1).indices
        logp = torch.log_softmax(x.detach().gather(1, ids), dim=1)  # trainer renormalised over the support
        sampled = ids[:, 0]
        kw = dict(support_ids=ids, support_probs=logp.exp())
        logp = torch.full_like(x, -torch.inf).scatter(1, ids, logp)
    sampler_logprobs = logp.gather(1, sampled[:, None])[:, 0]
    out, grad = _loss_and_grad(x, x, sampled, sampler_logprobs, adv, mode=mode, **kw)
    ref, ref_grad = _loss_and_grad(x, x, sampled, sampler_logprobs, adv, mode="none", **({} if source == "head" else kw))
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.token_stats["weight"], torch.ones(n, dtype=torch.float64))
    if mode.startswith("sc"):
        assert out.stats["sc_coef_l1"] < 1e-12
        torch.testing.assert_close(out.stats["sc_tail_ratio"], torch.tensor(1.0, dtype=torch.float64))
    # And the plain REINFORCE value, written out: mean_t −A_t · log p(a_t).
    torch.testing.assert_close(ref.loss, -(adv * sampler_logprobs).mean())


# ------------------------------------------------------------------ drift (§1) in exact expectation


def _bandit(seed: int, v: int = 7):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(v, generator=gen, dtype=torch.float64)
    q = torch.softmax(z + 0.6 * torch.randn(v, generator=gen, dtype=torch.float64), dim=0)
    return z, q


def _expected_gradient(z, q, mode, **kw):
    """Σ_a q_a · ∇_z loss(a) with reward 1 (constant): one row per action, advantage weight q_a."""
    v = z.shape[0]
    x = z.clone().requires_grad_(True)
    sampled = torch.arange(v)
    out = token_loss(x.expand(v, v), sampled, q.log(), q.clone(), mode=mode, num_tokens=1, **kw)
    (grad,) = torch.autograd.grad(out.loss, x)
    return grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uncorrected_expected_gradient_is_drift_toward_q(seed):
    z, q = _bandit(seed)
    p = torch.softmax(z, dim=0)
    grad = _expected_gradient(z, q, "none")
    # −∇loss = E_q[e_a − p] = q − p: pulls p toward q with no reward information.
    torch.testing.assert_close(-grad, q - p, rtol=1e-10, atol=1e-12)
    assert (q - p).abs().max() > 1e-2


@pytest.mark.parametrize("mode", SC_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_score_centering_removes_drift_full_head(mode, seed):
    z, q = _bandit(seed)
    v = z.shape[0]
    head = torch.arange(v).expand(v, v)
    # A tight band/cap, so that some ratios are truncated or masked: plain TIS/MIS then drift.
    band = dict(low=0.8, high=1.5, cap=1.5)
    grad = _expected_gradient(z, q, mode, head_ids=head, head_logprobs=q.log().expand(v, v), **band)
    torch.testing.assert_close(grad, torch.zeros_like(grad), rtol=0, atol=1e-12)
    # The same weight without centering does drift.
    assert _expected_gradient(z, q, mode.removeprefix("sc_") if mode != "sc" else "none", **band).abs().max() > 1e-3


@pytest.mark.parametrize("mode", SC_MODES)
def test_score_centering_removes_drift_topk_with_proportional_tail(mode):
    z, q_full = _bandit(5, v=9)
    v, k = 9, 3
    p = torch.softmax(z, dim=0)
    head_ids = torch.topk(q_full, k).indices
    in_head = torch.zeros(v, dtype=torch.bool)
    in_head[head_ids] = True
    rho = 1.4
    q_head = q_full * in_head / q_full[head_ids].sum() * (1 - rho * p[~in_head].sum())
    q = torch.where(in_head, q_head, rho * p)
    torch.testing.assert_close(q.sum(), torch.tensor(1.0, dtype=torch.float64))
    grad = _expected_gradient(z, q, mode, head_ids=head_ids.expand(v, k), head_logprobs=q[head_ids].log().expand(v, k))
    torch.testing.assert_close(grad, torch.zeros_like(grad), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ top-p truncation (§4)


def _topp_batch(top_p: float = 0.8, n: int = 32, v: int = 50):
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(n, v, generator=gen) * 2.0
    p = torch.softmax(z, dim=1)
    sorted_p, order = torch.sort(p, dim=1, descending=True)
    keep_sorted = (sorted_p.cumsum(dim=1) - sorted_p) < top_p  # smallest prefix reaching top_p
    slots = order.shape[1]
    support_ids = torch.where(keep_sorted, order, -1)[:, :slots]
    kept = torch.zeros_like(p, dtype=torch.bool).scatter(1, order, keep_sorted)
    mass = (p * kept).sum(dim=1)
    q_s = torch.where(kept, p / mass[:, None], 0.0)  # the truncated sampler, same weights
    sampled = torch.multinomial(q_s, 1, generator=gen)[:, 0]
    support_probs = torch.where(support_ids >= 0, q_s.gather(1, support_ids.clamp_min(0)), 0.0)
    return z, sampled, q_s.gather(1, sampled[:, None])[:, 0].log(), mass, support_ids, support_probs


def test_truncated_sampler_ratio_equals_kept_mass_without_replay_and_one_with_it():
    z, sampled, logq, mass, support_ids, support_probs = _topp_batch()
    adv = torch.ones(z.shape[0])
    plain = token_loss(z, sampled, logq, adv, mode="none")
    torch.testing.assert_close(plain.token_stats["log_ratio"].exp(), mass, rtol=1e-5, atol=1e-6)
    assert mass.max() < 0.999  # the truncation is real
    for mode in MODE_NAMES:
        replay = token_loss(z, sampled, logq, adv, mode=mode, support_ids=support_ids, support_probs=support_probs)
        torch.testing.assert_close(replay.token_stats["log_ratio"], torch.zeros_like(mass), rtol=0, atol=1e-5)
        if mode.startswith("sc"):
            assert replay.stats["sc_coef_l1"] < 1e-5


# ------------------------------------------------------------------ worked example (§3.2)


def test_worked_example_k2():
    p_h = torch.tensor([[0.4, 0.4]], dtype=torch.float64)
    q_h = torch.tensor([[0.5, 0.3]], dtype=torch.float64)
    valid = torch.ones(1, 2, dtype=torch.bool)
    c = centering_coefficients(p_h.log(), q_h.log(), valid, make_weight("none", low=0.5, high=5.0, cap=2.0))
    torch.testing.assert_close(c.tail_ratio, torch.tensor([1.0], dtype=torch.float64))
    torch.testing.assert_close(c.coefficients, torch.tensor([[0.1, -0.1]], dtype=torch.float64))
    torch.testing.assert_close(c.head_mass, torch.tensor([0.8], dtype=torch.float64))


def test_worked_example_through_the_loss_gradient():
    # V = 3 with p = [0.4, 0.4, 0.2], head {0, 1} with q_H = [0.5, 0.3], a = 0, A = 1.
    x = torch.tensor([[0.4, 0.4, 0.2]], dtype=torch.float64).log().requires_grad_(True)
    out = token_loss(
        x, torch.tensor([0]), torch.tensor([0.5], dtype=torch.float64).log(), torch.ones(1, dtype=torch.float64),
        mode="sc", head_ids=torch.tensor([[0, 1]]), head_logprobs=torch.tensor([[0.5, 0.3]], dtype=torch.float64).log(),
    )
    out.loss.backward()
    # −[(e_0 − p) − 0.1(e_0 − p) + 0.1(e_1 − p)] = −[0.5, −0.3, −0.2]
    torch.testing.assert_close(x.grad, torch.tensor([[-0.5, 0.3, 0.2]], dtype=torch.float64))
    torch.testing.assert_close(out.stats["sc_coef_l1"], torch.tensor(0.2, dtype=torch.float64))
    torch.testing.assert_close(out.stats["sc_head_mass"], torch.tensor(0.8, dtype=torch.float64))


# ------------------------------------------------------------------ one way to pick a variant


def test_enums_use_yaml_spelling_and_registries_are_complete():
    assert [m.value for m in CorrectionMode] == ["none", "tis", "mis", "sc", "sc_tis", "sc_mis"]
    assert all(m.name == m.value for m in CorrectionMode) and all(w.name == w.value for w in Weight)
    assert set(MODES) == set(CorrectionMode)
    assert set(WEIGHTS) == set(Weight)
    assert {MODES[m].centered for m in CorrectionMode} == {True, False}


def test_mode_accepts_enum_or_string_and_rejects_unknown():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(4, 9, generator=gen)
    args = (z, torch.tensor([0, 1, 2, 3]), torch.full((4,), -2.0), torch.ones(4))
    head = dict(head_ids=torch.tensor([[0, 1]] * 4), head_logprobs=torch.full((4, 2), -1.5))
    assert torch.equal(token_loss(*args, mode="sc_mis", **head).loss, token_loss(*args, mode=CorrectionMode.sc_mis, **head).loss)
    with pytest.raises(ValueError, match="sc_mis"):
        token_loss(*args, mode="scmis")


@pytest.mark.parametrize("mode", SC_MODES)
def test_score_centering_refuses_to_run_without_head_or_support(mode):
    args = (torch.randn(3, 5), torch.tensor([0, 1, 2]), torch.full((3,), -1.0), torch.ones(3))
    with pytest.raises(ValueError, match="head_ids and head_logprobs"):
        token_loss(*args, mode=mode)
    with pytest.raises(ValueError, match="support_probs"):
        token_loss(*args, mode=mode, support_ids=torch.tensor([[0, 1]] * 3))


def test_rejects_bad_bands_and_shapes():
    args = (torch.randn(3, 5), torch.tensor([0, 1, 2]), torch.full((3,), -1.0), torch.ones(3))
    with pytest.raises(ValueError, match="low"):
        token_loss(*args, mode="mis", low=2.0, high=1.0)
    with pytest.raises(ValueError, match="cap"):
        token_loss(*args, mode="tis", cap=0.0)
    with pytest.raises(ValueError, match="advantages"):
        token_loss(*args[:3], torch.ones(4), mode="none")
    with pytest.raises(ValueError, match="head"):
        token_loss(*args, mode="sc", head_ids=torch.zeros(3, 2, dtype=torch.long), head_logprobs=torch.zeros(3, 3))


def test_math_constants_match_the_spec():
    w = make_weight("tis", low=0.5, high=5.0, cap=2.0)
    lr = torch.tensor([math.log(3.0), math.log(0.5)])
    torch.testing.assert_close(w.sampled(lr), torch.tensor([2.0, 0.5]))
    m = make_weight("mis", low=0.5, high=5.0, cap=2.0)
    torch.testing.assert_close(m.sampled(torch.tensor([math.log(6.0), math.log(0.4), math.log(2.0)])), torch.tensor([0.0, 0.0, 2.0]))
    # Tail scales of the §3.2 table: ρ, min(1, Cρ), 1[1/U ≤ ρ ≤ 1/L].
    rho = torch.tensor([0.1, 0.3, 1.0, 2.0, 3.0])
    torch.testing.assert_close(make_weight("none", low=0.5, high=5.0, cap=2.0).tail_scale(rho), rho)
    torch.testing.assert_close(w.tail_scale(rho), torch.tensor([0.2, 0.6, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(m.tail_scale(rho), torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))
