"""One trainer step's numbers on a fixed batch, pinned to the values the code gave before a refactor.

The loss and every metric of ``TorchTrainer.train_step`` are compared, for several correction modes
and both objectives, with ``tests/data/pinned_step_metrics.json``. Those values were computed once
from the code as it stood before the package was re-layered; a change that moves code without
changing behaviour must reproduce them. Regenerate only for a deliberate change of the math:
``python -m tests.test_pinned_step <tiny model dir>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlmix.config.schema import AdvantageNorm, CorrectionConfig, Objective, TrainerConfig
from rlmix.correction import CorrectionMode

PINNED = Path(__file__).parent / "data" / "pinned_step_metrics.json"
CASES = {
    "none_reinforce": CorrectionConfig(mode=CorrectionMode.none, num_candidates=8),
    "tis_reinforce": CorrectionConfig(mode=CorrectionMode.tis, num_candidates=8),
    "mis_reinforce": CorrectionConfig(mode=CorrectionMode.mis, num_candidates=8),
    "sc_reinforce": CorrectionConfig(mode=CorrectionMode.sc, num_candidates=8),
    "sc_tis_reinforce": CorrectionConfig(mode=CorrectionMode.sc_tis, num_candidates=8),
    "sc_mis_reinforce": CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8),
    "none_ppo": CorrectionConfig(mode=CorrectionMode.none, objective=Objective.ppo_clip,
                                 advantage=AdvantageNorm.group_mean_std),
    "mis_ppo": CorrectionConfig(mode=CorrectionMode.mis, objective=Objective.ppo_clip,
                                advantage=AdvantageNorm.group_mean_std),
    "tis_ppo": CorrectionConfig(mode=CorrectionMode.tis, objective=Objective.ppo_clip),
}
# Micro-batches of 4 over 6 rows: the token-weighted reduction across micro-batches is pinned too.
TRAINER = TrainerConfig(lr=1e-2, micro_batch_size=4, grad_clip=1.0)


def step_metrics_for(model_dir: Path, correction: CorrectionConfig) -> dict[str, float]:
    from rlmix.trainers.torch_trainer import TorchTrainer
    from tests.test_deepspeed_trainer import fixed_batch

    trainer = TorchTrainer(model_dir, TRAINER, correction, seed=0)
    return trainer.train_step(fixed_batch(model_dir))


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_matches_pinned_values(case, tiny_llama_dir):
    expected = json.loads(PINNED.read_text())[case]
    got = step_metrics_for(tiny_llama_dir, CASES[case])
    assert sorted(got) == sorted(expected), f"metric names changed: {set(got) ^ set(expected)}"
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


if __name__ == "__main__":
    model_dir = Path(sys.argv[1])
    PINNED.write_text(json.dumps({c: step_metrics_for(model_dir, cfg) for c, cfg in sorted(CASES.items())},
                                 indent=1, sort_keys=True) + "\n")
