"""The trainer's arithmetic format (``trainer.precision``): autocast dtype, published weights, and
FP16 on a CPU.

Torch's CPU GEMMs have no fast fp16 path (here fp16 products run ~40x slower than bf16 ones), so on
a CPU an FP16 trainer is emulated the way the emulated samplers are: every product autocast would
run in fp16 takes operands rounded to fp16, accumulates in fp32 (as tensor cores do) and rounds its
result to fp16. The roundings are casts, so gradients pass through them and are rounded to fp16
too, underflow included: the loss scaler has the same work to do as on a GPU. What it leaves out:
autocast also runs the elementwise ops between products (activation, gating) in fp16; here they
stay fp32, which puts the emulation about twice as close to torch's fp16 forward as plain fp32 is
and ten times closer than bf16 (tests/test_trainer_precision.py).
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from rlmix.config.schema import TrainerPrecision
from rlmix.samplers.precision import round_to

AUTOCAST = {TrainerPrecision.bf16: torch.bfloat16, TrainerPrecision.fp16: torch.float16, TrainerPrecision.fp32: None}


def autocast_dtype(precision: TrainerPrecision) -> torch.dtype | None:
    """The dtype the trainer's forward autocasts to (None: plain fp32)."""
    return AUTOCAST[precision]


def published_dtype(precision: TrainerPrecision) -> torch.dtype:
    """The format samplers receive the weights in: the trainer's 16-bit format (bf16 for fp32)."""
    return AUTOCAST[precision] or torch.bfloat16


def emulated(dtype: torch.dtype | None, device_type: str) -> bool:
    """Whether products in ``dtype`` are emulated on this device (fp16 on a CPU)."""
    return dtype is torch.float16 and device_type == "cpu"


def _round_fp32(x, dtype: torch.dtype):
    """``round_to`` for an fp32 tensor argument; anything else (ints, flags, None) passes as is."""
    return round_to(x, dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x


class EmulatedLowPrecisionProducts(TorchFunctionMode):
    """Autocast's lower-precision ops (linear, matmul, bmm, attention, ...) with operands and result
    rounded to ``dtype`` around an fp32 product."""

    OPS = {
        torch.nn.functional.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
        torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.baddbmm, torch.addmm, torch.nn.functional.scaled_dot_product_attention,
    }

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.OPS:
            return func(*args, **kwargs)
        args = tuple(_round_fp32(a, self.dtype) for a in args)
        kwargs = {k: _round_fp32(v, self.dtype) for k, v in kwargs.items()}
        return _round_fp32(func(*args, **kwargs), self.dtype)


def autocast_context(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Where the trainer's forward runs: autocast to ``dtype``, its CPU emulation for fp16, or fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    if emulated(dtype, device_type):
        return EmulatedLowPrecisionProducts(dtype)
    return torch.autocast(device_type, dtype=dtype)


def product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a @ b`` with operands and result in ``dtype`` (fp16 on a CPU: emulated, result fp16)."""
    if emulated(dtype, a.device.type):
        return (round_to(a, dtype) @ round_to(b, dtype)).to(dtype)
    return a.to(dtype) @ b.to(dtype)
