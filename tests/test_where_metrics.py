"""The where/ metrics: each probability bin's share of the tokens, of the mismatch and of the logit
gradient's squared norm, checked on tokens placed by hand, then on a real trainer step."""

from __future__ import annotations

import math

import pytest
import torch

from rlmix.metrics import names as m
from rlmix.metrics.where import prob_bin_names, ratio_bin_names, where_metrics
from rlmix.rollout import Rollouts


def _batch(sampler_logprobs: list[list[float]], mask: list[list[bool]]) -> Rollouts:
    mask_t = torch.tensor(mask)
    b, t = mask_t.shape
    return Rollouts(
        prompt_ids=torch.ones(b, 1, dtype=torch.long), prompt_lens=torch.ones(b, dtype=torch.long),
        completion_ids=torch.ones(b, t, dtype=torch.long), mask=mask_t,
        sampler_logprobs=torch.tensor(sampler_logprobs), policy_version=torch.zeros(b, dtype=torch.long),
        pool=("p",) * b, finish_reason=("stop",) * b, temperature=1.0,
    )


def test_shares_by_trainer_probability_by_hand():
    # Trainer probabilities 0.0005, 0.05, 0.3 | 0.95, 0.95 (row 0's third position is padding).
    p = [0.0005, 0.05, 0.3, 0.95, 0.95]
    q = [0.0008, 0.05, 0.3, 0.95, 0.1]  # tokens 0 and 4 mismatched
    lr = torch.tensor([math.log(a / b) for a, b in zip(p, q)])
    sampler = [[math.log(q[0]), math.log(q[1]), 0.0], [math.log(q[2]), math.log(q[3]), math.log(q[4])]]
    batch = _batch(sampler, [[True, True, False], [True, True, True]])
    norms = torch.tensor([3.0, 0.0, 0.0, 0.0, 1.0])  # token 0 carries 9 / 10 of Σ g², token 4 the rest
    out = where_metrics(batch, {"log_ratio": lr, "logit_grad_norm": norms})

    bins = prob_bin_names()
    assert bins == ("p0-0.001", "p0.001-0.01", "p0.01-0.1", "p0.1-0.5", "p0.5-0.9", "p0.9-1")
    tokens = {f"{m.WHERE_TOKENS}/{b}": v for b, v in zip(bins, [1 / 5, 0, 1 / 5, 1 / 5, 0, 2 / 5])}
    assert out.items() >= {k: pytest.approx(v) for k, v in tokens.items()}.items()
    abs_lr = lr.abs()
    assert out[f"{m.WHERE_MISMATCH}/p0-0.001"] == pytest.approx(float(abs_lr[0] / abs_lr.sum()))
    assert out[f"{m.WHERE_MISMATCH}/p0.9-1"] == pytest.approx(float(abs_lr[4] / abs_lr.sum()))
    assert out[f"{m.WHERE_GRAD}/p0-0.001"] == pytest.approx(0.9)
    assert out[f"{m.WHERE_GRAD}/p0.9-1"] == pytest.approx(0.1)
    assert sum(out[f"{m.WHERE_GRAD}/{b}"] for b in bins) == pytest.approx(1.0)
    assert out[m.WHERE_GRAD_TOP] == pytest.approx(0.9)  # 1% of 5 tokens rounds up to one token
    # ratio outside [0.2, 5]: token 0 (p/q = 0.625) is inside, token 4 (9.5) is not
    assert out[m.WHERE_GRAD_RATIO_TAIL] == pytest.approx(0.1)
    # by the ratio: token 0 in r0.5-0.8, tokens 1-3 match (r = 1), token 4 above 5
    bands = ratio_bin_names()
    assert bands == ("r0-0.2", "r0.2-0.5", "r0.5-0.8", "r0.8-1.25", "r1.25-2", "r2-5", "r5-inf")
    by_ratio = {"r0.5-0.8": (1 / 5, 0.9), "r0.8-1.25": (3 / 5, 0.0), "r5-inf": (1 / 5, 0.1)}
    for band in bands:
        tokens_share, grad_share = by_ratio.get(band, (0.0, 0.0))
        assert out[f"{m.WHERE_TOKENS}/{band}"] == pytest.approx(tokens_share)
        assert out[f"{m.WHERE_GRAD}/{band}"] == pytest.approx(grad_share)


def test_a_step_without_gradient_or_mismatch_leaves_those_shares_out():
    batch = _batch([[-1.0, -2.0]], [[True, True]])
    lr = torch.zeros(2)
    out = where_metrics(batch, {"log_ratio": lr, "logit_grad_norm": torch.zeros(2)})
    assert set(out) == {f"{m.WHERE_TOKENS}/{b}" for b in prob_bin_names() + ratio_bin_names()}
    unfilled = where_metrics(batch, {"log_ratio": lr + 0.1, "logit_grad_norm": torch.full((2,), float("nan"))})
    assert not any(k.startswith(m.WHERE_GRAD) for k in unfilled) and f"{m.WHERE_MISMATCH}/p0.1-0.5" in unfilled
    assert where_metrics(batch, {}) == {}


def test_a_trainer_step_logs_where_its_gradient_went(tiny_llama_dir):
    """A real step: the shares come from the backward's own per-token norms and each family sums to 1."""
    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
    from rlmix.correction import CorrectionMode
    from rlmix.trainers.torch_trainer import TorchTrainer
    from tests.test_deepspeed_trainer import fixed_batch

    trainer = TorchTrainer(tiny_llama_dir, TrainerConfig(lr=1e-2, precision=TrainerPrecision.fp32),
                           resolve_correction(CorrectionConfig(mode=CorrectionMode.none, num_candidates=8)), seed=0)
    got = trainer.train_step(fixed_batch(tiny_llama_dir))
    for family in (m.WHERE_TOKENS, m.WHERE_MISMATCH, m.WHERE_GRAD):
        assert sum(got[f"{family}/{b}"] for b in prob_bin_names()) == pytest.approx(1.0)
    for family in (m.WHERE_TOKENS, m.WHERE_GRAD):
        assert sum(got[f"{family}/{b}"] for b in ratio_bin_names()) == pytest.approx(1.0)
    assert 0.0 < got[m.WHERE_GRAD_TOP] <= 1.0 and 0.0 <= got[m.WHERE_GRAD_RATIO_TAIL] <= 1.0


def test_a_token_whose_sampler_log_prob_underflowed_is_binned_by_the_trainers_probability():
    # log p - log q is clamped at 20, so lr + log q is not log p where q underflowed: a token the
    # trainer gives 0.95 was filed under p < 0.001 (log q = -inf) or p in [0.001, 0.01) (log q = -25).
    from rlmix.correction.diagnostics import token_mismatch

    for log_q in (-25.0, float("-inf")):
        logp = torch.tensor([math.log(0.95), math.log(0.3)])
        q = torch.tensor([[log_q, math.log(0.3)]])
        batch = Rollouts(prompt_ids=torch.ones(1, 1, dtype=torch.long), prompt_lens=torch.ones(1, dtype=torch.long),
                         completion_ids=torch.ones(1, 2, dtype=torch.long), mask=torch.ones(1, 2, dtype=torch.bool),
                         sampler_logprobs=q, policy_version=torch.zeros(1, dtype=torch.long), pool=("p",),
                         finish_reason=("stop",))
        out = where_metrics(batch, {"log_ratio": token_mismatch(logp, q[0]).log_ratio, "logp": logp})
        assert out[f"{m.WHERE_TOKENS}/p0.9-1"] == 0.5, (log_q, out)
