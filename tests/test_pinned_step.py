"""One trainer step's numbers on a fixed batch, pinned to the values the code gave before a refactor.

The loss and every metric of ``TorchTrainer.train_step`` are compared, for several correction modes
and both objectives, with ``tests/data/pinned_step_metrics.json``. Those values were computed once
from the code as it stood before the package was re-layered; a change that moves code without
changing behaviour must reproduce them. The step runs in fp32: a CPU's BF16 GEMM rounds by its
kernel (with or without AVX512-BF16), so BF16 values pinned on one CPU miss on another; these were
regenerated in fp32 from the code as it stood before PPO's pi_old became a choice (the PPO cases
pin that code's sampler-as-pi_old, today's bypass). fp32 is not bit-stable across CPUs either: AVX-512
and AVX2 GEMM kernels sum in different orders, and a statistic that is a difference of near-equal
probabilities (``correction/sc_coef_l1`` in the SC case) moved 2.7e-5 relative between the two
(grad norms 2e-6), so the comparison allows 1e-4 relative. ``train/padding_frac`` was re-pinned (0.224 to
0.25) when it came to count the positions the forward lays out, its longest prompt plus its longest
completion (the loss and every other value unchanged). Regenerate only for a deliberate change of the math:
``python -m tests.test_pinned_step <tiny model dir>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
from rlmix.correction import AdvantageNorm, CorrectionMode, Objective, OldLogprobs
from rlmix.metrics.names import (ALIGNMENT_ERROR, SC_SAMPLER_HEAD_MASS, UNIFORM_GROUPS_FRAC, WHERE_GRAD, WHERE_GRAD_RATIO_TAIL, WHERE_GRAD_TOP, WHERE_MISMATCH,
                                 WHERE_TOKENS)
from rlmix.metrics.where import prob_bin_names, ratio_bin_names

PINNED = Path(__file__).parent / "data" / "pinned_step_metrics.json"
CASES = {
    "none_reinforce": CorrectionConfig(mode=CorrectionMode.none, num_candidates=8),
    "tis_reinforce": CorrectionConfig(mode=CorrectionMode.tis, num_candidates=8),
    "mis_reinforce": CorrectionConfig(mode=CorrectionMode.mis, num_candidates=8),
    "sc_reinforce": CorrectionConfig(mode=CorrectionMode.sc, num_candidates=8),
    "sc_tis_reinforce": CorrectionConfig(mode=CorrectionMode.sc_tis, num_candidates=8),
    "sc_mis_reinforce": CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8),
    # Pinned when PPO's pi_old was always the sampler's: today's bypass (docs/math.md §5).
    "none_ppo": CorrectionConfig(mode=CorrectionMode.none, objective=Objective.ppo_clip,
                                 old_logprobs=OldLogprobs.sampler, advantage=AdvantageNorm.group_mean_std),
    "mis_ppo": CorrectionConfig(mode=CorrectionMode.mis, objective=Objective.ppo_clip,
                                old_logprobs=OldLogprobs.sampler, advantage=AdvantageNorm.group_mean_std),
    "tis_ppo": CorrectionConfig(mode=CorrectionMode.tis, objective=Objective.ppo_clip,
                                old_logprobs=OldLogprobs.sampler),
}
# Metrics added since the values were pinned: the batch's optimizer steps and learning rate, and
# PPO's clip fraction, ratio quantiles and pi_old-sampler gap (PPO cases only).
# Later still: where/ (which tokens hold the mismatch and carry the gradient; rlmix/metrics/where.py),
# then its ratio bands, the share of groups with one reward, and the record's alignment check;
# the SC arms' Q_H beside their P_H.
ADDED = {"train/optimizer_steps", "train/lr", WHERE_GRAD_TOP, WHERE_GRAD_RATIO_TAIL, UNIFORM_GROUPS_FRAC, ALIGNMENT_ERROR,
         *(f"{family}/{b}" for family in (WHERE_TOKENS, WHERE_MISMATCH, WHERE_GRAD) for b in prob_bin_names()),
         *(f"{family}/{b}" for family in (WHERE_TOKENS, WHERE_GRAD) for b in ratio_bin_names())}
ADDED_PPO = {"ppo/clip_frac", "ppo/ratio_p05", "ppo/ratio_p50", "ppo/ratio_p95", "ppo/ratio_max",
             "ppo/old_sampler_gap"}
# Micro-batches of 4 over 6 rows: the token-weighted reduction across micro-batches is pinned too.
TRAINER = TrainerConfig(lr=1e-2, micro_batch_size=4, grad_clip=1.0, precision=TrainerPrecision.fp32)


def step_metrics_for(model_dir: Path, correction: CorrectionConfig) -> dict[str, float]:
    from rlmix.trainers.torch_trainer import TorchTrainer
    from tests.test_deepspeed_trainer import fixed_batch

    trainer = TorchTrainer(model_dir, TRAINER, resolve_correction(correction), seed=0)
    return trainer.train_step(fixed_batch(model_dir))


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_matches_pinned_values(case, tiny_llama_dir):
    expected = json.loads(PINNED.read_text())[case]
    got = step_metrics_for(tiny_llama_dir, CASES[case])
    added = ADDED | (ADDED_PPO if CASES[case].objective is Objective.ppo_clip else set())
    added |= {SC_SAMPLER_HEAD_MASS} if CASES[case].mode.value.startswith("sc") else set()
    assert set(got) == set(expected) | added, f"metric names changed: {set(got) ^ (set(expected) | added)}"
    assert got["train/optimizer_steps"] == 1.0 and got["train/lr"] == TRAINER.lr
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key


if __name__ == "__main__":
    model_dir = Path(sys.argv[1])
    PINNED.write_text(json.dumps({c: step_metrics_for(model_dir, cfg) for c, cfg in sorted(CASES.items())},
                                 indent=1, sort_keys=True) + "\n")
