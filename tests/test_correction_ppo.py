"""PPO-clip against a closed form (docs/math.md §5): π_old the sampler's (bypass) or the trainer's own."""

from __future__ import annotations

import pytest
import torch

from rlmix.correction import ppo_clip_loss, token_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28


def _case(seed: int, n: int = 40, v: int = 12, spread: float = 0.4):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=gen, dtype=torch.float64)
    q = torch.softmax(z + spread * torch.randn(n, v, generator=gen, dtype=torch.float64), dim=1)
    sampled = torch.multinomial(q, 1, generator=gen)[:, 0]
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return z, q, sampled, q.gather(1, sampled[:, None])[:, 0].log(), adv


def _oracle(z, q, sampled, adv, weight, low=0.5, high=5.0, cap=2.0):
    """Loss and d loss / dz from the closed form: the unclipped branch is active iff
    (A > 0 and r ≤ 1 + eps_high) or (A < 0 and r ≥ 1 − eps_low); there dz = −f_w·A·r·(e_a − p)/N."""
    p = torch.softmax(z, dim=1)
    rows = torch.arange(z.shape[0])
    r = p[rows, sampled] / q[rows, sampled]
    f_w = {
        "none": torch.ones_like(r),
        "tis": torch.clamp(cap / r, max=1.0),
        "mis": ((r >= low) & (r <= high)).double(),
    }[weight]
    clipped = r.clamp(1 - EPS_LOW, 1 + EPS_HIGH)
    loss = -(f_w * torch.minimum(r * adv, clipped * adv)).mean()
    active = ((adv > 0) & (r <= 1 + EPS_HIGH)) | ((adv < 0) & (r >= 1 - EPS_LOW))
    e_a = torch.zeros_like(p)
    e_a[rows, sampled] = 1.0
    grad = -(f_w * adv * r * active)[:, None] * (e_a - p) / z.shape[0]
    return loss, grad


@pytest.mark.parametrize("weight", ["none", "tis", "mis"])
@pytest.mark.parametrize("seed,spread", [(0, 0.4), (1, 1.5), (2, 0.1)])
def test_bypass_ppo_clip_matches_closed_form(weight, seed, spread):
    z, q, sampled, logq, adv = _case(seed, spread=spread)
    band = dict(low=0.7, high=1.6, cap=1.3)
    x = z.clone().requires_grad_(True)
    out = ppo_clip_loss(x, sampled, logq, adv, old="sampler", weight=weight, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                        **band)
    out.loss.backward()
    loss, grad = _oracle(z, q, sampled, adv, weight, **band)
    torch.testing.assert_close(out.loss, loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x.grad, grad, rtol=1e-9, atol=1e-12)


def test_cases_exercise_both_clip_branches_and_the_mis_mask():
    z, q, sampled, _, adv = _case(1, spread=1.5)
    r = torch.softmax(z, dim=1)[torch.arange(z.shape[0]), sampled] / q[torch.arange(z.shape[0]), sampled]
    assert ((adv > 0) & (r > 1 + EPS_HIGH)).any() and ((adv < 0) & (r < 1 - EPS_LOW)).any()
    assert ((r < 0.7) | (r > 1.6)).any() and ((r >= 0.7) & (r <= 1.6)).any()


@pytest.mark.parametrize("weight", ["none", "tis", "mis"])
def test_ppo_at_p_equals_q_is_reinforce(weight):
    z, _, sampled, _, adv = _case(3)
    logp = torch.log_softmax(z, dim=1).gather(1, sampled[:, None])[:, 0]
    x1, x2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    ppo = ppo_clip_loss(x1, sampled, logp, adv, old="sampler", weight=weight)
    ref = token_loss(x2, sampled, logp, adv, mode="none")
    ppo.loss.backward()
    ref.loss.backward()
    torch.testing.assert_close(ppo.loss, -adv.mean())  # r = 1: −mean(A)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_bypass_mis_drops_out_of_band_tokens_without_renormalising():
    z, q, sampled, logq, adv = _case(4, spread=1.5)
    out = ppo_clip_loss(z, sampled, logq, adv, old="sampler", weight="mis")
    r = out.token_stats["log_ratio"].exp()
    keep = (r >= 0.5) & (r <= 5.0)
    torch.testing.assert_close(out.token_stats["weight"], keep.double())
    torch.testing.assert_close(out.stats["masked_frac"], (~keep).double().mean())
    # Masked tokens count in the denominator: the loss equals the kept-token sum over all N.
    full = ppo_clip_loss(z, sampled, logq, adv * keep, old="sampler", weight="none")
    torch.testing.assert_close(out.loss, full.loss)


def test_ppo_support_replay_makes_identical_weights_ratio_one():
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(6, 9, generator=gen)
    support = torch.topk(z, 3, dim=1).indices
    q_s = torch.softmax(z.gather(1, support), dim=1)
    sampled = support[:, 1]
    logq = q_s[:, 1].log()
    out = ppo_clip_loss(z, sampled, logq, torch.ones(6), old="sampler", support_ids=support, support_probs=q_s)
    torch.testing.assert_close(out.token_stats["log_ratio"], torch.zeros(6), rtol=0, atol=1e-6)
    assert (ppo_clip_loss(z, sampled, logq, torch.ones(6), old="sampler").token_stats["log_ratio"] < -1e-3).all()


def test_ppo_rejects_bad_clip_range():
    with pytest.raises(ValueError, match="eps_low"):
        ppo_clip_loss(torch.randn(2, 3), torch.tensor([0, 1]), torch.zeros(2), torch.ones(2), eps_low=1.5)


# π_old = the trainer's own log-probs (the study's grpo and icepop, docs/math.md §5).


def _trainer_oracle(z, q, old, sampled, adv, weight, low=0.5, high=5.0, cap=2.0):
    """Decoupled PPO: r = p/π_old (differentiable), f_w = f(π_old/q) detached; the unclipped branch
    is active iff (A > 0 and r ≤ 1 + eps_high) or (A < 0 and r ≥ 1 − eps_low), where
    dz = −f_w·A·r·(e_a − p)/N."""
    p = torch.softmax(z, dim=1)
    rows = torch.arange(z.shape[0])
    r = p[rows, sampled] / old
    k = old / q[rows, sampled]
    f_w = {"none": torch.ones_like(k), "tis": k.clamp(max=cap), "mis": k * ((k >= low) & (k <= high))}[weight]
    loss = -(f_w * torch.minimum(r * adv, r.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * adv)).mean()
    active = ((adv > 0) & (r <= 1 + EPS_HIGH)) | ((adv < 0) & (r >= 1 - EPS_LOW))
    e_a = torch.zeros_like(p)
    e_a[rows, sampled] = 1.0
    return loss, -(f_w * adv * r * active)[:, None] * (e_a - p) / z.shape[0], f_w


@pytest.mark.parametrize("weight", ["none", "tis", "mis"])
@pytest.mark.parametrize("seed", [0, 1])
def test_trainer_old_ppo_matches_the_decoupled_closed_form(weight, seed):
    z, q, sampled, logq, adv = _case(seed, spread=1.0)
    gen = torch.Generator().manual_seed(10 + seed)
    z_old = z + 0.6 * torch.randn(z.shape, generator=gen, dtype=torch.float64)  # the weights before this step
    old = torch.softmax(z_old, dim=1)[torch.arange(z.shape[0]), sampled]
    band = dict(low=0.7, high=1.6, cap=1.3)
    x = z.clone().requires_grad_(True)
    out = ppo_clip_loss(x, sampled, logq, adv, old="trainer", old_logprobs=old.log(), weight=weight,
                        eps_low=EPS_LOW, eps_high=EPS_HIGH, **band)
    out.loss.backward()
    loss, grad, f_w = _trainer_oracle(z, q, old, sampled, adv, weight, **band)
    torch.testing.assert_close(out.loss, loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x.grad, grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.token_stats["weight"], f_w)
    r = out.token_stats["ppo_ratio"]
    took_clip = ((adv > 0) & (r > 1 + EPS_HIGH)) | ((adv < 0) & (r < 1 - EPS_LOW))
    assert took_clip.any(), "the case must exercise the clip"
    torch.testing.assert_close(out.stats["clip_frac"], took_clip.double().mean())


@pytest.mark.parametrize("weight", ["none", "tis", "mis"])
def test_trainer_old_with_one_step_is_reinforce_weighted_by_f_of_p_over_q(weight):
    """The study's grpo (none) is REINFORCE; its icepop (mis) is REINFORCE with the detached weight
    (p/q)·1[band], i.e. token_loss's mis; tis likewise: ratio 1, no clip, the weight on top."""
    z, _, sampled, logq, adv = _case(6, spread=1.5)
    x1, x2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    ppo = ppo_clip_loss(x1, sampled, logq, adv, old="trainer", weight=weight)
    ref = token_loss(x2, sampled, logq, adv, mode=weight)
    ppo.loss.backward()
    ref.loss.backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ppo.token_stats["ppo_ratio"], torch.ones_like(adv))
    assert float(ppo.stats["clip_frac"]) == 0.0
    torch.testing.assert_close(ppo.stats["old_sampler_gap"], ppo.token_stats["log_ratio"].abs().mean())
