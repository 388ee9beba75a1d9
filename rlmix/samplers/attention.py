"""Attention-kernel families, emulated on the CPU by how they round (see ``KernelFamily``).

Shapes: ``q`` (B, Hkv, G·L, D) — the query heads that share one KV head stacked along the
query axis (grouped-query attention without copying K/V); ``k``, ``v`` (B, Hkv, C, D);
``allowed`` (B, 1, G·L, C) bool. Returns (B, Hkv, G·L, D) fp32 values rounded to ``act``.

Every query row must be allowed at least one key (callers let padding queries attend to
themselves), so no row normalises by zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmix.samplers.accelerators import KernelFamily
from rlmix.samplers.precision import Precision, fp8_cast, round_activation


@dataclass(frozen=True)
class BlockwiseNumerics:
    """A flash-style kernel: keys in blocks of ``block``; probabilities rounded to ``probs``;
    running sum and output accumulated (and rounded after every block) in ``acc``. ``sum_rounded``:
    the row sum adds the rounded probabilities (else the fp32 ones, only the PV product seeing them
    rounded)."""

    block: int
    probs: Precision
    acc: Precision
    sum_rounded: bool = True

    def for_activations(self, act: Precision) -> BlockwiseNumerics:
        """The kernel compiled for an fp16 model: its 16-bit probabilities and accumulators are
        fp16 (flash kernels cast P to V's dtype), not bf16."""
        if act is not Precision.fp16:
            return self
        fp16 = {Precision.bf16: Precision.fp16}
        return BlockwiseNumerics(self.block, fp16.get(self.probs, self.probs), fp16.get(self.acc, self.acc),
                                 self.sum_rounded)


BLOCKWISE: dict[KernelFamily, BlockwiseNumerics] = {
    KernelFamily.online_softmax_fp32acc: BlockwiseNumerics(64, Precision.bf16, Precision.fp32),
    KernelFamily.online_softmax_bf16: BlockwiseNumerics(16, Precision.bf16, Precision.bf16),
    KernelFamily.online_softmax_fp16: BlockwiseNumerics(32, Precision.fp16, Precision.fp16),
}


# FlashAttention-3's fp8 forward: keys in blocks of 128; the probabilities enter the PV GEMM as fp8
# e4m3 after a shift of 2^8 (its ``Max_offset``: p ≤ 1 would leave most of e4m3's range unused); the
# row sum, running max and output stay fp32.
FP8_BLOCK = 128
FP8_PROBS_OFFSET = 256.0
FP8_ATTENTION = BlockwiseNumerics(FP8_BLOCK, Precision.fp8_e4m3, Precision.fp32, sum_rounded=False)


def _round_probs(p: torch.Tensor, probs: Precision) -> torch.Tensor:
    """Probabilities as the PV GEMM takes them: in fp8 at unit scale after the 2^8 shift, else rounded
    to the 16/32-bit ``probs``."""
    if probs is Precision.fp8_e4m3:
        return fp8_cast(p * FP8_PROBS_OFFSET, probs) / FP8_PROBS_OFFSET
    return round_activation(p, probs)


def _accumulate(x: torch.Tensor, acc: Precision) -> torch.Tensor:
    """Round a running accumulator, saturating at the format's largest finite value (a long
    context must not turn an fp16 running sum into inf)."""
    if acc is Precision.fp16:
        x = x.clamp(-torch.finfo(torch.float16).max, torch.finfo(torch.float16).max)
    return round_activation(x, acc)


def exact_attention(q, k, v, allowed, scale: float, act: Precision) -> torch.Tensor:
    """``softmax(q kᵀ·scale)`` over the whole row in fp32; probabilities rounded to ``act``
    before the PV product (what an eager kernel in that dtype does)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = round_activation(torch.softmax(scores, dim=-1), act)
    return round_activation(torch.matmul(probs, v), act)


def online_attention(q, k, v, allowed, scale: float, act: Precision, num: BlockwiseNumerics) -> torch.Tensor:
    """Online softmax over key blocks (Milakov & Gimelshein 2018; FlashAttention):

        m' = max(m, max_j s_j);  p_j = rnd_probs(exp(s_j − m'));  c = exp(m − m')
        l' = rnd_acc(c·l + Σ_j p_j);  o' = rnd_acc(c·o + Σ_j p_j v_j);  out = o / l

    (with ``num.sum_rounded`` false, ``l`` sums the unrounded ``exp(s_j − m')``).

    The running max stays fp32 (a max is exact); a block a row may not see at all leaves that
    row's state unchanged (exp(−inf) = 0, guarded against −inf − (−inf)).
    """
    shape = q.shape[:-1] + (1,)
    m = torch.full(shape, float("-inf"))
    l = torch.zeros(shape)
    o = torch.zeros(q.shape)
    for start in range(0, k.shape[-2], num.block):
        kb, vb = k[..., start : start + num.block, :], v[..., start : start + num.block, :]
        s = torch.matmul(q, kb.transpose(-1, -2)) * scale
        s = s.masked_fill(~allowed[..., start : start + num.block], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        exact = torch.exp(s - m_safe)
        p = _round_probs(exact, num.probs)
        c = torch.exp(m - m_safe)
        l = _accumulate(c * l + (p if num.sum_rounded else exact).sum(dim=-1, keepdim=True), num.acc)
        o = _accumulate(c * o + torch.matmul(p, vb), num.acc)
        m = m_new
    return round_activation(o / l, act)


def fp8_attention(q, k, v, allowed, scale: float, act: Precision) -> torch.Tensor:
    """Attention in the fp8 domain, as vLLM runs it on Hopper (FlashAttention-3) over an fp8 KV cache:
    the query is cast to fp8 e4m3 at unit scale like the cache (``k``, ``v`` already hold e4m3
    values), both GEMMs take fp8 inputs, and the running max, row sum and output stay fp32
    (``FP8_ATTENTION``)::

        m' = max(m, max_j s_j);  p_j = exp(s_j − m');  c = exp(m − m')
        l' = c·l + Σ_j p_j;  o' = c·o + Σ_j fp8(2⁸·p_j)/2⁸ · v_j;  out = o / l

    The row sum is taken before the probabilities are rounded (as the kernel sums in registers);
    only the PV product sees them in fp8, where a probability under 2^-18 of the row's running
    max becomes 0 and the rest keep at most 3 mantissa bits.
    """
    return online_attention(fp8_cast(q, Precision.fp8_e4m3), k, v, allowed, scale, act, FP8_ATTENTION)


def attend(q, k, v, allowed, scale: float, act: Precision, kernel: KernelFamily, fp8: bool = False) -> torch.Tensor:
    """Dispatch to the kernel family's numerics (in fp16 for an fp16 model); ``fp8``: FlashAttention-3's
    fp8 path instead (``fp8_attention``)."""
    if fp8:
        return fp8_attention(q, k, v, allowed, scale, act)
    if kernel is KernelFamily.fp32_softmax:
        return exact_attention(q, k, v, allowed, scale, act)
    return online_attention(q, k, v, allowed, scale, act, BLOCKWISE[kernel].for_activations(act))
