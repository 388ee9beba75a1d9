"""Each sampler backend's load-time platform rules, registered with config validation.

Importing this module installs them (``rlmix.config.load.register_pool_check``); every entry
point does so before it validates a config. The rules stay beside the backends they describe.
"""

from __future__ import annotations

from rlmix.config.load import register_pool_check
from rlmix.config.schema import PoolConfig, SamplerBackend
from rlmix.errors import ConfigError
from rlmix.samplers.accelerators import PrecisionView, resolve_view


def pool_view(name: str, pool: PoolConfig) -> PrecisionView | None:
    """The torch backend's precision view for a pool; ConfigError names the pool's keys."""
    if pool.backend is not SamplerBackend.torch:
        return None
    try:
        return resolve_view(pool.accelerator, pool.precision, pool.kv_precision, pool.allow_emulation)
    except ConfigError as err:
        raise ConfigError(f"fleet.pools.{name}: {err}") from None


def check_torch_pool(name: str, pool: PoolConfig) -> None:
    pool_view(name, pool)  # an unknown accelerator or an unsupported precision


def check_vllm_pool(name: str, pool: PoolConfig) -> None:
    from rlmix.samplers.vllm_sampler import check_pool  # light: vllm itself is imported lazily there

    check_pool(name, pool)


register_pool_check(SamplerBackend.torch, check_torch_pool)
register_pool_check(SamplerBackend.vllm, check_vllm_pool)
