"""trainer.lr_schedule: warm-up then constant, linear or cosine decay, in trainer steps; train/lr; resume."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rlmix.assembly.parts import build_trainer
from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, LRSchedule, TrainerConfig, TrainerPrecision
from rlmix.correction import CorrectionMode
from rlmix.metrics import names as m
from rlmix.trainers.schedule import DECAYS, lr_factor
from tests.test_deepspeed_trainer import fixed_batch

TRAINER = TrainerConfig(lr=1e-2, micro_batch_size=4, precision=TrainerPrecision.fp32, lr_decay_steps=10)
CORRECTION = resolve_correction(CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8))


def test_factors_by_hand():
    warm = [lr_factor(s, LRSchedule.constant, 4, 10, 0.0) for s in range(6)]
    assert warm == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(2, LRSchedule.linear, 0, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.8)
    assert lr_factor(5, LRSchedule.linear, 0, 10, 0.1) == pytest.approx(0.55)
    assert lr_factor(2, LRSchedule.cosine, 0, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(0.2 * math.pi)))
    assert lr_factor(5, LRSchedule.cosine, 0, 10, 0.1) == pytest.approx(0.55)
    # decay starts after the warm-up and holds its floor past lr_decay_steps
    assert lr_factor(2, LRSchedule.linear, 2, 12, 0.0) == 1.0 and lr_factor(7, LRSchedule.linear, 2, 12, 0.0) == 0.5
    assert lr_factor(12, LRSchedule.cosine, 2, 12, 0.2) == pytest.approx(0.2)
    assert lr_factor(50, LRSchedule.linear, 2, 12, 0.2) == pytest.approx(0.2)
    assert set(DECAYS) == set(LRSchedule)


def _params(t) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.named_parameters()}


def test_default_schedule_leaves_the_rate_and_the_update_alone(tiny_llama_dir):
    batch = fixed_batch(tiny_llama_dir)
    t = build_trainer(tiny_llama_dir, replace(TRAINER, lr_decay_steps=None), CORRECTION, seed=0)
    lrs = [t.train_step(batch)[m.LR] for _ in range(3)]
    assert lrs == [TRAINER.lr] * 3 and all(g["lr"] == TRAINER.lr for g in t.optimizer.param_groups)
    # the same steps with the optimizer's rate never touched: bit-identical weights
    ref = build_trainer(tiny_llama_dir, TRAINER, CORRECTION, seed=0)
    ref.optimizer.param_groups[0]["lr"] = TRAINER.lr
    import rlmix.trainers.torch_trainer as tt

    original = tt.scheduled_lr
    tt.scheduled_lr = lambda cfg, step: cfg.lr
    try:
        for _ in range(3):
            ref.train_step(batch)
    finally:
        tt.scheduled_lr = original
    assert all(torch.equal(a, b) for a, b in zip(_params(t).values(), _params(ref).values()))


def test_warm_up_step_is_the_constant_step_at_the_scaled_rate(tiny_llama_dir):
    batch = fixed_batch(tiny_llama_dir)
    warm = build_trainer(tiny_llama_dir, replace(TRAINER, lr=4e-2, lr_warmup_steps=4), CORRECTION, seed=0)
    plain = build_trainer(tiny_llama_dir, replace(TRAINER, lr=1e-2), CORRECTION, seed=0)
    assert warm.train_step(batch)[m.LR] == pytest.approx(1e-2)
    plain.train_step(batch)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(_params(warm).values(), _params(plain).values()))


def test_the_schedule_resumes_from_the_checkpoint(tiny_llama_dir, tmp_path):
    cfg = replace(TRAINER, lr_schedule=LRSchedule.cosine, lr_warmup_steps=2, min_lr_ratio=0.1, lr_decay_steps=5)
    batch = fixed_batch(tiny_llama_dir)
    straight = build_trainer(tiny_llama_dir, cfg, CORRECTION, seed=0)
    lrs = [straight.train_step(batch)[m.LR] for _ in range(4)]
    expected = [cfg.lr * lr_factor(s, LRSchedule.cosine, 2, 5, 0.1) for s in range(4)]
    assert lrs == pytest.approx(expected) and lrs[0] < lrs[1] == lrs[2] > lrs[3]
    first = build_trainer(tiny_llama_dir, cfg, CORRECTION, seed=0)
    first.train_step(batch)
    first.train_step(batch)
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = build_trainer(tiny_llama_dir, cfg, CORRECTION, seed=0)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert [resumed.train_step(batch)[m.LR] for _ in range(2)] == lrs[2:]
    assert all(torch.equal(a, b) for a, b in zip(_params(resumed).values(), _params(straight).values()))


@pytest.mark.parametrize("override, key", [
    ("trainer.lr_schedule=exponential", "trainer.lr_schedule"),
    ("trainer.lr_warmup_steps=-1", "trainer.lr_warmup_steps=-1"),
    ("trainer.lr_decay_steps=0", "trainer.lr_decay_steps=0"),
    ("trainer.min_lr_ratio=1.5", "trainer.min_lr_ratio=1.5"),
])
def test_bad_schedule_keys_are_refused_in_one_line(override, key):
    from rlmix.commands.compose import compose_run_config
    from rlmix.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{key}") as err:
        compose_run_config(["+experiment=smoke", override])
    assert "\n" not in str(err.value)
