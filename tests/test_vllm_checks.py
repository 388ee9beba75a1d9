"""Load-time rules of ``backend: vllm`` pools and how a pool's engine settings reach ``VllmSampler``
(no engine is started here: these run before Ray, and so do their tests)."""

from __future__ import annotations

import dataclasses

import pytest

from rlmix.commands.compose import compose_run_config
from rlmix.config.schema import PoolConfig, SamplerBackend, VllmEngineConfig
from rlmix.errors import ConfigError
from rlmix.samplers.vllm_checks import VllmEngine, check_pool, engine_precision, resolve_engine, resolve_precision


def vllm_pool(accelerator: str = "H100", precision: str = "bf16", kv: str | None = None, **engine) -> PoolConfig:
    return PoolConfig(accelerator=accelerator, precision=precision, kv_precision=kv, backend=SamplerBackend.vllm,
                      vllm=VllmEngineConfig(**engine))


def test_every_engine_setting_reaches_the_resolved_engine():
    """Each ``vllm:`` field is a field of the ``VllmEngine`` the sampler is built from, and a set value arrives."""
    assert {f.name for f in dataclasses.fields(VllmEngineConfig)} == {f.name for f in dataclasses.fields(VllmEngine)}
    settings = dict(tensor_parallel_size=2, gpu_memory_utilization=0.5, max_model_len=384, kv_cache_dtype="fp8",
                    enforce_eager=True, cpu_kv_cache_gib=3)
    engine = resolve_engine("p", vllm_pool("H100", "fp8_e4m3", **settings))
    assert engine == VllmEngine("bfloat16", "fp8", **settings)


def test_pool_rules_follow_the_pool_accelerator():
    assert resolve_precision("fp8_e4m3") == ("bfloat16", "fp8") and resolve_precision("bf16") == ("bfloat16", None)
    check_pool("cpu_bf16", vllm_pool("CPU"))
    check_pool("h100_fp8", vllm_pool("H100", "fp8_e4m3"))  # a GPU pool is judged by its accelerator
    with pytest.raises(ConfigError, match=r"fleet.pools.cpu_fp8.precision=fp8_e4m3 needs fp8 kernels"):
        check_pool("cpu_fp8", vllm_pool("CPU", "fp8_e4m3"))
    # vllm.quantization, not precision, asked for fp8: the line names it and what the CPU build takes there.
    with pytest.raises(ConfigError, match=r"^fleet.pools.cpu_vllm_bf16.vllm.quantization=fp8 needs fp8 kernels that "
                                          r"the CPU build of vLLM lacks; set it to null on accelerator CPU") as err:
        check_pool("cpu_vllm_bf16", vllm_pool("CPU", "bf16", quantization="fp8"))
    assert "precision=bf16" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^fleet.pools.c.vllm.quantization=fp8 .*; set it to null and "
                                          r"fleet.pools.c.precision=fp8_e4m3 to bf16/fp32 on accelerator CPU"):
        check_pool("c", vllm_pool("CPU", "fp8_e4m3", quantization="fp8"))
    with pytest.raises(ConfigError, match=r"fleet.pools.b200.precision='nvfp4' has no vLLM equivalent"):
        check_pool("b200", vllm_pool("B200", "nvfp4"))
    with pytest.raises(ConfigError, match=r"fleet.pools.x.kv_precision=fp8_e4m3.*fleet.pools.x.vllm.kv_cache_dtype"):
        check_pool("x", vllm_pool("H100", kv="fp8_e4m3"))
    scaled = vllm_pool("H100", "fp8_e4m3")
    scaled.fp8_scales = "tensor"
    with pytest.raises(ConfigError, match=r"fleet.pools.x.fp8_scales=tensor: vllm pools take the scales"):
        check_pool("x", scaled)
    w4a4 = vllm_pool("H100", "fp8_e4m3")
    w4a4.linear_inputs = "bf16"
    with pytest.raises(ConfigError, match=r"fleet.pools.x.linear_inputs=bf16: vllm pools take the GEMM input format"):
        check_pool("x", w4a4)
    attention = vllm_pool("H100", "fp8_e4m3")
    attention.fp8_attention = True
    with pytest.raises(ConfigError, match=r"fleet.pools.x.fp8_attention=true: on vllm pools attention follows"):
        check_pool("x", attention)


@pytest.mark.parametrize("accelerator, engine, match", [
    ("H100", {"tensor_parallel_size": 16}, r"fleet.pools.p.vllm.tensor_parallel_size=16: must be in \[1, 8\]"),
    ("H100", {"tensor_parallel_size": 0}, r"tensor_parallel_size=0: must be in \[1, 8\]"),
    ("CPU", {"tensor_parallel_size": 2}, r"tensor_parallel_size=2: must be in \[1, 1\].*CPU build"),
    ("H100", {"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization=0.0: must be in \(0, 1\]"),
    ("H100", {"gpu_memory_utilization": 1.2}, r"gpu_memory_utilization=1.2: must be in \(0, 1\]"),
    ("H100", {"max_model_len": 0}, r"max_model_len=0: must be >= 1"),
    ("CPU", {"kv_cache_dtype": "fp8"}, r"kv_cache_dtype='fp8': allowed on the CPU build: auto"),
    ("H100", {"kv_cache_dtype": "int8"}, r"kv_cache_dtype='int8': allowed on GPUs: auto, bfloat16, fp8"),
    ("H100", {"quantization": "fp9"}, r"fleet.pools.p.vllm.quantization='fp9': allowed: fp8, "),
    ("CPU", {"quantization": "awq"}, r"fleet.pools.p.vllm.quantization=awq needs awq kernels that the CPU build of "
                                     r"vLLM lacks; set it to null on accelerator CPU"),
    ("H100", {"dtype": "int3"}, r"fleet.pools.p.vllm.dtype='int3' has no vLLM equivalent"),
])
def test_out_of_range_engine_settings_are_one_line(accelerator, engine, match):
    with pytest.raises(ConfigError, match=match) as err:
        check_pool("p", vllm_pool(accelerator, **engine))
    assert "\n" not in str(err.value)


def test_tensor_parallel_size_must_split_the_heads():
    check_pool("p", vllm_pool(tensor_parallel_size=4), {"num_attention_heads": 8})
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=4 must divide the model's num_attention_heads=6"):
        check_pool("p", vllm_pool(tensor_parallel_size=4), {"num_attention_heads": 6})


def test_engine_dtype_and_quantization_override_the_precision():
    assert engine_precision(vllm_pool(precision="bf16"), "k") == ("bfloat16", None)
    assert engine_precision(vllm_pool(precision="fp8_e4m3", dtype="float16"), "k") == ("float16", "fp8")
    assert engine_precision(vllm_pool(precision="bf16", quantization="awq"), "k") == ("bfloat16", "awq")
    assert engine_precision(vllm_pool(precision="bf16", dtype="fp16"), "k") == ("float16", None)  # rlmix's name


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8"])
def test_an_fp8_engine_dtype_is_refused_not_run_unquantised(dtype):
    with pytest.raises(ConfigError) as err:  # it ran bfloat16 with no quantization, the pool's label unchanged
        engine_precision(vllm_pool(precision="fp16", dtype=dtype), "fleet.pools.p")
    assert str(err.value) == (f"fleet.pools.p.vllm.dtype={dtype}: the engine's dtype is one of bfloat16, float16, "
                              f"float32; for fp8 give fleet.pools.p.precision={dtype} or "
                              "fleet.pools.p.vllm.quantization=fp8")


# vllm_gpu_mixed on the embedded model: each engine at the model's own length.
MODEL_OWN_LENGTH = [f"fleet.pools.{p}.vllm.max_model_len=null" for p in ("h100_fp8", "h200_bf16", "a100_fp16")]


def test_presets_keep_cpu_defaults_and_gpu_preset_sets_engines():
    cpu = compose_run_config(["fleet=vllm_cpu_smoke"]).fleet.pools["cpu_vllm_bf16"]
    assert cpu.vllm == VllmEngineConfig()  # CPU build: every setting at the platform default
    gpu = compose_run_config(["fleet=vllm_gpu_mixed", *MODEL_OWN_LENGTH]).fleet.pools
    assert gpu["h200_bf16"].vllm.tensor_parallel_size == 2 and gpu["h100_fp8"].vllm.kv_cache_dtype == "fp8_e4m3"
    assert all(p.vllm.gpu_memory_utilization for p in gpu.values())
    # Its lengths are sized for the real models it serves: the embedded model's 256 positions are refused
    # at planning time (the engine would refuse them at start, in its actor).
    with pytest.raises(ConfigError, match=r"fleet.pools.h100_fp8.vllm.max_model_len=8192: the model's context is 256"):
        compose_run_config(["fleet=vllm_gpu_mixed"])


def test_the_actor_asks_ray_for_its_tensor_parallel_gpus():
    from rlmix.assembly.fleet import SamplerSpec
    from rlmix.rollout import SamplingParams

    def gpus(pool: PoolConfig) -> int:
        return SamplerSpec("p", 0, pool, SamplingParams()).gpus

    assert gpus(vllm_pool("H200", tensor_parallel_size=4)) == 4
    assert gpus(vllm_pool("CPU")) == 0 and gpus(PoolConfig(accelerator="H100")) == 0


def test_bad_engine_setting_through_validation_names_the_key():
    with pytest.raises(ConfigError, match=r"fleet.pools.h200_bf16.vllm.tensor_parallel_size=9"):
        compose_run_config(["fleet=vllm_gpu_mixed", *MODEL_OWN_LENGTH,
                            "fleet.pools.h200_bf16.vllm.tensor_parallel_size=9"])
