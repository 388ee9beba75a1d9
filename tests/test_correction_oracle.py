"""Dense-oracle tests, and the dense reference other correction tests import, written from docs/math.md §3.1 without the library.

Everything is float64 and closed form: for a softmax, d log p(v) / d z = e_v − p, so the §3.1 loss

    loss_t = −A · [ f(r_a) · log p(a) − Σ_v q_v f(r_v) · log p(v) ]     (f, q detached)

has the logit gradient  −A · [ f(r_a)(e_a − p) − (q⊙f(r) − (Σ_v q_v f(r_v)) · p) ].
With a recorded support, p is the softmax over the support (zero elsewhere) and q the support
probabilities, so the same formula holds with p_S, q_S (docs/math.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("none", "tis", "mis", "sc", "sc_tis", "sc_mis")
WEIGHT_OF = {"none": "none", "tis": "tis", "mis": "mis", "sc": "none", "sc_tis": "tis", "sc_mis": "mis"}


def f_dense(kind: str, r: torch.Tensor, low: float, high: float, cap: float) -> torch.Tensor:
    if kind == "none":
        return torch.ones_like(r)
    if kind == "tis":
        return torch.minimum(r, torch.full_like(r, cap))
    assert kind == "mis"
    return torch.where((r >= low) & (r <= high), r, torch.zeros_like(r))


def dense_grad(z, sampled, q, adv, mode, low=0.5, high=5.0, cap=2.0, support_mask=None, n=None):
    """d(Σ_t loss_t / n)/dz for z (N, V) with the full sampler distribution q (N, V)."""
    z = z.double()
    if support_mask is None:
        p = torch.softmax(z, dim=1)
    else:
        p = torch.softmax(z.masked_fill(~support_mask, float("-inf")), dim=1)
    kind = WEIGHT_OF[mode]
    rows = torch.arange(z.shape[0])
    e_a = torch.zeros_like(p)
    e_a[rows, sampled] = 1.0
    w_a = f_dense(kind, p[rows, sampled] / q[rows, sampled], low, high, cap)
    g = w_a[:, None] * (e_a - p)
    if mode.startswith("sc"):
        safe_q = torch.where(q > 0, q, torch.ones_like(q))
        qw = torch.where(q > 0, q * f_dense(kind, p / safe_q, low, high, cap), torch.zeros_like(q))
        g = g - (qw - qw.sum(dim=1, keepdim=True) * p)
    return -adv.double()[:, None] * g / (z.shape[0] if n is None else n)


@dataclass
class TopKCase:
    """Raw logits (N, V) at `temperature`; dense q; head with −1/−inf padding; q on the tail ∝ p."""

    raw: torch.Tensor
    temperature: float
    q: torch.Tensor
    sampled: torch.Tensor
    sampler_logprobs: torch.Tensor
    head_ids: torch.Tensor
    head_logprobs: torch.Tensor
    adv: torch.Tensor


def topk_case(seed: int, n: int, v: int, k: int, temperature: float, pad: int = 0, full: bool = False) -> TopKCase:
    """A head of k slots (pad of them padding, at random positions) and q = ρ·p on the tail.

    full=True: k = v and q is an arbitrary distribution (no tail at all).
    Even rows sample from the head, odd rows from the tail (tokens outside the head).
    """
    gen = torch.Generator().manual_seed(seed)
    raw = 2.0 * torch.randn(n, v, generator=gen, dtype=torch.float64)
    z = raw / temperature
    p = torch.softmax(z, dim=1)
    perm = torch.stack([torch.randperm(v, generator=gen) for _ in range(n)])
    head = perm[:, :k].clone()
    in_head = torch.zeros(n, v, dtype=torch.bool)
    slot_valid = torch.ones(n, k, dtype=torch.bool)
    for i in range(n):
        pad_slots = torch.randperm(k, generator=gen)[:pad]
        slot_valid[i, pad_slots] = False
        in_head[i, head[i, slot_valid[i]]] = True
    noise = torch.randn(n, v, generator=gen, dtype=torch.float64)
    if full:
        q = torch.softmax(z + noise, dim=1)
    else:
        tail_p = (p * ~in_head).sum(dim=1)
        rho = torch.exp(4.0 * torch.rand(n, generator=gen, dtype=torch.float64) - 2.0)
        rho = torch.minimum(rho, 0.95 / tail_p)  # keep Q_H = 1 − ρ(1 − P_H) > 0
        head_shape = torch.where(in_head, p * torch.exp(noise), torch.zeros_like(p))
        q_head = head_shape / head_shape.sum(dim=1, keepdim=True) * (1.0 - rho * tail_p)[:, None]
        q = torch.where(in_head, q_head, rho[:, None] * p)
    sampled = torch.empty(n, dtype=torch.long)
    for i in range(n):
        region = in_head[i] if (i % 2 == 0 or full) else ~in_head[i]
        sampled[i] = torch.multinomial(q[i] * region, 1, generator=gen)[0]
    head_logprobs = torch.where(slot_valid, q.gather(1, head).log(), float("-inf"))
    head_ids = torch.where(slot_valid, head, -1)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return TopKCase(raw, temperature, q, sampled, q.gather(1, sampled[:, None])[:, 0].log(), head_ids, head_logprobs, adv)


@dataclass
class SupportCase:
    raw: torch.Tensor
    temperature: float
    q: torch.Tensor  # dense q_S (zero outside the support)
    mask: torch.Tensor  # (N, V) bool support membership
    sampled: torch.Tensor
    sampler_logprobs: torch.Tensor
    support_ids: torch.Tensor
    support_probs: torch.Tensor
    adv: torch.Tensor


def support_case(seed: int, n: int, v: int, s: int, temperature: float) -> SupportCase:
    """Per row a support of 1..s tokens in random slots (the rest −1 / 0.0) and q_S over it."""
    gen = torch.Generator().manual_seed(seed)
    raw = 2.0 * torch.randn(n, v, generator=gen, dtype=torch.float64)
    ids = torch.full((n, s), -1, dtype=torch.long)
    probs = torch.zeros(n, s, dtype=torch.float64)
    q = torch.zeros(n, v, dtype=torch.float64)
    for i in range(n):
        size = 1 if i == 0 else int(torch.randint(1, s + 1, (1,), generator=gen))
        slots = torch.randperm(s, generator=gen)[:size]
        toks = torch.randperm(v, generator=gen)[:size]
        pr = torch.softmax(1.5 * torch.randn(size, generator=gen, dtype=torch.float64), dim=0)
        ids[i, slots], probs[i, slots], q[i, toks] = toks, pr, pr
    sampled = torch.multinomial(q, 1, generator=gen)[:, 0]
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    logq_a = q.gather(1, sampled[:, None])[:, 0].log()
    return SupportCase(raw, temperature, q, q > 0, sampled, logq_a, ids, probs, adv)


# ---------------------------------------------------------------- tests against the oracle

import pytest  # noqa: E402

from rlmix.correction import token_loss  # noqa: E402

SHAPES = [  # (seed, N, V, K, pad, temperature)
    (0, 8, 12, 4, 0, 1.0),
    (1, 10, 20, 6, 2, 0.7),
    (2, 6, 9, 8, 3, 1.3),
    (3, 12, 30, 5, 1, 0.5),
]
BANDS = [dict(low=0.5, high=5.0, cap=2.0), dict(low=0.8, high=1.5, cap=1.2)]


def _autograd(case, mode, dtype=torch.float64, **kw):
    x = case.raw.to(dtype).clone().requires_grad_(True)
    out = token_loss(x / case.temperature, case.sampled, case.sampler_logprobs.to(dtype), case.adv.to(dtype), mode=mode, **kw)
    out.loss.backward()
    return out, x.grad


def _expected(case, mode, **kw):
    # d/d raw = (1/T) d/dz
    return dense_grad(case.raw / case.temperature, case.sampled, case.q, case.adv, mode, **kw) / case.temperature


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("band", BANDS, ids=["default", "tight"])
def test_topk_with_proportional_tail_matches_dense_oracle(mode, shape, band):
    seed, n, v, k, pad, t = shape
    case = topk_case(seed, n, v, k, t, pad=pad)
    assert (case.head_ids == case.sampled[:, None]).any(dim=1).sum() < n  # some sampled tokens outside the head
    _, grad = _autograd(case, mode, head_ids=case.head_ids, head_logprobs=case.head_logprobs, **band)
    torch.testing.assert_close(grad, _expected(case, mode, **band), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [10, 11, 12])
def test_topk_equals_exact_form_when_head_is_whole_vocabulary(mode, seed):
    case = topk_case(seed, n=8, v=16, k=16, temperature=0.9, full=True)
    _, grad = _autograd(case, mode, head_ids=case.head_ids, head_logprobs=case.head_logprobs)
    torch.testing.assert_close(grad, _expected(case, mode), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [20, 21, 22])
def test_support_replay_matches_dense_oracle_over_support(mode, seed):
    case = support_case(seed, n=10, v=25, s=7, temperature=0.8)
    _, grad = _autograd(case, mode, support_ids=case.support_ids, support_probs=case.support_probs)
    expected = dense_grad(case.raw / case.temperature, case.sampled, case.q, case.adv, mode, support_mask=case.mask)
    torch.testing.assert_close(grad, expected / case.temperature, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_float32_matches_oracle_and_global_token_count(mode):
    case = topk_case(30, n=16, v=64, k=8, temperature=1.0, pad=2)
    _, grad = _autograd(case, mode, dtype=torch.float32, head_ids=case.head_ids, head_logprobs=case.head_logprobs, num_tokens=100)
    expected = dense_grad(case.raw, case.sampled, case.q, case.adv, mode, n=100)
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=2e-6)


def test_oracle_is_not_trivially_equal_across_modes():
    # Guards the tests above: the modes must actually differ on these inputs.
    case = topk_case(1, 10, 20, 6, 0.7, pad=2)
    grads = {m: _expected(case, m) for m in MODES}
    for i, a in enumerate(MODES):
        for b in MODES[i + 1 :]:
            assert not torch.allclose(grads[a], grads[b]), (a, b)
