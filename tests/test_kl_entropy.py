"""correction.kl_coef (KL to the frozen start weights, k1/k2/k3) and correction.entropy_coef."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rlmix.assembly.parts import build_trainer
from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
from rlmix.correction import CorrectionMode, KLEstimator, kl_estimate, token_entropy
from rlmix.metrics import names as m
from rlmix.trainers.step import advantages_for
from tests.test_deepspeed_trainer import fixed_batch

TRAINER = TrainerConfig(lr=3e-2, micro_batch_size=4, grad_clip=1e9, precision=TrainerPrecision.fp32)
CORRECTION = resolve_correction(CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8))


def test_estimators_and_their_gradients_by_hand():
    """log p(a) = log 1/2, log pi_ref(a) = log 1/4: d = -log 2."""
    ln2 = math.log(2.0)
    expected = {KLEstimator.k1: (ln2, 1.0), KLEstimator.k2: (ln2 ** 2 / 2, ln2), KLEstimator.k3: (0.5 + ln2 - 1, 0.5)}
    for estimator, (value, grad) in expected.items():
        logp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
        kl = kl_estimate(logp, torch.tensor([math.log(0.25)], dtype=torch.float64), estimator)
        kl.sum().backward()
        assert float(kl) == pytest.approx(value, abs=1e-12), estimator
        assert float(logp.grad) == pytest.approx(grad, abs=1e-12), estimator
    same = torch.tensor([-1.3], dtype=torch.float64)
    assert all(float(kl_estimate(same, same, e)) == 0.0 for e in KLEstimator)
    assert float(kl_estimate(torch.tensor([0.0]), torch.tensor([-1e4]), "k3")) == pytest.approx(math.exp(-20) + 19)


def test_entropy_by_hand_and_its_gradient_raises_it():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    h = token_entropy(logits)
    assert h.tolist() == pytest.approx([math.log(2.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], abs=1e-12)
    h.sum().backward()
    assert logits.grad[0].abs().max() < 1e-12  # the uniform row is the maximum
    assert logits.grad[1, 1] < 0 < logits.grad[1, 0]  # flattening the skewed row raises its entropy


def _step(model_dir, correction: CorrectionConfig, steps: int = 1, trainer: TrainerConfig = TRAINER):
    t = build_trainer(model_dir, trainer, correction, seed=0)
    batch = fixed_batch(model_dir)
    metrics = [t.train_step(batch) for _ in range(steps)]
    return t, metrics, {k: v.detach().clone() for k, v in t.model.named_parameters()}


def test_defaults_build_no_reference_and_log_no_terms(tiny_llama_dir):
    t, [metrics], _ = _step(tiny_llama_dir, CORRECTION)
    assert t.reference is None
    assert m.KL_REF not in metrics and m.ENTROPY_BONUS not in metrics


@pytest.mark.slow  # builds trainers and steps them: ~19 s
def test_k3_at_the_start_weights_is_zero_and_leaves_the_first_update_alone(tiny_llama_dir):
    """The first batch is trained at the reference's own weights: d = 0, so k3 and its gradient
    vanish and the update is bit-identical; the second batch's weights moved, and the KL acts."""
    base, base_metrics, base_params = _step(tiny_llama_dir, CORRECTION, steps=2)
    kl, kl_metrics, kl_params = _step(tiny_llama_dir, replace(CORRECTION, kl_coef=1.0), steps=2)
    assert kl_metrics[0][m.KL_REF] == 0.0 and kl_metrics[1][m.KL_REF] > 0.0
    assert kl_metrics[0][m.LOSS] == base_metrics[0][m.LOSS]
    assert kl_metrics[1][m.LOSS] > base_metrics[1][m.LOSS]  # + kl_coef x a positive KL
    assert any(not torch.equal(kl_params[k], base_params[k]) for k in base_params)
    assert all(not p.requires_grad for p in kl.reference.parameters())
    first, _, first_params = _step(tiny_llama_dir, replace(CORRECTION, kl_coef=1.0))
    _, _, plain_first = _step(tiny_llama_dir, CORRECTION)
    assert all(torch.equal(first_params[k], plain_first[k]) for k in plain_first)


def test_k1_moves_even_the_first_update_and_the_reference_can_live_on_the_cpu(tiny_llama_dir):
    k1 = replace(CORRECTION, kl_coef=1.0, kl_estimator=KLEstimator.k1)
    t, [metrics], params = _step(tiny_llama_dir, k1, trainer=replace(TRAINER, ref_on_cpu=True))
    _, _, plain = _step(tiny_llama_dir, CORRECTION)
    assert next(t.reference.parameters()).device.type == "cpu"
    assert metrics[m.KL_REF] == 0.0  # k1 is 0 here too, but its gradient (coef / N on each log p(a)) is not
    assert any(not torch.equal(params[k], plain[k]) for k in plain)


def test_the_entropy_bonus_is_its_coefficient_times_the_token_mean_entropy(tiny_llama_dir):
    from rlmix.trainers.loss import batch_loss

    t = build_trainer(tiny_llama_dir, TRAINER, CORRECTION, seed=0)
    batch = fixed_batch(tiny_llama_dir)
    adv = advantages_for(batch, CORRECTION)
    kw = dict(num_tokens=batch.num_tokens, num_sequences=len(batch), pad_id=0, autocast=None)
    plain = batch_loss(t.model, batch, adv, CORRECTION, **kw)
    bonus = batch_loss(t.model, batch, adv, replace(CORRECTION, entropy_coef=0.1), **kw)
    mean_h = float(plain.token_stats["entropy"].mean())
    assert float(bonus.loss) == pytest.approx(float(plain.loss) - 0.1 * mean_h, rel=1e-5)
    assert float(bonus.stats["entropy_bonus"]) == pytest.approx(0.1 * mean_h, rel=1e-5)
    assert torch.allclose(bonus.token_stats["entropy"], plain.token_stats["entropy"], atol=1e-5)
    _, [metrics], moved = _step(tiny_llama_dir, replace(CORRECTION, entropy_coef=0.1))
    _, _, base = _step(tiny_llama_dir, CORRECTION)
    assert metrics[m.ENTROPY_BONUS] == pytest.approx(0.1 * metrics[m.ENTROPY], rel=1e-5)
    assert any(not torch.equal(moved[k], base[k]) for k in base)


@pytest.mark.parametrize("override, key", [
    ("correction.kl_coef=-0.1", "correction.kl_coef=-0.1"),
    ("correction.entropy_coef=-1", "correction.entropy_coef=-1"),
    ("correction.kl_estimator=k4", "correction.kl_estimator"),
])
def test_bad_terms_are_refused_in_one_line(override, key):
    from rlmix.commands.compose import compose_run_config
    from rlmix.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{key}") as err:
        compose_run_config(["+experiment=smoke", override])
    assert "\n" not in str(err.value)
