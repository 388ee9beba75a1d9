"""Each sampler backend's load-time rules, behind one call: validation runs ``check_pools`` once,
before any process starts. Reads config.json at most; imports neither torch nor vLLM."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlmix.errors import ConfigError
from rlmix.samplers import architectures, vllm_checks


def _check_torch(names: list[str], pools: Mapping, model: Mapping | None, model_path: str | None) -> None:
    """The torch sampler emulates the architectures of ``architectures.ARCHITECTURES`` only, and
    has no vLLM engine to tune."""
    for name in names:
        pool = pools[name]
        if pool.vllm != type(pool.vllm)():
            raise ConfigError(f"fleet.pools.{name}.vllm is set but the pool has backend: torch; "
                              "set backend: vllm or drop the vllm settings")
    if model is not None:
        architectures.describe(model, f"model.path={model_path} (torch pools {', '.join(names)})")


def _check_vllm(names: list[str], pools: Mapping, model: Mapping | None, model_path: str | None) -> None:
    for name in names:
        vllm_checks.check_pool(name, pools[name], model)


CHECKS: dict[str, Callable[[list[str], Mapping, Mapping | None, str | None], None]] = {
    "torch": _check_torch,
    "vllm": _check_vllm,
}


def check_pools(pools: Mapping, model_path: str | None) -> None:
    """Every pool against its backend's rules; ``model_path`` None is the embedded model (a Llama
    every backend serves). ConfigError (one line) naming the key at fault."""
    model = architectures.read_config(model_path) if model_path is not None else None
    by_backend: dict[str, list[str]] = {}
    for name, pool in pools.items():
        by_backend.setdefault(pool.backend.value, []).append(name)
    for backend, names in by_backend.items():
        CHECKS[backend](names, pools, model, model_path)
