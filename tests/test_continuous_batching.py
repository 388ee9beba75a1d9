"""Continuous batching (rlmix/samplers/continuous.py): a turn that joins and leaves a running decode
batch gets what a call of its own gets — tokens, log-probs, head, finish reason, experts — whoever
else shared its steps, and its tokens reach the prefix cache for its episode's next turn."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from rlmix.agentic.batching import TurnBatcher
from rlmix.rollout import SamplingParams
from rlmix.samplers import continuous
from rlmix.samplers.accelerators import KernelFamily, PrecisionView
from rlmix.samplers.precision import Precision
from rlmix.samplers.torch_sampler import TorchSampler

FP32 = Precision.fp32
VIEWS = {
    "exact": PrecisionView.exact(),
    "exact_kv_fp8": PrecisionView("CPU", FP32, FP32, FP32, Precision.fp8_e4m3, KernelFamily.fp32_softmax),
}
# As tests/test_prefix_cache.py: GEMMs of other shapes sum in another order (~1e-6 on fp32 values),
# relative (rtol 1e-5), which an fp8 KV cache can turn into one rounding step on a value near a boundary.
ATOL = {"exact": 1e-5, "exact_kv_fp8": 1e-3}
PARAMS = SamplingParams(max_new_tokens=12, num_candidates=4, stop_token_ids=(2,))
# Truncated sampling: the record carries each step's kept set too (top-k 20 plus ties fits 24 slots).
TOP_P = replace(PARAMS, top_p=0.8, top_k=20, support_slots=24)


def _alone(sampler: TorchSampler, prompt: list[int], budget: int, seed: int, params: SamplingParams = PARAMS):
    return sampler.generate([prompt], replace(params, max_new_tokens=budget, seed=seed))


def _assert_same(row, one, view: str) -> None:
    n = int(one.mask.sum())
    assert int(row.mask.sum()) == n and row.finish_reason == one.finish_reason
    assert row.completion_ids[0, :n].tolist() == one.completion_ids[0, :n].tolist()
    torch.testing.assert_close(row.sampler_logprobs[0, :n], one.sampler_logprobs[0, :n], atol=ATOL[view], rtol=1e-5)
    assert torch.equal(row.head_ids[0, :n], one.head_ids[0, :n])
    if one.support_ids is not None:
        assert torch.equal(row.support_ids[0, :n], one.support_ids[0, :n])
        torch.testing.assert_close(row.support_probs[0, :n], one.support_probs[0, :n], atol=ATOL[view], rtol=1e-5)
    else:
        assert row.support_ids is None
    if one.routed_experts is not None:  # the positions fed (a whole call's row is laid out to its batch's width)
        fed = int(one.prompt_lens[0]) + n - 1
        assert torch.equal(row.routed_experts[0, :fed], one.routed_experts[0, :fed])
        assert bool((row.routed_experts[0, fed:] == -1).all())
    else:
        assert row.routed_experts is None


@pytest.mark.parametrize("model", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("grow", [64, 2])  # 2: the cache grows every other step
@pytest.mark.parametrize("params", [PARAMS, TOP_P], ids=["full", "top_p"])
def test_rows_that_join_and_leave_get_what_a_call_of_their_own_gets(model, view, grow, params, tiny_llama_dir,
                                                                    tiny_qwen3_moe_dir, monkeypatch):
    monkeypatch.setattr(continuous, "GROW_COLUMNS", grow)
    model_dir = tiny_llama_dir if model == "llama" else tiny_qwen3_moe_dir
    sampler = TorchSampler(model_dir, VIEWS[view], "p", prefix_cache_bytes=0)
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, 50) for _ in range(n)] for n in (20, 3, 35, 9, 14, 27)]
    budgets, seeds = [12, 3, 7, 12, 1, 10], [100 + i for i in range(6)]
    batch, results = sampler.decode_batch(params), {}

    def join(rows: list[int]) -> None:
        each = [replace(params, max_new_tokens=budgets[i]) for i in rows]
        seeded = replace(params, row_seeds=tuple(seeds[i] for i in rows))
        batch.join([prompts[i] for i in rows], each, sampler.uniforms(len(rows), seeded), rows)

    schedule = {0: [0, 1], 2: [2], 3: [3, 4], 9: [5]}  # decode step -> rows that join before it
    step = 0
    while step in schedule or len(batch) or step < max(schedule):
        if step in schedule:
            join(schedule[step])
        if len(batch):
            results.update(batch.step())
        step += 1
    assert sorted(results) == list(range(6))
    for i, (p, b, s) in enumerate(zip(prompts, budgets, seeds)):
        _assert_same(results[i], _alone(sampler, p, b, s, params), view)
    assert results[4].completion_ids.shape == (1, 1)  # a budget of one: drawn at the join's first step, never fed


@pytest.mark.parametrize("model", ["llama", "qwen3_moe"])
def test_a_finished_row_feeds_its_episodes_next_turn_from_the_prefix_cache(model, tiny_llama_dir, tiny_qwen3_moe_dir):
    """Turn 2 extends turn 1's prompt and completion: it is prefilled from what turn 1 left in the
    cache, and still gets the numbers (and experts) of a fresh sampler's call."""
    model_dir = tiny_llama_dir if model == "llama" else tiny_qwen3_moe_dir
    cached = TorchSampler(model_dir, VIEWS["exact"], "a")
    fresh = TorchSampler(model_dir, VIEWS["exact"], "b", prefix_cache_bytes=0)
    rng = random.Random(1)
    prompts = [[1] + [rng.randrange(3, 50) for _ in range(n)] for n in (25, 12)]
    for turn in range(3):
        batch, rows = cached.decode_batch(PARAMS), {}
        seeds = (10 * turn, 10 * turn + 1)
        params = replace(PARAMS, row_seeds=seeds)
        batch.join(prompts, [PARAMS] * 2, cached.uniforms(2, params), [0, 1])
        while len(batch):
            rows.update(batch.step())
        for i in range(2):
            _assert_same(rows[i], _alone(fresh, prompts[i], PARAMS.max_new_tokens, seeds[i]), "exact")
        prompts = [p + rows[i].completion_ids[0].tolist() + [rng.randrange(3, 50) for _ in range(5)]
                   for i, p in enumerate(prompts)]
    assert cached.prefix_cache.hits >= 4 and cached.prefix_cache.reused_tokens > 0


@pytest.mark.parametrize("continuous", [True, False])
def test_the_turn_batcher_serves_staggered_turns_as_if_each_came_alone(continuous, tiny_qwen3_moe_dir):
    sampler = TorchSampler(tiny_qwen3_moe_dir, VIEWS["exact"], "p", prefix_cache_bytes=0)
    rng = random.Random(2)
    prompts = [[1] + [rng.randrange(3, 50) for _ in range(n)] for n in (4, 18, 9, 30, 6, 12, 22, 3)]
    params = [replace(PARAMS, max_new_tokens=4 + i % 9, seed=500 + i) for i in range(8)]
    alone = [sampler.generate([p], q) for p, q in zip(prompts, params)]
    batcher = TurnBatcher(sampler, seed=3, continuous=continuous)
    assert batcher.continuous == continuous

    def submit(i: int):
        time.sleep(0.004 * i)  # arrive while earlier turns decode
        return batcher.generate([prompts[i]], params[i])

    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            rows = list(pool.map(submit, range(len(prompts))))
    finally:
        batcher.close()
    for row, one in zip(rows, alone):
        _assert_same(row, one, "exact")
    assert sum(batcher.batch_sizes) == len(prompts)
    if continuous:
        assert len(batcher.step_rows) >= max(p.max_new_tokens for p in params)


class _Broken(TorchSampler):
    """The sampler under test, its decode steps failing once ``gate`` is set."""

    gate = threading.Event()

    def decode_batch(self, params):
        batch = super().decode_batch(params)

        def step():
            self.gate.wait(5.0)
            raise RuntimeError("engine died")

        batch.step = step
        return batch


def test_a_failing_decode_batch_fails_every_waiting_turn(tiny_llama_dir):
    batcher = TurnBatcher(_Broken(tiny_llama_dir, VIEWS["exact"], "p"))
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(batcher.generate, [[1, 5 + i]], PARAMS) for i in range(3)]
            threading.Timer(0.3, _Broken.gate.set).start()
            for f in futures:
                with pytest.raises(RuntimeError, match="engine died"):
                    f.result()
    finally:
        batcher.close()


def test_turns_that_disagree_on_how_to_draw_are_refused(tiny_llama_dir):
    sampler = TorchSampler(tiny_llama_dir, VIEWS["exact"], "p")
    batch = sampler.decode_batch(PARAMS)
    with pytest.raises(ValueError, match="must share temperature"):
        batch.join([[1, 2]], [replace(PARAMS, temperature=0.5)], torch.rand(1, 12), [0])
    with pytest.raises(ValueError, match="at least one token"):
        batch.join([[1, 2]], [replace(PARAMS, max_new_tokens=0)], torch.rand(1, 12), [0])
    assert len(batch) == 0
