"""The quantisation methods a GPU vllm pool may name are ones the pinned vLLM runs without opt-ins."""

from __future__ import annotations

import pytest

from rlmix.samplers.vllm_checks import GPU_QUANTIZATION


def test_gpu_quantization_is_the_installed_vllms_non_deprecated_methods():
    quant = pytest.importorskip("vllm.model_executor.layers.quantization")
    supported = set(quant.QUANTIZATION_METHODS) - set(quant.DEPRECATED_QUANTIZATION_METHODS)
    assert set(GPU_QUANTIZATION) - {None} <= supported


@pytest.mark.parametrize("method", ["fbgemm_fp8", "bitsandbytes", "gguf"])
def test_a_method_the_engine_refuses_is_one_line_at_config_load(method):
    from rlmix.commands.compose import compose_run_config
    from rlmix.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"fleet.pools.h100_fp8.vllm.quantization='{method}': allowed: fp8, ") as err:
        compose_run_config(["fleet=vllm_gpu_mixed", *(f"fleet.pools.{p}.vllm.max_model_len=null"
                                                      for p in ("h100_fp8", "h200_bf16", "a100_fp16")),
                            f"fleet.pools.h100_fp8.vllm.quantization={method}"])
    assert "\n" not in str(err.value)
