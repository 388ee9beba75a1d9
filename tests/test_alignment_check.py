"""docs/math.md §3.3's alignment check, run on every step's batch: ``correction/alignment_error``
(rlmix/metrics/aggregate.py) is 0 on a real sampler's records, full and truncated, and catches
rows whose head belongs to other tokens; the driver says so once (runner.py)."""

from __future__ import annotations

import logging
import types

import pytest
import torch

from rlmix.metrics.aggregate import alignment_metrics
from rlmix.metrics.names import ALIGNMENT_ERROR, ALIGNMENT_TOLERANCE
from rlmix.orchestration.runner import StepHandler
from rlmix.rollout import SamplingParams
from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.torch_sampler import TorchSampler

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 11], [1, 20, 21, 22, 23], [1, 30, 31, 32, 33]]


@pytest.fixture(scope="module")
def records(tiny_llama_dir):
    """(full, truncated): one pool sampling the whole vocabulary with a top-K head, one top-p."""
    sampler = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "cpu_fp32_exact")
    full = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=6, num_candidates=8, seed=0))
    truncated = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=6, num_candidates=8, top_p=0.9,
                                                         support_slots=64, seed=1))
    return full, truncated


def test_a_samplers_records_line_up(records):
    full, truncated = records
    for batch in (full, truncated):
        assert alignment_metrics(batch)[ALIGNMENT_ERROR] <= 1e-6
    # a truncating pool's log q is the truncated one: against its full-softmax head it is off by log S
    head_only = truncated.replace(support_ids=None, support_probs=None)
    assert alignment_metrics(head_only)[ALIGNMENT_ERROR] > ALIGNMENT_TOLERANCE


def test_heads_shifted_by_one_token_are_caught(records):
    full, _ = records
    shifted = full.replace(head_ids=full.head_ids.roll(1, dims=1), head_logprobs=full.head_logprobs.roll(1, dims=1))
    assert alignment_metrics(shifted)[ALIGNMENT_ERROR] > ALIGNMENT_TOLERANCE


def test_no_head_no_check(records):
    full, _ = records
    assert alignment_metrics(full.replace(head_ids=None, head_logprobs=None)) == {}


def test_the_driver_says_so_once(caplog):
    handler = types.SimpleNamespace(misaligned=False)
    with caplog.at_level(logging.WARNING, logger="rlmix.orchestration.runner"):
        for step in (1, 2, 3):
            StepHandler._check_alignment(handler, step, {ALIGNMENT_ERROR: 0.0 if step == 1 else 0.7})
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("step 2: the samplers' records are misaligned"), warnings
