"""Number formats, emulated on the CPU by quantise-dequantise (pure functions, fp32 in and out).

A sampler on an accelerator computes with weights stored in some format and activations rounded
to some dtype. On the CPU we reproduce the *values* such hardware computes with: every function
here maps an fp32 tensor to the fp32 tensor of values the format can represent, with the scaling
rule the usual kernels use. Nothing here knows about models, configs or accelerators.

Formats (``Precision``; member names are the YAML spelling):

- ``fp32``: identity.
- ``bf16`` / ``fp16``: cast round trip (round to nearest even).
- ``fp8_e4m3`` / ``fp8_e5m2``: symmetric scale ``s = amax / fmax`` per output channel (weights)
  or per token (activations), or one per tensor (``fp8_qdq_tensor``), values cast to
  ``torch.float8_e4m3fn`` / ``float8_e5m2``.
- ``int8``: symmetric per-channel ``s = amax / 127``, ``round(w / s)`` clamped to [-127, 127].
- ``int4``: symmetric group-wise along the input dim (groups of ``block_size``, default 64),
  ``s = amax / 7``, ``round(w / s)`` clamped to [-8, 7] (GPTQ/AWQ-style weight-only).
- ``nvfp4``: NVIDIA's two-level block format: e2m1 values {0, .5, 1, 1.5, 2, 3, 4, 6} (signed)
  in blocks of 16 along the input dim, each block scaled by an fp8-e4m3 number, all blocks by
  one fp32 tensor scale ``g = amax / (448 · 6)``; block scale ``fp8(amax_block / 6 / g)``.
"""

from __future__ import annotations

import enum

import torch


class Precision(enum.Enum):
    """A number format. Member names are the YAML spelling."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"
    int8 = "int8"
    int4 = "int4"
    nvfp4 = "nvfp4"


_CAST_DTYPES = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}
_FP8_DTYPES = {Precision.fp8_e4m3: torch.float8_e4m3fn, Precision.fp8_e5m2: torch.float8_e5m2}
NVFP4_BLOCK = 16
INT4_DEFAULT_GROUP = 64


def _safe_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """``amax / qmax``, with 1 where amax is 0 (an all-zero row stays zero)."""
    scale = amax / qmax
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fp32 values ``x`` holds once stored in ``dtype`` (a cast there and back; nearest even for
    bf16/fp16). The one rounding both the samplers' formats and the trainer's fp16 emulation use."""
    return x.to(dtype).float()


def _fp8_scaled(x: torch.Tensor, fmt: Precision, amax: torch.Tensor) -> torch.Tensor:
    """``s·fp8(x/s)`` with ``s = amax/fmax`` (``amax`` broadcast against ``x``), saturating."""
    dtype = _FP8_DTYPES[fmt]
    fmax = torch.finfo(dtype).max
    scale = _safe_scale(amax, fmax)
    return (x / scale).clamp(-fmax, fmax).to(dtype).float() * scale


def fp8_qdq(x: torch.Tensor, fmt: Precision) -> torch.Tensor:
    """fp8 with a symmetric scale per row (last dim reduced): ``s·fp8(x/s)``, ``s = amax/fmax``."""
    return _fp8_scaled(x, fmt, x.abs().amax(dim=-1, keepdim=True))


def fp8_qdq_tensor(x: torch.Tensor, fmt: Precision, real: torch.Tensor | None = None) -> torch.Tensor:
    """fp8 with one symmetric scale for the whole tensor, ``s = amax/fmax``: a weight matrix stored
    per tensor, or a GEMM input under a dynamic per-tensor scale, which every token of the step
    shares. ``real`` (bool, ``x.shape[:-1]``): the rows the amax is taken over (left padding, which
    an engine without padding never sees, stays out of it); all rows are rounded with that scale."""
    mag = x.abs().amax(dim=-1)
    return _fp8_scaled(x, fmt, (mag.masked_fill(~real, 0.0) if real is not None else mag).amax())


def fp8_cast(x: torch.Tensor, fmt: Precision) -> torch.Tensor:
    """fp8 with unit scale (saturating), as an uncalibrated fp8 KV cache stores values."""
    dtype = _FP8_DTYPES[fmt]
    fmax = torch.finfo(dtype).max
    return x.clamp(-fmax, fmax).to(dtype).float()


def int_qdq(x: torch.Tensor, bits: int, group: int | None = None) -> torch.Tensor:
    """Symmetric integer grid per row, or per group of ``group`` columns along the last dim.

    ``s = amax / (2^(bits-1) - 1)``, ``q = clamp(round(x / s), -2^(bits-1), 2^(bits-1) - 1)``.
    """
    qmax = 2 ** (bits - 1) - 1
    shape = x.shape
    if group is not None:
        if shape[-1] % group:
            raise ValueError(f"last dim {shape[-1]} is not a multiple of the quantisation group {group}")
        x = x.reshape(*shape[:-1], shape[-1] // group, group)
    scale = _safe_scale(x.abs().amax(dim=-1, keepdim=True), qmax)
    q = torch.round(x / scale).clamp(-qmax - 1, qmax)
    return (q * scale).reshape(shape)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest signed e2m1 value (saturating at ±6), ties to even mantissa.

    The grid is steps of 0.5 below 2, of 1 in [2, 4) and of 2 from 4 to 6, and on each of those an
    even multiple of the step is an even mantissa, so ``torch.round`` (half to even) on the scaled
    magnitude gives the tie rule (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
    5 -> 4). Arithmetic rather than a search over the grid: a weight load quantises every matrix.
    """
    mag = x.abs()
    q = torch.where(mag < 2.0, torch.round(mag * 2.0) * 0.5,
                    torch.where(mag < 4.0, torch.round(mag), (torch.round(mag * 0.5) * 2.0).clamp(max=6.0)))
    return torch.copysign(q, x)


def nvfp4_qdq(x: torch.Tensor, block: int = NVFP4_BLOCK, per_row: bool = False) -> torch.Tensor:
    """NVFP4: e2m1 values, fp8-e4m3 scale per ``block`` elements of the last dim, fp32 tensor scale.

    ``g = amax(x) / (448·6)``; per block ``s_b = fp8_e4m3(amax_b / 6 / g)``; value
    ``e2m1(x / (s_b·g))·s_b·g``. A block whose scale underflows to 0 dequantises to 0.
    ``per_row``: ``g`` from each row's amax instead of the whole tensor's (an activation: one
    token's rounding then never depends on what it is batched with).
    """
    shape = x.shape
    if shape[-1] % block:
        raise ValueError(f"last dim {shape[-1]} is not a multiple of the nvfp4 block {block}")
    xb = x.reshape(*shape[:-1], shape[-1] // block, block)
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    amax = x.abs().amax(dim=-1, keepdim=True).unsqueeze(-1) if per_row else x.abs().amax()
    g = _safe_scale(amax, fp8_max * 6.0)
    block_scale = (xb.abs().amax(dim=-1, keepdim=True) / 6.0 / g).clamp(max=fp8_max)
    block_scale = block_scale.to(torch.float8_e4m3fn).float() * g
    safe = torch.where(block_scale > 0, block_scale, torch.ones_like(block_scale))
    q = e2m1_round(xb / safe) * block_scale
    return q.reshape(shape)


def quantize_dequantize(w: torch.Tensor, fmt: Precision, block_size: int | None = None,
                        per_tensor: bool = False) -> torch.Tensor:
    """The values a weight matrix ``w`` (out, in) holds when stored in ``fmt``, as fp32.

    Scales run along the input dim: per output channel (fp8, int8), per ``block_size`` group
    (int4, default 64, or the whole row when smaller), per 16-element block (nvfp4).
    ``per_tensor``: one scale for the whole matrix instead (fp8 only).
    """
    w = w.float()
    if fmt is Precision.fp32:
        return w.clone()
    if fmt in _CAST_DTYPES:
        return round_to(w, _CAST_DTYPES[fmt])
    if fmt in _FP8_DTYPES:
        return fp8_qdq_tensor(w, fmt) if per_tensor else fp8_qdq(w, fmt)
    if fmt is Precision.int8:
        return int_qdq(w, bits=8)
    if fmt is Precision.int4:
        group = min(block_size or INT4_DEFAULT_GROUP, w.shape[-1])
        return int_qdq(w, bits=4, group=group)
    if fmt is Precision.nvfp4:
        return nvfp4_qdq(w, block_size or NVFP4_BLOCK)
    raise ValueError(f"no weight format {fmt}")


def round_activation(x: torch.Tensor, fmt: Precision) -> torch.Tensor:
    """The values an activation tensor holds in ``fmt`` (dynamic per-token scales for fp8/int8/nvfp4).

    Scales are taken over the last dim (one token's features), as dynamic activation
    quantisation does. int4 is a weight-only format and is refused.
    """
    if fmt is Precision.fp32:
        return x
    if fmt in _CAST_DTYPES:
        return round_to(x, _CAST_DTYPES[fmt])
    if fmt in _FP8_DTYPES:
        return fp8_qdq(x, fmt)
    if fmt is Precision.int8:
        return int_qdq(x, bits=8)
    if fmt is Precision.nvfp4:
        return nvfp4_qdq(x, per_row=True)
    raise ValueError(f"{fmt.name} is a weight-only format, not an activation format")


def round_kv(x: torch.Tensor, fmt: Precision) -> torch.Tensor:
    """The values a KV cache stores: bf16/fp16 by cast, fp8 with unit scale (vLLM's uncalibrated default)."""
    if fmt is Precision.fp32:
        return x
    if fmt in _CAST_DTYPES:
        return round_to(x, _CAST_DTYPES[fmt])
    if fmt in _FP8_DTYPES:
        return fp8_cast(x, fmt)
    raise ValueError(f"{fmt.name} is not a KV-cache format (fp32, bf16, fp16, fp8_e4m3, fp8_e5m2)")
