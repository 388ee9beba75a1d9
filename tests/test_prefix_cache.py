"""The torch sampler's prefix cache: multi-turn generation with reuse equals generation without it,
entries never outlive their weight version, memory stays under the cap."""

from __future__ import annotations

import random

import pytest
import torch

from rlmix.rollout import SamplingParams
from rlmix.samplers.accelerators import KernelFamily, PrecisionView, resolve_view
from rlmix.samplers.precision import Precision
from rlmix.samplers.prefix_cache import BLOCK, CachedPrefix, PrefixCache, common_prefix
from rlmix.samplers.torch_sampler import TorchSampler, read_model_dir

FP32 = Precision.fp32
VIEWS = {
    "exact": PrecisionView.exact(),
    # fp32 compute with an fp8 KV cache: the cached values are the quantised ones
    "exact_kv_fp8": PrecisionView("CPU", FP32, FP32, FP32, Precision.fp8_e4m3, KernelFamily.fp32_softmax),
}
# Log-prob tolerance per view. The cached KV was computed by GEMMs of another shape (a decode step's
# rows, another batch's prefill), which the CPU sums in another order: ~1e-6 on fp32 values. Through an
# fp8 KV cache that is still exact unless a value lies within ~1e-6 of an fp8 rounding boundary; then
# one of its 2·layers·Hkv·D values per token rounds one fp8 step (1/16) the other way, which moved
# log-probs by up to 1e-4 in these runs (tokens stay identical).
ATOL = {"exact": 1e-5, "exact_kv_fp8": 1e-3}


def _play(sampler: TorchSampler, reference: TorchSampler, turns: int, seed: int = 0, budget_cut: bool = False):
    """Episodes as the agent loop plays them: each turn's prompt is the previous prompt, the completion
    and new environment tokens. Both samplers get the same prompts; yields both results per turn."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, 50) for _ in range(n)] for n in (20, 7, 35)]
    for turn in range(turns):
        params = SamplingParams(max_new_tokens=10, seed=turn, num_candidates=4)
        mine, ref = sampler.generate(prompts, params), reference.generate(prompts, params)
        yield prompts, mine, ref
        assert torch.equal(mine.completion_ids, ref.completion_ids)  # before building on it
        nxt = []
        for i, prompt in enumerate(prompts):
            n = int(mine.mask[i].sum())
            if budget_cut and i == 0:
                n = max(n // 2, 1)  # the caller kept only part of the completion (a turn budget)
            nxt.append(prompt + mine.completion_ids[i, :n].tolist() + [rng.randrange(3, 50) for _ in range(4 + 3 * i)])
        prompts = nxt


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("budget_cut", [False, True])
def test_reuse_gives_the_numbers_of_a_fresh_prefill(tiny_llama_dir, view, budget_cut):
    """Same seeds, same prompts: identical tokens, log-probs and head to the view's rounding (``ATOL``)."""
    cached = TorchSampler(tiny_llama_dir, VIEWS[view], "a")
    fresh = TorchSampler(tiny_llama_dir, VIEWS[view], "b", prefix_cache_bytes=0)
    prompt_tokens = 0
    for prompts, mine, ref in _play(cached, fresh, turns=3, budget_cut=budget_cut):
        prompt_tokens += sum(len(p) for p in prompts)
        assert torch.equal(mine.completion_ids, ref.completion_ids) and torch.equal(mine.mask, ref.mask)
        torch.testing.assert_close(mine.sampler_logprobs, ref.sampler_logprobs, atol=ATOL[view], rtol=0)
        torch.testing.assert_close(mine.head_logprobs, ref.head_logprobs, atol=ATOL[view], rtol=0)
        assert torch.equal(mine.head_ids, ref.head_ids) and torch.equal(mine.prompt_ids, ref.prompt_ids)
    assert len(fresh.prefix_cache) == 0 and fresh.prefix_cache.hits == 0
    # Turns 2-4 found their episode's earlier turns: most prompt tokens were not prefilled again.
    assert cached.prefix_cache.reused_tokens > 0.5 * prompt_tokens


def test_block_wise_kernels_reuse_bit_for_bit_at_the_same_padding(tiny_llama_dir):
    """Under a block-wise kernel a row's numbers depend on its left padding (key blocks start at cache
    column 0), with or without the cache; a row alone has none, and reuse is then exact to the bit,
    with bf16 activations, fp8 KV and bf16 block accumulators."""
    view = resolve_view("H100", "bf16", kv_precision="fp8_e4m3")
    cached = TorchSampler(tiny_llama_dir, view, "a")
    fresh = TorchSampler(tiny_llama_dir, view, "b", prefix_cache_bytes=0)
    rng = random.Random(3)
    prompt = [1] + [rng.randrange(3, 50) for _ in range(20)]  # past one 16-column key block by turn 2
    for turn in range(3):
        params = SamplingParams(max_new_tokens=8, seed=turn, num_candidates=4)
        mine, ref = cached.generate([prompt], params), fresh.generate([prompt], params)
        assert torch.equal(mine.completion_ids, ref.completion_ids)
        assert torch.equal(mine.sampler_logprobs, ref.sampler_logprobs)
        assert torch.equal(mine.head_logprobs, ref.head_logprobs)
        n = int(mine.mask[0].sum())
        prompt = prompt + mine.completion_ids[0, :n].tolist() + [rng.randrange(3, 50) for _ in range(6)]
    assert cached.prefix_cache.hits >= 2


def test_a_weight_update_drops_every_cached_prefix(tiny_llama_dir, tmp_path):
    """KV computed with older weights is never reused: after ``load_weights`` the next turn equals a
    sampler that only ever had the new weights."""
    _, weights = read_model_dir(tiny_llama_dir)
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}
    cached = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "a")
    prompt = [1] + list(range(5, 5 + BLOCK))
    first = cached.generate([prompt], SamplingParams(max_new_tokens=8, seed=0))
    assert len(cached.prefix_cache) == 1
    cached.load_weights(new, version=1)
    assert len(cached.prefix_cache) == 0 and cached.prefix_cache.nbytes == 0
    nxt = prompt + first.completion_ids[0, : int(first.mask[0].sum())].tolist() + [13, 14]
    params = SamplingParams(max_new_tokens=8, seed=1, num_candidates=4)
    mine = cached.generate([nxt], params)
    fresh = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "b", prefix_cache_bytes=0)
    fresh.load_weights(new, version=1)
    ref = fresh.generate([nxt], params)
    assert torch.equal(mine.completion_ids, ref.completion_ids) and int(mine.policy_version[0]) == 1
    torch.testing.assert_close(mine.head_logprobs, ref.head_logprobs, atol=1e-5, rtol=1e-5)


def _entry(tokens, version=0, n_bytes_per_token=64):
    n = len(tokens)
    kv = torch.zeros(1, 1, n, n_bytes_per_token // 8)  # k and v: n_bytes_per_token per token together
    return CachedPrefix(tuple(tokens), kv, kv.clone(), version)


def test_entries_of_another_version_never_match():
    cache = PrefixCache(1 << 20)
    a = tuple(range(1, 21))
    cache.store(_entry(a, version=0))
    assert cache.match(a + (99,), version=1) == (None, 0)
    entry, n = cache.match(a + (99,), version=0)
    assert entry.tokens == a and n == 20
    cache.store(_entry(range(50, 70), version=1))  # a newer version drops the older entries
    assert len(cache) == 1 and cache.match(a + (99,), version=0) == (None, 0)


def test_longest_common_prefix_wins_and_the_last_prompt_token_is_always_fed():
    cache = PrefixCache(1 << 20)
    base = tuple(range(1, 33))
    for tokens in (base[:20], base[:BLOCK] + (90,) * 10, base, (2,) + base[1:]):
        cache.store(_entry(tokens))
    entry, n = cache.match(base[:25] + (7, 7), 0)  # partial match of the whole base beats the others
    assert entry.tokens == base and n == 25
    entry, n = cache.match(base, 0)  # the whole prompt is cached: its last token is fed again
    assert entry.tokens == base and n == len(base) - 1
    assert cache.match((3,) + base[1:], 0) == (None, 0)
    assert cache.match(base[:10] + (5,) * 10, 0) == (None, 0)  # shorter than a block: not worth a copy


def test_hash_collisions_cost_a_comparison_never_a_wrong_match(monkeypatch):
    cache = PrefixCache(1 << 20)
    monkeypatch.setattr(PrefixCache, "_keys", staticmethod(lambda tokens: [0] * (len(tokens) // BLOCK)))
    cache.store(_entry(range(1, 21)))
    assert cache.match(tuple(range(2, 40)), 0) == (None, 0)  # every key collides; no token in common
    assert cache.match(tuple(range(1, 19)) + (0,), 0)[1] == 18


def test_memory_stays_under_the_cap_least_recently_used_first():
    cache = PrefixCache(max_bytes=40 * 64)  # forty tokens of 64 bytes
    a, b, c = (tuple([k] * BLOCK) for k in (3, 4, 5))
    cache.store(_entry(a))
    cache.store(_entry(b))
    cache.match(a + (9,), 0)  # uses a: b is now least recently used
    cache.store(_entry(c))
    assert cache.nbytes <= cache.max_bytes and len(cache) == 2
    assert cache.match(b + (9,), 0) == (None, 0) and cache.match(a + (9,), 0)[1] == BLOCK
    cache.store(_entry(range(41)))  # larger than the whole cap: not kept, nothing evicted for it
    assert len(cache) == 2 and cache.nbytes == 2 * BLOCK * 64
    cache.store(_entry(range(BLOCK - 1)))  # shorter than a block: could never match, not kept
    assert len(cache) == 2


def test_an_extended_entry_is_replaced_and_the_sampler_stays_under_its_cap(tiny_llama_dir):
    sampler = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "a", prefix_cache_bytes=64 << 10)
    per_token = 2 * 2 * 1 * 32 * 4  # k and v, 2 layers, 1 KV head, head dim 32, fp32
    prompt = [1] + list(range(5, 5 + BLOCK))
    for turn in range(6):
        out = sampler.generate([prompt], SamplingParams(max_new_tokens=10, seed=turn))
        assert len(sampler.prefix_cache) == 1  # the episode's one entry, replaced each turn
        assert sampler.prefix_cache.nbytes == per_token * (len(prompt) + min(int(out.mask[0].sum()), out.mask.shape[1] - 1))
        prompt = prompt + out.completion_ids[0, : int(out.mask[0].sum())].tolist() + [8, 9]
    many = [[1] + [k + j for j in range(BLOCK + 3)] for k in range(3, 30)]  # ids below the vocabulary's 52
    sampler.generate(many, SamplingParams(max_new_tokens=12, seed=9))
    assert 0 < sampler.prefix_cache.nbytes <= 64 << 10


def test_common_prefix_matches_a_plain_scan():
    rng = random.Random(0)
    for _ in range(300):
        a = tuple(rng.randrange(3) for _ in range(rng.randrange(12)))
        b = tuple(rng.randrange(3) for _ in range(rng.randrange(12)))
        limit = rng.randrange(14)
        plain = 0
        while plain < min(len(a), len(b), limit) and a[plain] == b[plain]:
            plain += 1
        assert common_prefix(a, b, limit) == plain


@pytest.mark.parametrize("view", list(VIEWS))
def test_moe_reuse_gives_the_numbers_and_the_experts_of_a_fresh_prefill(tiny_qwen3_moe_dir, view):
    """A mixture-of-experts pool records every position's experts; a reused prefix brings those its
    KV was computed with. Tokens, log-probs and the whole expert record equal a fresh prefill's."""
    cached = TorchSampler(tiny_qwen3_moe_dir, VIEWS[view], "a")
    fresh = TorchSampler(tiny_qwen3_moe_dir, VIEWS[view], "b", prefix_cache_bytes=0)
    for _, mine, ref in _play(cached, fresh, turns=3):
        assert torch.equal(mine.completion_ids, ref.completion_ids) and torch.equal(mine.mask, ref.mask)
        torch.testing.assert_close(mine.sampler_logprobs, ref.sampler_logprobs, atol=ATOL[view], rtol=0)
        assert mine.routed_experts is not None and torch.equal(mine.routed_experts, ref.routed_experts)
    assert cached.prefix_cache.hits > 0 and cached.prefix_cache.reused_tokens > 0


def test_a_stop_token_fed_after_its_row_finished_is_not_reused_without_its_experts(tiny_qwen3_moe_dir):
    """Row 0 stops while row 1 goes on: its stop token is fed, but routed for no one (no experts
    recorded). The cache used to keep it, and a later prompt extending that row got -1 experts at
    a real position of its context; now the cache ends before it and a later call recomputes it."""
    cached = TorchSampler(tiny_qwen3_moe_dir, VIEWS["exact"], "a")
    fresh = TorchSampler(tiny_qwen3_moe_dir, VIEWS["exact"], "b", prefix_cache_bytes=0)
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, 50) for _ in range(n)] for n in (20, 25)]
    stop = int(fresh.generate(prompts, SamplingParams(max_new_tokens=10, seed=0)).completion_ids[0, 2])
    first = cached.generate(prompts, SamplingParams(max_new_tokens=10, seed=0, stop_token_ids=(stop,)))
    assert first.finish_reason == ("stop", "length")
    again = [p + first.completion_ids[i, : int(first.mask[i].sum())].tolist()
             + [rng.randrange(3, 50) for _ in range(10 if i == 0 else 1)] for i, p in enumerate(prompts)]
    mine, ref = (s.generate(again, SamplingParams(max_new_tokens=4, seed=1)) for s in (cached, fresh))
    assert cached.prefix_cache.reused_tokens > 0
    assert torch.equal(mine.routed_experts, ref.routed_experts)
