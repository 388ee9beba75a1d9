"""Load-time rules for ``backend: vllm`` pools, and how a pool's settings become engine arguments.

``resolve_engine`` is the one place a vLLM pool's precision and engine block are read: it returns
the ``VllmEngine`` the sampler is built from, and config validation is that call. Checked before
any process starts (no vLLM or torch import here). The platform is the pool's
accelerator, not the machine that loads the config: a CPU head node may launch GPU pools, and
``accelerator: CPU`` means the CPU build of vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlmix.errors import ConfigError

DTYPES = ("bfloat16", "float16", "float32")
# Quantisation methods the CPU build of vLLM 0.32 has kernels for: none of the fp8/int4 GPU ones.
CPU_QUANTIZATION: tuple[str | None, ...] = (None,)
# Methods a GPU pool may name: online fp8 and the usual pre-quantised checkpoint formats. Each is in
# vLLM 0.32's QuantizationMethods and not in its DEPRECATED_QUANTIZATION_METHODS (those need
# --allow-deprecated-quantization: fbgemm_fp8, fp_quant); 0.32 has no bitsandbytes or gguf.
GPU_QUANTIZATION: tuple[str | None, ...] = (
    None, "fp8", "modelopt", "modelopt_fp4", "awq", "awq_marlin", "gptq", "gptq_marlin",
    "compressed-tensors", "experts_int8",
)
CPU_KV_CACHE_DTYPES = ("auto",)
GPU_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
# One engine spans one node; HGX/DGX boards of every catalogued GPU type hold 8.
GPUS_PER_NODE = 8
# rlmix pool precision -> (vLLM dtype, vLLM quantization). fp8_e4m3 is vLLM's online dynamic fp8
# (weights quantised at load, e4m3); int8/int4/nvfp4 need pre-quantised checkpoints, not a view.
PRECISIONS: dict[str, tuple[str, str | None]] = {
    "fp32": ("float32", None), "float32": ("float32", None),
    "bf16": ("bfloat16", None), "bfloat16": ("bfloat16", None),
    "fp16": ("float16", None), "float16": ("float16", None),
    "fp8_e4m3": ("bfloat16", "fp8"), "fp8": ("bfloat16", "fp8"),
}
# The memory share a pool that leaves it at None gets, keyed by "on the CPU build": vLLM's own
# default on GPUs; on the CPU it is the share of host memory, which the rest of the run needs.
DEFAULT_MEMORY_UTILIZATION = {True: 0.15, False: 0.9}


def resolve_precision(precision: str, key: str = "precision") -> tuple[str, str | None]:
    """(dtype, quantization) of vLLM for an rlmix precision name; ConfigError naming ``key`` if none."""
    if precision not in PRECISIONS:
        raise ConfigError(f"{key}={precision!r} has no vLLM equivalent; vllm pools take one of "
                          f"{', '.join(sorted(PRECISIONS))} (int8/int4/nvfp4 need a pre-quantised checkpoint)")
    return PRECISIONS[precision]


def check_platform(dtype: str, quantization: str | None, on_cpu: bool) -> None:
    """Refuse a dtype/quantisation the platform cannot run, with one line naming the key."""
    if dtype not in DTYPES:
        raise ConfigError(f"vllm pool dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    if on_cpu and quantization not in CPU_QUANTIZATION:
        raise ConfigError(
            f"vllm pool quantization={quantization!r} is not supported by the CPU build of vLLM; "
            "set quantization to null (dtype bfloat16/float32) or run this pool on a GPU machine"
        )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_engine(key: str, engine, on_cpu: bool, model: Mapping | None) -> None:
    """The ``vllm:`` block of one pool (``rlmix.config.schema.VllmEngineConfig``)."""
    tp = engine.tensor_parallel_size
    limit = 1 if on_cpu else GPUS_PER_NODE
    _require(1 <= tp <= limit, f"{key}.vllm.tensor_parallel_size={tp}: must be in [1, {limit}] "
             f"({'the CPU build runs one engine per process' if on_cpu else 'one engine spans one node'})")
    heads = (model or {}).get("num_attention_heads")
    _require(heads is None or heads % tp == 0,
             f"{key}.vllm.tensor_parallel_size={tp} must divide the model's num_attention_heads={heads}")
    mem = engine.gpu_memory_utilization
    _require(mem is None or 0 < mem <= 1, f"{key}.vllm.gpu_memory_utilization={mem}: must be in (0, 1] or null")
    length = engine.max_model_len
    _require(length is None or length >= 1, f"{key}.vllm.max_model_len={length}: must be >= 1 or null")
    kv_allowed = CPU_KV_CACHE_DTYPES if on_cpu else GPU_KV_CACHE_DTYPES
    _require(engine.kv_cache_dtype in kv_allowed, f"{key}.vllm.kv_cache_dtype={engine.kv_cache_dtype!r}: "
             f"allowed {'on the CPU build' if on_cpu else 'on GPUs'}: {', '.join(kv_allowed)}")
    _require(engine.cpu_kv_cache_gib >= 1, f"{key}.vllm.cpu_kv_cache_gib={engine.cpu_kv_cache_gib}: must be >= 1")


def check_max_model_len(key: str, length: int | None, positions: int | None, max_new_tokens: int) -> None:
    """``{key}.vllm.max_model_len`` within the model's context (vLLM refuses a longer one when the engine
    starts) and longer than loop.max_new_tokens (room for a prompt); ``positions``: None if unknown."""
    if length is None:
        return
    _require(positions is None or length <= positions, f"{key}.vllm.max_model_len={length}: the model's context "
             f"is {positions} positions; set it <= {positions} or null (the model's own)")
    _require(length > max_new_tokens, f"{key}.vllm.max_model_len={length} leaves no room for a prompt before "
             f"loop.max_new_tokens={max_new_tokens} tokens; set it > {max_new_tokens} or null")


@dataclass(frozen=True)
class VllmEngine:
    """What one vLLM engine is built with: vLLM's dtype and quantisation names, resolved from the
    pool's precision and ``vllm:`` block. None: the platform's default, picked by the sampler on the
    machine it runs on (``DEFAULT_MEMORY_UTILIZATION``; eager on the CPU, CUDA graphs on GPUs)."""

    dtype: str  # bfloat16 | float16 | float32
    quantization: str | None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool | None = None
    cpu_kv_cache_gib: int = 1


def engine_precision(pool, key: str) -> tuple[str, str | None]:
    """(dtype, quantization) a pool's engine runs: ``vllm.dtype``/``vllm.quantization`` where set,
    else what ``precision`` implies."""
    dtype, implied = resolve_precision(pool.precision, f"{key}.precision")
    if pool.vllm.dtype is not None:
        dtype, quantized = resolve_precision(pool.vllm.dtype, f"{key}.vllm.dtype")
        if quantized is not None:  # a dtype cannot carry it: the engine would run unquantised, saying nothing
            raise ConfigError(f"{key}.vllm.dtype={pool.vllm.dtype}: the engine's dtype is one of bfloat16, float16, "
                              f"float32; for {quantized} give {key}.precision={pool.vllm.dtype} or "
                              f"{key}.vllm.quantization={quantized}")
    return dtype, pool.vllm.quantization or implied


def check_pool(name: str, pool, model: Mapping | None = None) -> None:
    """Load-time rules for a ``backend: vllm`` pool: it resolves (``resolve_engine``)."""
    resolve_engine(name, pool, model)


# A torch pool's emulated number formats, which a vllm pool takes from its engine instead: (key, where).
EMULATION_ONLY = (
    ("kv_precision", "vllm pools set the KV cache format with {key}.vllm.kv_cache_dtype"),
    ("fp8_scales", "vllm pools take the scales of the checkpoint or of {key}.vllm.quantization (online fp8: per tensor)"),
    ("linear_inputs", "vllm pools take the GEMM input format from the checkpoint's quantization"),
    ("fp8_attention", "on vllm pools attention follows {key}.vllm.kv_cache_dtype and the attention backend "
                      "(FlashAttention-3 runs fp8 over an fp8 cache)"),
)


def _yaml(value) -> str:
    """A config value as the user writes it: null, true/false, else as is."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def resolve_engine(name: str, pool, model: Mapping | None = None) -> VllmEngine:
    """The engine of a ``backend: vllm`` pool (``rlmix.config.schema.PoolConfig``), or ConfigError
    naming the pool's keys; ``model`` is the model's config.json when known (tensor-parallel head split)."""
    key = f"fleet.pools.{name}"
    on_cpu = pool.accelerator.upper() == "CPU"
    dtype, quantization = engine_precision(pool, key)
    allowed = CPU_QUANTIZATION if on_cpu else GPU_QUANTIZATION
    if quantization not in allowed:
        if on_cpu and pool.vllm.quantization is not None:  # the vllm block asked for it, not precision
            implied = resolve_precision(pool.precision, f"{key}.precision")[1]
            also = "" if implied in CPU_QUANTIZATION else f" and {key}.precision={pool.precision} to bf16/fp32"
            raise ConfigError(f"{key}.vllm.quantization={quantization} needs {quantization} kernels that the CPU "
                              f"build of vLLM lacks; set it to {' or '.join(_yaml(q) for q in CPU_QUANTIZATION)}"
                              f"{also} on accelerator CPU or put this pool on a GPU")
        if on_cpu:
            raise ConfigError(f"{key}.precision={pool.precision} needs {quantization} kernels that the CPU build of "
                              "vLLM lacks; use bf16/fp32 on accelerator CPU or put this pool on a GPU")
        raise ConfigError(f"{key}.vllm.quantization={quantization!r}: allowed: "
                          f"{', '.join(q for q in allowed if q)} or null")
    from rlmix.config.schema import PoolConfig  # its defaults (the schema module imports torch; this one does not)

    defaults = PoolConfig()
    for field, why in EMULATION_ONLY:
        value, default = getattr(pool, field), getattr(defaults, field)
        if value != default:
            raise ConfigError(f"{key}.{field}={_yaml(value)}: {why.format(key=key)}; set {field} to {_yaml(default)}")
    _check_engine(key, pool.vllm, on_cpu, model)
    check_platform(dtype, quantization, on_cpu)
    e = pool.vllm
    return VllmEngine(dtype, quantization, tensor_parallel_size=e.tensor_parallel_size,
                      gpu_memory_utilization=e.gpu_memory_utilization, max_model_len=e.max_model_len,
                      kv_cache_dtype=e.kv_cache_dtype, enforce_eager=e.enforce_eager,
                      cpu_kv_cache_gib=e.cpu_kv_cache_gib)
