"""Each sampler backend's load-time rules: a pool resolved by the backend that will serve it.

``POOL_CHECKS[backend](name, pool, model)`` returns the pool's resolution — a torch pool's
precision view, a vLLM pool's engine — or raises a ``ConfigError`` naming the pool's keys;
``rlmix.assembly.plan.plan_run`` calls it for every pool. The rules stay beside the backends they
describe and read the model's config.json at most: no torch model or vLLM engine is built, so a
config the backend cannot serve fails before Ray starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlmix.config.schema import PoolConfig, SamplerBackend, VllmEngineConfig
from rlmix.errors import ConfigError
from rlmix.samplers import architectures, model_config, vllm_checks
from rlmix.samplers.accelerators import PrecisionView, resolve_view
from rlmix.samplers.vllm_checks import VllmEngine


def pool_view(name: str, pool: PoolConfig) -> PrecisionView | None:
    """The torch backend's precision view for a pool; ConfigError names the pool's keys."""
    if pool.backend is not SamplerBackend.torch:
        return None
    try:
        return resolve_view(pool.accelerator, pool.precision, pool.kv_precision, pool.allow_emulation,
                            fp8_scales=pool.fp8_scales, linear_inputs=pool.linear_inputs,
                            fp8_attention=pool.fp8_attention)
    except ConfigError as err:
        raise ConfigError(f"fleet.pools.{name}: {err}") from None


def pool_engine(name: str, pool: PoolConfig, model: Mapping | None = None) -> VllmEngine | None:
    """The vllm backend's engine for a pool (``vllm_checks.resolve_engine``); ConfigError names the pool's keys."""
    if pool.backend is not SamplerBackend.vllm:
        return None
    return vllm_checks.resolve_engine(name, pool, model)


# (pool name, pool config, the model's config.json fields or None for the embedded model)
#   -> (torch precision view or None, vLLM engine or None)
PoolCheck = Callable[[str, PoolConfig, Mapping | None], tuple[PrecisionView | None, VllmEngine | None]]


def check_torch_pool(name: str, pool: PoolConfig, model: Mapping | None) -> tuple[PrecisionView, None]:
    """An accelerator and precision the catalog knows, an architecture the torch sampler emulates
    (``architectures.ARCHITECTURES``), and no vLLM engine settings (they would do nothing here)."""
    view = pool_view(name, pool)
    if pool.vllm != VllmEngineConfig():
        raise ConfigError(f"fleet.pools.{name}.vllm is set but the pool has backend: torch; "
                          "set backend: vllm or drop the vllm settings")
    if model is not None:  # completed as the sampler will read it, so both apply the same defaults
        where = f"model.path (pool {name}, backend torch)"
        architectures.describe(model_config.complete(model, where), where)
    return view, None


def check_vllm_pool(name: str, pool: PoolConfig, model: Mapping | None) -> tuple[None, VllmEngine]:
    return None, pool_engine(name, pool, model)


POOL_CHECKS: dict[SamplerBackend, PoolCheck] = {
    SamplerBackend.torch: check_torch_pool,
    SamplerBackend.vllm: check_vllm_pool,
}
