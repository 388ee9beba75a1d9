"""Micro-batches by a token budget: little padding on mixed lengths, and the same update.

The loss is a token mean over the GLOBAL token count, so how rows are grouped into micro-batches
must change the work (padding, number of forwards) and never the gradient or the diagnostics.
"""

from __future__ import annotations

import pytest
import torch

from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig
from rlmix.correction import CorrectionMode
from rlmix.rollout import Rollouts
from rlmix.trainers.step import advantages_for, forward_backward, plan_micro_batches, plan_positions, sequence_lengths
from tests.test_lm_head import assert_grads_close, grads, tiny_model

V, K = 97, 4


def mixed_batch(b: int, shortest: int, longest: int, prompts: tuple[int, int] = (2, 6), seed: int = 0) -> Rollouts:
    """Completions from `shortest` to `longest` tokens (10× apart), a top-K head, two groups' rewards."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (b,), generator=g)
    lengths[0], lengths[1] = shortest, longest
    prompt_lens = torch.randint(prompts[0], prompts[1] + 1, (b,), generator=g)
    t, p = int(lengths.max()), int(prompt_lens.max())
    mask = torch.arange(t)[None] < lengths[:, None]
    completion = torch.randint(1, V, (b, t), generator=g).masked_fill(~mask, 0)
    prompt = torch.randint(1, V, (b, p), generator=g).masked_fill(torch.arange(p)[None] >= prompt_lens[:, None], 0)
    head_logprobs, _ = torch.sort(-5 * torch.rand(b, t, K, generator=g), dim=-1, descending=True)
    return Rollouts(
        prompt_ids=prompt, prompt_lens=prompt_lens, completion_ids=completion, mask=mask,
        sampler_logprobs=(-3 * torch.rand(b, t, generator=g)).masked_fill(~mask, 0.0),
        policy_version=torch.zeros(b, dtype=torch.long), pool=tuple(f"p{i % 3}" for i in range(b)),
        finish_reason=("stop",) * b, temperature=0.9,
        head_ids=torch.randint(0, V, (b, t, K), generator=g), head_logprobs=head_logprobs,
        group_ids=torch.arange(b) // 4, rewards=torch.rand(b, generator=g),
    )


def test_token_budget_keeps_padding_under_ten_percent():
    batch = mixed_batch(64, 50, 500, prompts=(20, 60))
    budget = 4096
    packed = plan_micro_batches(batch, max_rows=64, max_tokens=budget)
    assert sorted(torch.cat(packed).tolist()) == list(range(64))  # every row exactly once
    lengths = sequence_lengths(batch)
    assert all(len(rows) * int(lengths[rows].max()) <= budget for rows in packed)
    positions, real = plan_positions(batch, packed)
    assert real == int(lengths.sum())
    padding = 1 - real / positions
    blocks_positions, _ = plan_positions(batch, plan_micro_batches(batch, max_rows=8, max_tokens=None))
    assert padding < 0.10 < 1 - real / blocks_positions, (padding, 1 - real / blocks_positions)


def test_the_budget_bounds_the_positions_the_forward_runs_on():
    # Every row 70 long, but a forward lays out the longest prompt (60) plus the longest completion
    # (68): the four rows together ran on 4 x 128 = 512 positions against a budget of 280, and
    # train/padding_frac said 0%.
    from rlmix.rollout import sequence_input_ids
    from rlmix.trainers.step import micro_batch

    prompts, completions = torch.tensor([60, 2, 60, 2]), torch.tensor([10, 68, 10, 68])
    batch = Rollouts(prompt_ids=torch.ones(4, 60, dtype=torch.long), prompt_lens=prompts,
                     completion_ids=torch.ones(4, 68, dtype=torch.long),
                     mask=torch.arange(68)[None] < completions[:, None], sampler_logprobs=torch.zeros(4, 68),
                     policy_version=torch.zeros(4, dtype=torch.long), pool=("p",) * 4, finish_reason=("stop",) * 4)
    plan = plan_micro_batches(batch, max_rows=64, max_tokens=280)
    run = [sequence_input_ids(micro_batch(batch, rows), 0)[0].numel() for rows in plan]
    assert max(run) <= 280 and plan_positions(batch, plan)[0] == sum(run)


def test_a_row_longer_than_the_budget_gets_its_own_micro_batch():
    batch = mixed_batch(6, 3, 30)
    plan = plan_micro_batches(batch, max_rows=6, max_tokens=20)
    long_rows = (sequence_lengths(batch) > 20).nonzero()[:, 0].tolist()
    assert long_rows and all([row] in [p.tolist() for p in plan] for row in long_rows)


def _step(model, batch, cfg, **plan):
    result = forward_backward(model, batch, advantages_for(batch, cfg), cfg, pad_id=0, autocast=None,
                              num_tokens=batch.num_tokens, backward=torch.Tensor.backward, **plan)
    return result, grads(model)


@pytest.mark.parametrize("mode", [CorrectionMode.sc_mis, CorrectionMode.tis])
def test_packed_micro_batches_give_the_same_update(mode):
    model, batch = tiny_model(vocab=V), mixed_batch(12, 2, 20)
    cfg = resolve_correction(CorrectionConfig(mode=mode, num_candidates=K, replay_support=False))
    whole, whole_grads = _step(model, batch, cfg, micro_batch_size=12)
    blocks, blocks_grads = _step(model, batch, cfg, micro_batch_size=5)
    packed, packed_grads = _step(model, batch, cfg, micro_batch_size=12, max_tokens=40)
    assert packed.padding_frac < blocks.padding_frac
    for other, other_grads in ((blocks, blocks_grads), (packed, packed_grads)):
        assert other.num_tokens == whole.num_tokens == batch.num_tokens
        assert other.loss == pytest.approx(whole.loss, rel=1e-5, abs=1e-7)
        assert other.entropy == pytest.approx(whole.entropy, rel=1e-5)
        assert other.stats.keys() == whole.stats.keys()
        for key in whole.stats:
            assert other.stats[key] == pytest.approx(whole.stats[key], rel=1e-5, abs=1e-7), key
        for key in whole.token_stats:  # row-major order restored after packing
            torch.testing.assert_close(other.token_stats[key], whole.token_stats[key], rtol=1e-5, atol=1e-6)
        assert_grads_close(other_grads, whole_grads, rtol=1e-5, atol=1e-5)
