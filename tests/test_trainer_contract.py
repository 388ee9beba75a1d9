"""One contract for every trainer backend: torch, DeepSpeed with 1 rank, DeepSpeed with 2 ranks.

Each backend takes the same fixed batch; the checks are relations every implementation must keep:
the loss agrees with the torch trainer's, parameters move, a checkpoint round-trips exactly, and
the published weights are what a sampler loads (HF names, CPU tensors, the trained values).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, TrainerBackend, TrainerConfig, TrainerPrecision
from rlmix.correction import CorrectionMode
from rlmix.errors import ConfigError
from rlmix.assembly.parts import build_trainer
from rlmix.trainers.base import Trainer
from rlmix.trainers.precision import published_dtype
from rlmix.config.deepspeed import DeepSpeedConfig
from tests.test_deepspeed_trainer import fixed_batch

pytestmark = pytest.mark.slow

BASE = TrainerConfig(lr=1e-2, micro_batch_size=4, grad_clip=1.0)
BACKENDS = {
    "torch": BASE,
    "deepspeed_1rank": replace(BASE, backend=TrainerBackend.deepspeed),
    "deepspeed_2ranks": replace(BASE, backend=TrainerBackend.deepspeed, deepspeed=DeepSpeedConfig(ranks=2)),
    # FP16 autocast with dynamic loss scaling; samplers receive fp16 weights.
    "torch_fp16": replace(BASE, precision=TrainerPrecision.fp16),
}
CORRECTION = resolve_correction(CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8))


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def make(name: str, model_dir) -> Trainer:
    return build_trainer(model_dir, BACKENDS[name], CORRECTION, seed=0)


def close(trainer) -> None:
    if hasattr(trainer, "close"):
        trainer.close()


@pytest.fixture(scope="module")
def torch_loss(tiny_llama_dir) -> dict[TrainerPrecision, float]:
    """The torch trainer's loss on the fixed batch, per autocast format."""
    batch = fixed_batch(tiny_llama_dir)
    return {p: build_trainer(tiny_llama_dir, replace(BASE, precision=p), CORRECTION, seed=0).train_step(batch)["train/loss"]
            for p in (TrainerPrecision.bf16, TrainerPrecision.fp16)}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_trainer_contract(name, tiny_llama_dir, tmp_path, torch_loss, ray_local):
    batch = fixed_batch(tiny_llama_dir)
    trainer = make(name, tiny_llama_dir)
    try:
        assert isinstance(trainer, Trainer) and trainer.version == 0
        before = {k: v.float().clone() for k, v in trainer.published_weights().items()}
        metrics = trainer.train_step(batch)
        assert trainer.version == 1
        # Same loss on a fixed batch (a 16-bit forward either way: autocast or a 16-bit module).
        assert metrics["train/loss"] == pytest.approx(torch_loss[BACKENDS[name].precision], rel=2e-2, abs=1e-4)
        for key in ("train/grad_norm", "mismatch/kl_k3", "correction/sc_coef_l1", "reward/mean"):
            assert key in metrics and metrics[key] == metrics[key]  # present and not NaN
        after = trainer.published_weights()
        assert set(after) == set(before) and all(v.device.type == "cpu" for v in after.values())
        assert {v.dtype for v in after.values()} == {published_dtype(BACKENDS[name].precision)}
        assert any(not torch.equal(before[k], after[k].float()) for k in before)  # parameters changed

        trainer.save_checkpoint(tmp_path / "ckpt")
        trainer.train_step(batch)
        continued = {k: v.float() for k, v in trainer.published_weights().items()}
    finally:
        close(trainer)

    resumed = make(name, tiny_llama_dir)
    try:
        resumed.load_checkpoint(tmp_path / "ckpt")
        assert resumed.version == 1
        resumed.train_step(batch)
        for key, value in resumed.published_weights().items():
            torch.testing.assert_close(value.float(), continued[key], rtol=0, atol=0, msg=key)
    finally:
        close(resumed)


def test_deepspeed_fp16_on_cpu_ranks_is_refused_with_the_keys_to_change(tiny_llama_dir):
    if torch.cuda.is_available():
        pytest.skip("CUDA ranks run DeepSpeed FP16")
    cfg = replace(BASE, backend=TrainerBackend.deepspeed, precision=TrainerPrecision.fp16)
    with pytest.raises(ConfigError, match="trainer.precision=fp16 with trainer.backend=deepspeed needs CUDA ranks"):
        build_trainer(tiny_llama_dir, cfg, CORRECTION, seed=0)
