"""The trainer's CPU attention (rlmix.trainers.attention): the forward is transformers' ``sdpa`` bit
for bit, the backward is checked against an fp64 oracle beside the fused kernel's, and every case
outside the trainer's own goes to ``sdpa`` unchanged."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from rlmix.trainers import attention
from rlmix.trainers.attention import NAME, dense_causal_backward, use_dense_backward


def _qkv(B=3, H=4, Hkv=2, L=37, D=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    return q, k, v, torch.randn(B, H, L, D, generator=g).to(dtype)


def _oracle(q, k, v, go, scale):
    """fp64 autograd through the textbook causal attention on the same (rounded) inputs."""
    groups = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    kk, vv = k64.repeat_interleave(groups, 1), v64.repeat_interleave(groups, 1)
    L = q.shape[2]
    s = (q64 @ kk.transpose(-1, -2)) * scale
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    (s.softmax(-1) @ vv).backward(go.double())
    return q64.grad, k64.grad, v64.grad


def _fused(q, k, v, go, scale):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    out.backward(go)
    return q.grad, k.grad, v.grad


def _rel_err(got, ref):
    return float((got.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_backward_matches_the_oracle_as_well_as_the_fused_kernel(dtype, heads):
    H, Hkv = heads
    q, k, v, go = _qkv(H=H, Hkv=Hkv, dtype=dtype)
    scale = q.shape[-1] ** -0.5
    oracle = _oracle(q, k, v, go, scale)
    dense = dense_causal_backward(q, k, v, go, scale)
    fused = _fused(q, k, v, go, scale)
    for name, d, f, o in zip("qkv", dense, fused, oracle):
        assert d.dtype == dtype and d.shape == o.shape, name
        # within the rounding of the result's own dtype, and no worse than the fused kernel by much
        assert _rel_err(d, o) <= (3e-3 if dtype is torch.bfloat16 else 1e-6), name
        assert _rel_err(d, o) <= 1.5 * _rel_err(f, o) + 1e-7, name


def test_value_heads_narrower_than_query_heads():
    # Multi-head latent attention (DeepSeek-V2/V3): queries and keys of 24, values of 16. dV was
    # reshaped with the query's head size, and such a model's first training step raised.
    q, k, _, _ = _qkv(H=4, Hkv=2, D=24, dtype=torch.float32)
    v = torch.randn(3, 2, 37, 16, generator=torch.Generator().manual_seed(1))
    go = torch.randn(3, 4, 37, 16, generator=torch.Generator().manual_seed(2))
    scale = q.shape[-1] ** -0.5
    for name, d, o in zip("qkv", dense_causal_backward(q, k, v, go, scale), _oracle(q, k, v, go, scale)):
        assert d.shape == o.shape and _rel_err(d, o) <= 1e-6, name


def test_chunks_give_the_whole_batch_gradients(monkeypatch):
    q, k, v, go = _qkv(B=5)
    scale = 0.25
    whole = dense_causal_backward(q, k, v, go, scale)
    monkeypatch.setattr(attention, "CHUNK_ELEMENTS", 4 * 37 * 37 * 2)  # two rows at a time: chunks of 2, 2, 1
    chunked = dense_causal_backward(q, k, v, go, scale)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _models(model_dir):
    from rlmix.models.io import load_causal_lm

    fused, dense = load_causal_lm(model_dir), load_causal_lm(model_dir)
    assert fused.config._attn_implementation == "sdpa"
    assert use_dense_backward(dense) and dense.config._attn_implementation == NAME
    return fused.train(), dense.train()


@pytest.mark.parametrize("autocast", [torch.bfloat16, None])
def test_a_model_computes_the_same_logits_and_close_gradients(tiny_qwen3_moe_dir, autocast):
    fused, dense = _models(tiny_qwen3_moe_dir)  # 4 query heads over 2 KV heads
    ids = torch.randint(3, fused.config.vocab_size, (3, 29), generator=torch.Generator().manual_seed(1))
    outs = []
    for model in (fused, dense):
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).sum().backward()
        outs.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (lf, gf), (ld, gd) = outs
    assert torch.equal(lf, ld)  # the forward is the same call: bit for bit
    for name in gf:
        tol = 3e-2 if autocast else 1e-4
        assert _rel_err(gd[name], gf[name].double()) <= tol, name


def test_other_cases_are_sdpa_itself(tiny_llama_dir, tmp_path, monkeypatch):
    fused, dense = _models(tiny_llama_dir)
    calls = []
    apply = attention._DenseBackwardSdpa.apply
    monkeypatch.setattr(attention._DenseBackwardSdpa, "apply", lambda *a: calls.append(1) or apply(*a))
    ids = torch.randint(3, fused.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: a mask, which the dense backward does not take
    with torch.no_grad():
        assert torch.equal(fused(input_ids=ids).logits, dense(input_ids=ids).logits)
    a = fused(input_ids=ids, attention_mask=mask).logits
    b = dense(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(a, b)
    assert not calls  # neither without grad nor with a mask
    # generation (a KV cache, one query at a time) runs as with sdpa
    with torch.no_grad():
        torch.testing.assert_close(fused.generate(ids, max_new_tokens=4, do_sample=False),
                                   dense.generate(ids, max_new_tokens=4, do_sample=False), rtol=0, atol=0)
    # a checkpoint the trainer saves says nothing of the switch: any loader reads plain sdpa
    dense.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    assert json.loads((tmp_path / "config.json").read_text()).get("attn_implementation") in (None, "sdpa")
    dense(input_ids=ids).logits.sum().backward()
    assert len(calls) == dense.config.num_hidden_layers  # the trainer's case does take it
    monkeypatch.setattr(attention, "CHUNK_ELEMENTS", 2 * 11 * 11 - 1)  # one row's scores over the budget
    dense(input_ids=ids).logits.sum().backward()
    assert len(calls) == dense.config.num_hidden_layers  # ... unless the sequence is too long for it


@pytest.mark.parametrize("setting,implementation", [("dense", NAME), ("fused", "sdpa")])
def test_the_torch_trainer_takes_the_setting(tiny_llama_dir, setting, implementation):
    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import AttentionBackward, CorrectionConfig, TrainerConfig
    from rlmix.trainers.torch_trainer import TorchTrainer

    cfg = TrainerConfig(attention_backward=AttentionBackward(setting))
    trainer = TorchTrainer(tiny_llama_dir, cfg, resolve_correction(CorrectionConfig()), seed=0)
    assert trainer.model.config._attn_implementation == implementation
