"""TurnBatcher: concurrent callers share sampler calls, each gets its own row cut to its budget."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rlmix.agentic.batching import TurnBatcher
from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, Rollouts, SamplingParams


class EchoSampler:
    """Outside the unit: generates, for each prompt, its last token + 1, + 2, ... (T tokens), slowly."""

    pool, version = "echo", 3

    def __init__(self):
        self.calls: list[int] = []
        self.gate = threading.Event()

    def generate(self, prompts, params: SamplingParams) -> Rollouts:
        self.gate.wait(5.0)  # let callers pile up behind the first call
        self.calls.append(len(prompts))
        T, B = params.max_new_tokens, len(prompts)
        ids = torch.tensor([[p[-1] + 1 + t for t in range(T)] for p in prompts])
        return Rollouts(prompt_ids=torch.tensor([p[:1] for p in prompts]), prompt_lens=torch.ones(B, dtype=torch.long),
                        completion_ids=ids, mask=torch.ones(B, T, dtype=torch.bool),
                        sampler_logprobs=-torch.ones(B, T), policy_version=torch.full((B,), 3), pool=("echo",) * B,
                        finish_reason=(FINISH_STOP,) * B,
                        head_ids=ids[..., None].repeat(1, 1, 2), head_logprobs=torch.zeros(B, T, 2))


def test_concurrent_turns_are_served_together_and_cut_to_their_budgets():
    sampler = EchoSampler()
    batcher = TurnBatcher(sampler, seed=1)
    budgets = [2, 5, 3, 4, 1, 5]
    try:
        with ThreadPoolExecutor(len(budgets)) as pool:
            futures = [pool.submit(batcher.generate, [[10 * i]], SamplingParams(max_new_tokens=n))
                       for i, n in enumerate(budgets)]
            threading.Timer(0.5, sampler.gate.set).start()
            rows = [f.result() for f in futures]
    finally:
        batcher.close()
    assert sum(sampler.calls) == len(budgets) and len(sampler.calls) < len(budgets)  # batched
    for i, (row, n) in enumerate(zip(rows, budgets)):
        assert len(row) == 1 and int(row.mask.sum()) == n
        assert row.completion_ids[0, :n].tolist() == [10 * i + 1 + t for t in range(n)]
        assert row.head_ids.shape[1] == row.completion_ids.shape[1]
        # Cut to a shorter budget than its batch generated: "length"; the longest budget is never cut.
        assert row.finish_reason in ((FINISH_STOP,), (FINISH_LENGTH,))
        assert n < max(budgets) or row.finish_reason == (FINISH_STOP,)
    assert any(row.finish_reason == (FINISH_LENGTH,) for row in rows)


def test_a_failing_sampler_fails_every_waiting_turn():
    class Broken(EchoSampler):
        def generate(self, prompts, params):
            raise RuntimeError("engine died")

    batcher = TurnBatcher(Broken())
    try:
        with pytest.raises(RuntimeError, match="engine died"):
            batcher.generate([[1]], SamplingParams(max_new_tokens=2))
    finally:
        batcher.close()
