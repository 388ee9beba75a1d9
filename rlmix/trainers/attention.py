"""The trainer's attention on the CPU: PyTorch's fused SDPA forward, a dense fp32 backward.

PyTorch's CPU flash-attention kernel (``_scaled_dot_product_flash_attention_for_cpu``) is fast
forward and slow backward: at the embedded model's training shapes (128 rows, 4 heads of 32, 64
positions, bf16) its backward takes ~16x its forward, and it was the largest single item of a
trainer step (``scripts/bench_trainer_step.py``; docs/performance.md, "The trainer step").

``attention`` keeps the forward exactly: it calls the same ``scaled_dot_product_attention`` with
the same arguments as transformers' ``sdpa`` implementation, so the trainer's logits — what every
correction compares with the samplers' — are bit for bit those of ``sdpa``. Only the backward
differs: it recomputes the attention probabilities in fp32 from the saved queries and keys and
forms the three gradients with dense matrix products (the textbook softmax backward), in chunks
of rows so that the (L, L) scores of a chunk stay under ``CHUNK_ELEMENTS``. Its gradients differ
from the fused kernel's at bf16 rounding and sit closer to an fp64 oracle than the fused kernel's
do (``tests/test_trainer_attention.py`` checks both against the oracle).

Only the trainer's own case takes this path: a CPU tensor under autograd, causal, no mask, no
dropout, queries and keys of one length (``token_batch`` runs the model on whole sequences with no
attention mask), and one row's (heads, L, L) scores within ``CHUNK_ELEMENTS`` (L ≤ 2,048 at 4
heads, 724 at 32): the fused kernel's memory grows with L, the dense backward's with L². Anything
else — inference, a mask, a KV cache, longer sequences — is transformers' ``sdpa`` itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlmix.config.schema import AttentionBackward

NAME = "rlmix_sdpa"
CHUNK_ELEMENTS = 1 << 24  # fp32 scores held at once by the backward: 64 MiB per (rows, heads, L, L) tensor


class _DenseBackwardSdpa(torch.autograd.Function):
    """Causal SDPA: the fused forward, the dense fp32 backward. ``q`` (B, H, L, D); ``k``, ``v``
    (B, Hkv, L, D) with H a multiple of Hkv (grouped-query attention, ``enable_gqa``)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float | None, enable_gqa: bool) -> Tensor:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)
        ctx.save_for_backward(q, k, v)
        ctx.scale = scale if scale is not None else q.shape[-1] ** -0.5
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v = ctx.saved_tensors
        dq, dk, dv = dense_causal_backward(q, k, v, grad_out, ctx.scale)
        return dq, dk, dv, None, None


def dense_causal_backward(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of causal softmax attention with respect to ``q``, ``k``, ``v``, computed in fp32
    and returned in each input's dtype. P = softmax(s·QKᵀ + causal mask); dV = PᵀdO; dP = dO Vᵀ;
    dS = P ⊙ (dP − rowsum(P ⊙ dP)); dQ = s·dS K; dK = s·dSᵀQ. Grouped heads: query head h reads
    key/value head h // (H / Hkv), and that head's gradients sum over its group."""
    B, H, L, D = q.shape
    groups = H // k.shape[1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    allowed = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    rows = max(1, CHUNK_ELEMENTS // (H * L * L))
    for b in range(0, B, rows):
        sl = slice(b, b + rows)
        qf, go = q[sl].float(), grad_out[sl].float()
        kf = k[sl].float().repeat_interleave(groups, dim=1)
        vf = v[sl].float().repeat_interleave(groups, dim=1)
        p = torch.matmul(qf, kf.transpose(-1, -2)).mul_(scale).masked_fill_(~allowed, float("-inf")).softmax(-1)
        dv_h = torch.matmul(p.transpose(-1, -2), go)
        dp = torch.matmul(go, vf.transpose(-1, -2))
        ds = dp.sub_((dp * p).sum(-1, keepdim=True)).mul_(p)
        dq[sl] = torch.matmul(ds, kf).mul_(scale).to(q.dtype)
        dk_h = torch.matmul(ds.transpose(-1, -2), qf).mul_(scale)
        n = dk_h.shape[0]
        dk[sl] = dk_h.view(n, -1, groups, L, D).sum(2).to(k.dtype)
        dv[sl] = dv_h.view(n, -1, groups, L, v.shape[-1]).sum(2).to(v.dtype)  # value heads may be narrower (MLA)
    return dq, dk, dv


def attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """A transformers attention implementation (``AttentionInterface``): ``sdpa``'s, with the dense
    backward where the trainer's case allows (module docstring)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward, use_gqa_in_sdpa

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    plain = kwargs.get("position_bias") is None and kwargs.get("cache") is None and not kwargs.get("output_attentions")
    q_len = query.shape[2]
    fits = query.shape[1] * q_len * q_len <= CHUNK_ELEMENTS  # one row's scores: else sdpa's O(L) memory
    if not (torch.is_grad_enabled() and query.device.type == "cpu" and attention_mask is None and not dropout
            and causal and plain and q_len > 1 and key.shape[2] == q_len and fits):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    gqa = False
    if getattr(module, "num_key_value_groups", 1) > 1:  # as sdpa decides it, so the forward is the same call
        gqa = use_gqa_in_sdpa(None, key, value)
        if not gqa:
            key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    out = _DenseBackwardSdpa.apply(query, key, value, scaling, gqa)
    return out.transpose(1, 2).contiguous(), None


def set_attention_backward(model: torch.nn.Module, setting: AttentionBackward) -> None:
    """``trainer.attention_backward`` on a freshly loaded trainer model (both trainers call this)."""
    if setting is AttentionBackward.dense:
        use_dense_backward(model)


def use_dense_backward(model: torch.nn.Module) -> bool:
    """Switch a model that runs transformers' ``sdpa`` to ``attention``; True if it did. Which path
    a call takes is decided per call, so a model moved to a GPU afterwards (DeepSpeed's engine)
    runs ``sdpa`` itself there.

    The switch lives in the loaded model only (``config._attn_implementation``): a saved
    checkpoint does not record it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
