"""The contract every sampler backend passes (rollout record + log-prob semantics, docs/math.md §3.2/§4).

Backends are listed in ``BACKENDS``: adding one is one entry mapping a name to a function
``(model_dir, pool) -> Sampler``; every test runs once per backend on one module-scoped sampler
(an engine start is expensive). Relations are checked between a sampler's own outputs, so
they hold for any backend whatever its precision.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, SamplingParams
from rlmix.samplers.base import Sampler


def _torch_backend(model_dir, pool: str) -> Sampler:
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler

    return TorchSampler(model_dir, resolve_view("H100", "bf16"), pool, seed=0)


def _vllm_backend(model_dir, pool: str) -> Sampler:
    from rlmix.samplers.vllm_checks import VllmEngine
    from rlmix.samplers.vllm_sampler import VllmSampler

    return VllmSampler(model_dir, pool=pool, engine=VllmEngine("float32", None), seed=0)


BACKENDS = {"torch": _torch_backend, "vllm": _vllm_backend}

PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 10], [1, 20, 21, 22], [1, 30, 31, 32, 33, 34, 35, 36]] * 2
ATOL = 1e-4


# vLLM's engine takes ~15 s to start on a CPU: its run of the contract is in the slow tier.
@pytest.fixture(scope="module", params=[pytest.param(name, marks=pytest.mark.slow) if name == "vllm" else name
                                        for name in sorted(BACKENDS)])
def sampler(request, tiny_llama_dir):
    s = BACKENDS[request.param](tiny_llama_dir, f"contract_{request.param}")
    yield s
    s.close()


@pytest.fixture(scope="module")
def vocab(sampler, tiny_llama_dir) -> int:
    import json

    return json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]


def _masked(r, x):
    return x[r.mask]


def test_is_a_sampler(sampler):
    assert isinstance(sampler, Sampler)


def test_record_shapes_and_dtypes(sampler, vocab):
    params = SamplingParams(max_new_tokens=6, num_candidates=5, seed=1)
    r = sampler.generate(PROMPTS, params)
    b, t = r.completion_ids.shape
    assert b == len(PROMPTS) and 1 <= t <= 6
    assert r.prompt_ids.shape == (b, max(map(len, PROMPTS))) and r.prompt_ids.dtype == torch.int64
    assert r.prompt_lens.tolist() == [len(p) for p in PROMPTS]
    assert r.mask.dtype == torch.bool and r.mask.shape == (b, t)
    assert r.sampler_logprobs.dtype == torch.float32 and r.sampler_logprobs.shape == (b, t)
    assert r.head_ids.shape == (b, t, 5) and r.head_ids.dtype == torch.int64
    assert r.head_logprobs.shape == (b, t, 5) and r.head_logprobs.dtype == torch.float32
    assert r.support_ids is None and r.support_probs is None  # no truncation
    assert r.policy_version.shape == (b,) and r.policy_version.dtype == torch.int64
    assert len(r.pool) == b and len(r.finish_reason) == b and r.temperature == 1.0
    assert r.gen_time_s > 0 and {"accelerator", "precision", "kernel", "backend"} <= set(r.tags)
    assert ((r.completion_ids >= 0) & (r.completion_ids < vocab)).all()


def test_prompts_are_right_padded(sampler):
    r = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=2, seed=1))
    for i, p in enumerate(PROMPTS):
        assert r.prompt_ids[i, : len(p)].tolist() == p
    lens = r.prompt_lens[:, None]
    assert (r.prompt_ids[torch.arange(r.prompt_ids.shape[1])[None] >= lens] == r.prompt_ids[1, -1]).all()


def test_full_vocab_head_holds_the_sampled_token(sampler, vocab):
    """No truncation, K = V: the head is the whole softmax at T; the sampled id is in it with the
    same log-prob as recorded."""
    r = sampler.generate(PROMPTS, SamplingParams(temperature=0.7, max_new_tokens=8, num_candidates=vocab, seed=3))
    head_mass = _masked(r, r.head_logprobs).exp().sum(-1)
    torch.testing.assert_close(head_mass, torch.ones_like(head_mass), atol=ATOL, rtol=0)
    hit = r.head_ids == r.completion_ids[..., None]
    assert (hit.sum(-1)[r.mask] == 1).all()
    sampled_in_head = (r.head_logprobs * hit).nan_to_num(0.0).sum(-1)
    torch.testing.assert_close(_masked(r, sampled_in_head), _masked(r, r.sampler_logprobs), atol=ATOL, rtol=0)
    # the head is sorted, descending
    assert (_masked(r, r.head_logprobs).diff(dim=-1) <= 0).all()


def test_truncated_logprob_is_renormalised_over_the_support(sampler, vocab):
    """top-k/top-p: log q_S(a) = log q(a) − log Σ_S q = log support_prob(a); support rows sum to 1."""
    params = SamplingParams(top_p=0.8, top_k=20, max_new_tokens=8, num_candidates=vocab, support_slots=vocab, seed=5)
    r = sampler.generate(PROMPTS, params)
    sup_ids, sup_probs = _masked(r, r.support_ids), _masked(r, r.support_probs)
    torch.testing.assert_close(sup_probs.sum(-1), torch.ones(len(sup_ids)), atol=ATOL, rtol=0)
    assert ((sup_ids >= 0).sum(-1) <= 20 + 5).all()  # top_k caps the set (ties aside)
    assert ((sup_ids == -1) == (sup_probs == 0)).all()
    sampled = _masked(r, r.completion_ids)[:, None]
    in_support = sup_ids == sampled
    assert (in_support.sum(-1) == 1).all()
    logq_s = _masked(r, r.sampler_logprobs)
    torch.testing.assert_close(logq_s, (sup_probs * in_support).sum(-1).log(), atol=ATOL, rtol=0)
    # against the full-vocab head: log q(a) − log of the full-softmax mass of S
    head_ids, head_lp = _masked(r, r.head_ids), _masked(r, r.head_logprobs)
    full = torch.full((len(head_ids), vocab), float("-inf")).scatter(1, head_ids, head_lp)
    kept_mass = full.exp().gather(1, sup_ids.clamp(min=0)).mul(sup_ids >= 0).sum(-1)
    torch.testing.assert_close(logq_s, full.gather(1, sampled)[:, 0] - kept_mass.log(), atol=ATOL, rtol=0)
    assert (kept_mass < 1 - 1e-3).any()  # truncation actually happened


def test_padding_after_the_end(sampler, vocab):
    params = SamplingParams(max_new_tokens=10, num_candidates=vocab + 3, top_p=0.9, support_slots=vocab,
                            stop_token_ids=tuple(range(3, 30)), seed=2)
    r = sampler.generate(PROMPTS, params)
    off = ~r.mask
    assert off.any(), "stop tokens should end some rows early"
    pad = r.prompt_ids[1, -1]
    assert (r.completion_ids[off] == pad).all() and (r.sampler_logprobs[off] == 0).all()
    assert (r.head_ids[off] == -1).all() and torch.isneginf(r.head_logprobs[off]).all()
    assert (r.support_ids[off] == -1).all() and (r.support_probs[off] == 0).all()
    # K > V: trailing candidate slots are padding even on real tokens
    assert (r.head_ids[..., vocab:] == -1).all() and torch.isneginf(r.head_logprobs[..., vocab:]).all()
    lengths = r.mask.sum(-1)
    assert (r.mask == (torch.arange(r.mask.shape[1])[None] < lengths[:, None])).all()  # no holes
    for i, reason in enumerate(r.finish_reason):
        last = r.completion_ids[i, lengths[i] - 1].item()
        assert reason == (FINISH_STOP if last in params.stop_token_ids else FINISH_LENGTH)
        if reason == FINISH_LENGTH:
            assert lengths[i] == params.max_new_tokens


def test_deterministic_under_a_seed(sampler):
    params = SamplingParams(top_p=0.9, max_new_tokens=8, num_candidates=4, support_slots=64, seed=11)
    a, b = sampler.generate(PROMPTS, params), sampler.generate(PROMPTS, params)
    for name in ("completion_ids", "sampler_logprobs", "head_ids", "head_logprobs", "support_ids", "support_probs"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = sampler.generate(PROMPTS, SamplingParams(top_p=0.9, max_new_tokens=8, support_slots=64, seed=12))
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_weight_updates_take_effect(sampler, tiny_llama_dir):
    weights = {k: v for f in sorted(tiny_llama_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    params = SamplingParams(max_new_tokens=6, num_candidates=3, seed=4)
    v0 = sampler.version
    before = sampler.generate(PROMPTS, params)
    assert (before.policy_version == v0).all()
    sampler.load_weights(weights, v0 + 1)
    same = sampler.generate(PROMPTS, params)
    assert sampler.version == v0 + 1 and (same.policy_version == v0 + 1).all()
    assert torch.equal(same.completion_ids, before.completion_ids)
    g = torch.Generator().manual_seed(0)
    changed = {k: (v + 0.5 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in weights.items()}
    sampler.load_weights(changed, v0 + 2)
    after = sampler.generate(PROMPTS, params)
    sampler.load_weights(weights, v0 + 3)  # later tests in this module see the original weights
    assert (after.policy_version == v0 + 2).all()
    assert not torch.allclose(after.head_logprobs[:, 0], before.head_logprobs[:, 0])
    assert not math.isclose(after.sampler_logprobs.sum().item(), before.sampler_logprobs.sum().item())
