"""trainer.activation_checkpointing: each decoder layer recomputed in the backward, the same gradients."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlmix.assembly.parts import build_trainer
from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
from rlmix.correction import CorrectionMode
from tests.test_deepspeed_trainer import fixed_batch

TRAINER = TrainerConfig(lr=3e-2, micro_batch_size=4, precision=TrainerPrecision.fp32)
CORRECTION = resolve_correction(CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8))


def _layer_calls(trainer) -> list[int]:
    calls = [0]
    layer = trainer.model.model.layers[0]
    # a pre-hook: the recompute stops early, once the last activation the backward needs is back
    layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _grads_after_loss(trainer, batch) -> dict[str, torch.Tensor]:
    from rlmix.trainers.step import advantages_for, forward_backward

    forward_backward(trainer.model, batch, advantages_for(batch, CORRECTION), CORRECTION, pad_id=0,
                     micro_batch_size=4, autocast=None, num_tokens=batch.num_tokens, backward=torch.Tensor.backward)
    return {k: p.grad.clone() for k, p in trainer.model.named_parameters()}


def test_the_same_gradients_with_each_layer_run_twice(tiny_llama_dir):
    batch = fixed_batch(tiny_llama_dir)
    plain = build_trainer(tiny_llama_dir, TRAINER, CORRECTION, seed=0)
    ckpt = build_trainer(tiny_llama_dir, replace(TRAINER, activation_checkpointing=True), CORRECTION, seed=0)
    assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    plain_calls, ckpt_calls = _layer_calls(plain), _layer_calls(ckpt)
    reference, grads = _grads_after_loss(plain, batch), _grads_after_loss(ckpt, batch)
    assert ckpt_calls[0] == 2 * plain_calls[0] > 0  # the forward, then the recompute in the backward
    assert all(torch.allclose(grads[k], reference[k], rtol=0, atol=1e-7) for k in reference)


def test_the_same_update_through_the_trainer(tiny_llama_dir):
    batch = fixed_batch(tiny_llama_dir)
    runs = {}
    for on in (False, True):
        t = build_trainer(tiny_llama_dir, replace(TRAINER, activation_checkpointing=on), CORRECTION, seed=0)
        metrics = t.train_step(batch)
        runs[on] = metrics, {k: v.detach().clone() for k, v in t.model.named_parameters()}
    assert runs[True][0]["train/loss"] == runs[False][0]["train/loss"]
    assert all(torch.allclose(runs[True][1][k], v, rtol=0, atol=1e-7) for k, v in runs[False][1].items())


def test_a_model_that_cannot_checkpoint_is_refused_before_anything_starts(monkeypatch):
    """The rule validation runs on model.path's config.json before Ray starts."""
    import pytest
    import transformers

    from rlmix.assembly.rules import _check_activation_checkpointing
    from rlmix.config.schema import ModelConfig, RunConfig
    from rlmix.errors import ConfigError

    cfg = RunConfig(trainer=replace(TRAINER, activation_checkpointing=True), model=ModelConfig(path="m"))
    _check_activation_checkpointing(cfg, {"architectures": ["Qwen2ForCausalLM"]})  # HF's models can
    _check_activation_checkpointing(cfg, None)  # the embedded Llama can
    monkeypatch.setattr(transformers, "NoCheckpointForCausalLM",
                        type("NoCheckpointForCausalLM", (), {"supports_gradient_checkpointing": False}), raising=False)
    with pytest.raises(ConfigError, match=r"^trainer.activation_checkpointing=true: NoCheckpointForCausalLM \(m\)"):
        _check_activation_checkpointing(cfg, {"architectures": ["NoCheckpointForCausalLM"]})
    _check_activation_checkpointing(replace(cfg, trainer=TRAINER), {"architectures": ["NoCheckpointForCausalLM"]})
