"""trainer.precision: FP16 on a CPU is emulated (fp16-rounded operands and results around fp32
products) and must agree with torch's own fp16 autocast, which is exact but ~40x slower here."""

from __future__ import annotations

import torch

from rlmix.trainers.lm_head import chunked_logits
from rlmix.correction.logprobs import loss_columns
from rlmix.trainers.precision import EmulatedLowPrecisionProducts, autocast_context, product
from rlmix.trainers.tokens import masked_logits
from tests.test_lm_head import random_batch, tiny_model


def test_emulated_product_is_an_fp16_gemm():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 16, generator=g)
    exact = a.half() @ b.half()  # torch's (slow) CPU fp16 GEMM
    emulated = product(a, b, torch.float16)
    assert emulated.dtype == torch.float16
    torch.testing.assert_close(emulated.float(), exact.float(), rtol=2e-3, atol=2e-3)


def test_emulated_fp16_forward_agrees_with_torch_fp16_autocast():
    model, batch = tiny_model(), random_batch()
    fp32 = masked_logits(model, batch, pad_id=0, autocast=None)
    bf16 = masked_logits(model, batch, pad_id=0, autocast=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.float16):  # the real thing, slow on this CPU
        real = masked_logits(model, batch, pad_id=0, autocast=None)
    emulated = masked_logits(model, batch, pad_id=0, autocast=torch.float16)
    err = {name: (x.float() - real.float()).abs().max().item() for name, x in
           (("fp32", fp32), ("bf16", bf16), ("emulated", emulated))}
    # Closer to torch's fp16 than fp32 is, and ten times closer than bf16: what remains is autocast
    # also running the elementwise ops between products (activation, gating) in fp16.
    assert err["emulated"] < err["fp32"] / 1.5 and err["emulated"] < err["bf16"] / 10, err


def test_emulated_fp16_rounds_the_head_and_passes_gradients():
    model, batch = tiny_model(), random_batch()
    columns = loss_columns(batch.completion_ids[batch.mask], None)
    gathered, _ = chunked_logits(model, batch, columns, pad_id=0, autocast=torch.float16)
    dense = masked_logits(model, batch, pad_id=0, autocast=torch.float16)
    torch.testing.assert_close(gathered.z[:, 0], dense.gather(1, columns[:, :1])[:, 0], rtol=2e-3, atol=2e-3)
    gathered.z.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_the_context_is_the_emulation_for_fp16_on_the_cpu_autocast_for_bf16_nothing_for_fp32():
    assert isinstance(autocast_context("cpu", torch.float16), EmulatedLowPrecisionProducts)
    assert isinstance(autocast_context("cpu", torch.bfloat16), torch.autocast)
    assert not isinstance(autocast_context("cpu", None), (torch.autocast, EmulatedLowPrecisionProducts))
