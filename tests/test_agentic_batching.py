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


@pytest.mark.parametrize("precision", ["fp32", "fp8_e4m3"])
def test_a_seeded_turn_draws_in_a_batch_what_it_draws_alone(tmp_path, precision):
    """Which turns arrive together is timing; what each draws must not be. Seeded turns batched
    into whole calls of a real torch sampler get the tokens (and log-probs) each gets from a call of
    its own (continuous batching: tests/test_continuous_batching.py)."""
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler
    from tests.agentic_models import tiny_agent_model

    sampler = TorchSampler(tiny_agent_model(tmp_path / "model"), resolve_view("H100" if precision != "fp32" else "CPU",
                                                                              precision), "p")
    prompts = [[1, 20 + i, 30, 40 + 2 * i][: 2 + i % 3] for i in range(6)]
    params = [SamplingParams(max_new_tokens=8 + i % 4, seed=1000 + 7 * i) for i in range(6)]
    alone = [sampler.generate([p], q) for p, q in zip(prompts, params)]
    batcher, gate = TurnBatcher(sampler, seed=3, continuous=False), threading.Event()
    generate = sampler.generate
    sampler.generate = lambda *a: gate.wait(5.0) and generate(*a)  # hold the first call so the rest pile up
    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(batcher.generate, [p], q) for p, q in zip(prompts, params)]
            threading.Timer(0.5, gate.set).start()
            rows = [f.result() for f in futures]
    finally:
        batcher.close()
    assert len(batcher.batch_sizes) < len(prompts)  # some turns shared a call
    for one, row in zip(alone, rows):
        n = int(one.mask.sum())
        assert int(row.mask.sum()) == n and row.completion_ids[0, :n].tolist() == one.completion_ids[0, :n].tolist()
        assert torch.allclose(row.sampler_logprobs[0, :n], one.sampler_logprobs[0, :n], atol=1e-5)


def test_row_seeds_must_match_the_prompts(tmp_path):
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler
    from tests.agentic_models import tiny_agent_model

    sampler = TorchSampler(tiny_agent_model(tmp_path / "model"), resolve_view("CPU", "fp32"), "p")
    with pytest.raises(ValueError, match="2 row seeds for 3 prompts"):
        sampler.generate([[1, 2]] * 3, SamplingParams(max_new_tokens=2, row_seeds=(1, 2)))
