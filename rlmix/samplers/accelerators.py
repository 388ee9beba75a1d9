"""The accelerator catalog and precision views: what each accelerator type computes natively.

A ``PrecisionView`` is how one sampler pool computes: weight format, activation dtype, the
format matmul inputs are quantised to (W8A8 fp8), KV-cache format, and the attention-kernel
family. Mismatch against the trainer follows the kernel family as on real hardware, so the
catalog assigns one family per GPU generation (docs/samplers.md explains each choice).

``resolve_view`` turns a (accelerator, precision) pair from the config into a view, refusing
(``ConfigError``) a precision the accelerator has no native support for unless emulation beyond
the hardware is asked for explicitly; such a view says so in its label.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rlmix.errors import ConfigError
from rlmix.samplers.precision import Precision

__all__ = ["CATALOG", "AcceleratorSpec", "Fp8Scales", "KernelFamily", "PrecisionView", "default_linear_inputs", "resolve_view"]


class KernelFamily(enum.Enum):
    """Attention-kernel numerics. Member names are the YAML spelling.

    - ``fp32_softmax``: scores, softmax and PV product in fp32 over the whole row (exact reference).
    - ``online_softmax_fp32acc``: FlashAttention-2 style: 64-key blocks, probabilities rounded to
      bf16 before the PV matmul, fp32 running max/sum/output (Ampere, Ada, consumer Blackwell).
    - ``online_softmax_bf16``: 16-key blocks, bf16 probabilities and bf16 running sum/output,
      rescaled every block (the low-precision-accumulator family; Hopper pools).
    - ``online_softmax_fp16``: 32-key blocks, fp16 probabilities and fp16 running sum/output
      (datacenter Blackwell pools).
    """

    fp32_softmax = "fp32_softmax"
    online_softmax_fp32acc = "online_softmax_fp32acc"
    online_softmax_bf16 = "online_softmax_bf16"
    online_softmax_fp16 = "online_softmax_fp16"


class Fp8Scales(enum.Enum):
    """How finely an fp8 pool's W8A8 GEMMs are scaled. Member names are the YAML spelling.

    - ``channel``: a scale per output channel of each weight matrix, a dynamic scale per token of
      each GEMM input (FP8-dynamic checkpoints; the default).
    - ``tensor``: one scale per weight matrix, one dynamic scale per GEMM input over all the tokens
      of the step (vLLM's online ``quantization=fp8``): a token's rounding then depends on the
      largest activation of whatever it is batched with.
    """

    channel = "channel"
    tensor = "tensor"


_FLOAT = (Precision.fp32, Precision.bf16, Precision.fp16)
_FP8 = (Precision.fp8_e4m3, Precision.fp8_e5m2)
_WEIGHT_ONLY_INT = (Precision.int8, Precision.int4)
_ACTIVATION_QUANT = (Precision.int8, Precision.nvfp4)  # weight formats whose GEMMs may quantise inputs too


@dataclass(frozen=True)
class AcceleratorSpec:
    """One accelerator type: its native weight and KV-cache formats and its attention-kernel family."""

    name: str
    generation: str
    native_weight_precisions: tuple[Precision, ...]
    native_kv_precisions: tuple[Precision, ...]
    kernel_family: KernelFamily


def _gpu(name: str, generation: str, weights: tuple, kv: tuple, kernel: KernelFamily) -> AcceleratorSpec:
    return AcceleratorSpec(name, generation, tuple(weights), tuple(kv), kernel)


_AMPERE_W = _FLOAT + _WEIGHT_ONLY_INT
_FP8_W = _FLOAT + _FP8 + _WEIGHT_ONLY_INT
_BLACKWELL_W = _FP8_W + (Precision.nvfp4,)
_KV_16 = _FLOAT
_KV_FP8 = _FLOAT + _FP8

CATALOG: dict[str, AcceleratorSpec] = {
    spec.name: spec
    for spec in (
        _gpu("A100", "ampere", _AMPERE_W, _KV_16, KernelFamily.online_softmax_fp32acc),
        _gpu("L4", "ada", _FP8_W, _KV_FP8, KernelFamily.online_softmax_fp32acc),
        _gpu("H100", "hopper", _FP8_W, _KV_FP8, KernelFamily.online_softmax_bf16),
        _gpu("H200", "hopper", _FP8_W, _KV_FP8, KernelFamily.online_softmax_bf16),
        _gpu("B200", "blackwell", _BLACKWELL_W, _KV_FP8, KernelFamily.online_softmax_fp16),
        _gpu("B300", "blackwell", _BLACKWELL_W, _KV_FP8, KernelFamily.online_softmax_fp16),
        _gpu("RTX_PRO_6000", "blackwell_consumer", _BLACKWELL_W, _KV_FP8, KernelFamily.online_softmax_fp32acc),
        AcceleratorSpec(
            "CPU",
            "cpu",
            (Precision.fp32, Precision.bf16) + _WEIGHT_ONLY_INT,
            (Precision.fp32, Precision.bf16),
            KernelFamily.fp32_softmax,
        ),
    )
}


@dataclass(frozen=True)
class PrecisionView:
    """How one sampler pool computes (all emulated on the CPU by the torch sampler).

    ``weights``: storage format of the decoder's linear layers (quantise-dequantise at load).
    ``activations``: dtype every activation is rounded to after each op (embeddings, norms,
    lm_head are stored in it too). ``linear_inputs``: format the inputs of the decoder's linear
    layers are quantised to (fp8 for W8A8 pools, else the activation dtype). ``kv_cache``: the
    KV-cache format. ``kernel``: attention-kernel family. ``int4_group``: int4 group size.
    ``fp8_scales``: the scale granularity of fp8 weights and linear inputs (``Fp8Scales``).
    ``fp8_attention``: attention runs in fp8 over the fp8 KV cache, query and probabilities
    included (FlashAttention-3 on Hopper; ``rlmix.samplers.attention.fp8_attention``).
    """

    accelerator: str
    weights: Precision
    activations: Precision
    linear_inputs: Precision
    kv_cache: Precision
    kernel: KernelFamily
    emulated_beyond_hardware: bool = False
    int4_group: int | None = None
    fp8_scales: Fp8Scales = Fp8Scales.channel
    fp8_attention: bool = False

    @property
    def per_tensor(self) -> bool:
        """fp8 weights and linear inputs scaled per tensor (``Fp8Scales.tensor``)."""
        return self.fp8_scales is Fp8Scales.tensor

    @classmethod
    def exact(cls) -> PrecisionView:
        """fp32 everywhere with the exact attention kernel: the reference (matches HF fp32)."""
        fp32 = Precision.fp32
        return cls("CPU", fp32, fp32, fp32, fp32, KernelFamily.fp32_softmax)

    @property
    def label(self) -> str:
        """e.g. ``emulated:H100/fp8_e4m3/kv=bf16/online_softmax_bf16``; names beyond-hardware emulation,
        GEMM inputs other than the format's usual ones (``+inputs=nvfp4``) and fp8 attention."""
        tail = "+beyond_hardware" if self.emulated_beyond_hardware else ""
        scales = "+tensor_scales" if self.per_tensor else ""
        inputs = "" if self.linear_inputs is default_linear_inputs(self.weights) else f"+inputs={self.linear_inputs.name}"
        kernel = "fp8_attention" if self.fp8_attention else self.kernel.name
        return f"emulated:{self.accelerator}/{self.weights.name}{scales}{inputs}/kv={self.kv_cache.name}/{kernel}{tail}"

    def tags(self) -> dict[str, str]:
        """Rollout tags (string-valued) describing this view."""
        return {
            "accelerator": self.accelerator,
            "precision": self.weights.name,
            "activations": self.activations.name,
            "linear_inputs": self.linear_inputs.name,
            "kv_precision": self.kv_cache.name,
            "kernel": self.kernel.name,
            "fp8_scales": self.fp8_scales.name,
            "fp8_attention": str(self.fp8_attention).lower(),
            "emulated": "true",
            "emulated_beyond_hardware": str(self.emulated_beyond_hardware).lower(),
            "view": self.label,
        }


def _parse_precision(value: str, key: str, allowed: tuple[Precision, ...] = tuple(Precision)) -> Precision:
    try:
        return Precision[value]
    except KeyError:
        names = ", ".join(p.name for p in allowed)
        raise ConfigError(f"{key}={value!r} is not a precision; allowed: {names}") from None


def lookup_accelerator(accelerator: str) -> AcceleratorSpec:
    """The catalog entry for ``accelerator`` (case-insensitive), or a ConfigError listing the known ones."""
    spec = CATALOG.get(accelerator.upper())
    if spec is None:
        known = ", ".join(CATALOG)
        raise ConfigError(f"accelerator={accelerator!r} is not in the catalog; known: {known}")
    return spec


def _check_native(spec: AcceleratorSpec, fmt: Precision, native: tuple, key: str, allow: bool) -> bool:
    """True when ``fmt`` is emulated beyond the hardware; ConfigError when that is not allowed."""
    if fmt in native:
        return False
    if allow:
        return True
    allowed = ", ".join(p.name for p in native)
    raise ConfigError(
        f"accelerator {spec.name} has no native {key}={fmt.name}; allowed on {spec.name}: {allowed} "
        "(or set allow_emulation=true to emulate it beyond the hardware)"
    )


def resolve_view(
    accelerator: str,
    precision: str,
    kv_precision: str | None = None,
    allow_emulation: bool = False,
    int4_group: int | None = None,
    fp8_scales: str = "channel",
    linear_inputs: str | None = None,
    fp8_attention: bool = False,
) -> PrecisionView:
    """The view a pool of ``accelerator`` computes with when serving ``precision`` weights.

    Activations are bf16 (fp16 for fp16 weights, fp32 for fp32 weights); fp8 weights also
    quantise linear-layer inputs to fp8-e4m3 per token (W8A8, as fp8 serving does); int8/int4
    are weight-only; nvfp4 is weight-only with bf16 activations unless ``linear_inputs=nvfp4``
    (W4A4, Blackwell's FP4 GEMMs; ``int8`` likewise makes int8 W8A8, ``bf16`` makes fp8 W8A16).
    The KV cache defaults to the activation dtype. ``fp8_scales`` (``Fp8Scales``): per channel and
    token, or per tensor, for fp8 weights only. ``fp8_attention``: over an fp8-e4m3 KV cache, the
    query and probabilities in fp8 too (FlashAttention-3, Hopper). Raises ConfigError for unknown
    names or unsupported formats.
    """
    spec = lookup_accelerator(accelerator)
    weights = _parse_precision(precision, "precision")
    beyond = _check_native(spec, weights, spec.native_weight_precisions, "precision", allow_emulation)
    activations = weights if weights in _FLOAT else Precision.bf16
    inputs = _parse_inputs(linear_inputs, weights, activations)
    kv = activations if kv_precision is None else _parse_precision(kv_precision, "kv_precision", _KV_FP8)
    if kv not in _KV_FP8:
        allowed = ", ".join(p.name for p in _KV_FP8)
        raise ConfigError(f"kv_precision={kv.name} is not a KV-cache format; allowed: {allowed}")
    beyond |= _check_native(spec, kv, spec.native_kv_precisions, "kv_precision", allow_emulation)
    scales = _parse_scales(fp8_scales, weights)
    if fp8_attention:
        beyond |= _check_fp8_attention(spec, kv, allow_emulation)
    return PrecisionView(spec.name, weights, activations, inputs, kv, spec.kernel_family, beyond, int4_group,
                         scales, fp8_attention)


def default_linear_inputs(weights: Precision) -> Precision:
    """What a weight format's GEMMs take as input unless a pool says otherwise: fp8 for fp8 weights
    (W8A8), else the activation dtype (weight-only formats dequantise into a 16-bit GEMM)."""
    if weights in _FP8:
        return Precision.fp8_e4m3
    return weights if weights in _FLOAT else Precision.bf16


def _parse_inputs(value: str | None, weights: Precision, activations: Precision) -> Precision:
    """``linear_inputs``: the format's default, the activation dtype (a 16-bit GEMM), or the weight
    format itself where kernels quantise inputs to it (int8 W8A8, nvfp4 W4A4)."""
    default = default_linear_inputs(weights)
    if value is None:
        return default
    allowed = list(dict.fromkeys([default, activations, *([weights] if weights in _ACTIVATION_QUANT else [])]))
    inputs = Precision.__members__.get(value)
    if inputs not in allowed:
        raise ConfigError(f"linear_inputs={value!r} with precision={weights.name}: allowed: "
                          f"{', '.join(p.name for p in allowed)}")
    return inputs


def _check_fp8_attention(spec: AcceleratorSpec, kv: Precision, allow_emulation: bool) -> bool:
    """fp8 attention needs an fp8-e4m3 KV cache; natively, FlashAttention-3's Hopper (True: beyond it)."""
    if kv is not Precision.fp8_e4m3:
        raise ConfigError(f"fp8_attention=true runs attention over an fp8 KV cache; set kv_precision=fp8_e4m3 "
                          f"(it is {kv.name})")
    if spec.generation == "hopper":
        return False
    if allow_emulation:
        return True
    raise ConfigError(f"fp8_attention=true is FlashAttention-3's fp8 path, which runs on Hopper (H100, H200), "
                      f"not {spec.name} (or set allow_emulation=true to emulate it beyond the hardware)")


def _parse_scales(value: str, weights: Precision) -> Fp8Scales:
    try:
        scales = Fp8Scales[value]
    except KeyError:
        allowed = ", ".join(s.name for s in Fp8Scales)
        raise ConfigError(f"fp8_scales={value!r}: allowed: {allowed}") from None
    if scales is not Fp8Scales.channel and weights not in _FP8:
        raise ConfigError(f"fp8_scales={value} applies to fp8 weights (precision fp8_e4m3 or fp8_e5m2), "
                          f"not precision={weights.name}")
    return scales
