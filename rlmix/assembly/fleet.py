"""From the fleet config to sampler instances: one spec per Ray actor, and the run's manifest."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlmix.assembly.plan import PoolPlan, RunPlan
from rlmix.config.schema import PoolConfig, RunConfig, SamplerBackend
from rlmix.correction import Correction
from rlmix.rollout import SamplingParams
from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.vllm_checks import VllmEngine


def pool_gpus(pool: PoolConfig) -> int:
    """GPUs one instance of ``pool`` takes: a vLLM engine's tensor-parallel group; none for emulated pools."""
    on_gpu = pool.backend is SamplerBackend.vllm and pool.accelerator.upper() != "CPU"
    return pool.vllm.tensor_parallel_size if on_gpu else 0


@dataclass(frozen=True)
class SamplerSpec:
    """Everything one sampler actor needs to build its backend."""

    pool: str
    index: int  # instance number inside the pool
    pool_cfg: PoolConfig
    params: SamplingParams
    view: PrecisionView | None = None  # torch backend: its emulated precision view
    engine: VllmEngine | None = None  # vllm backend: its engine's dtype, quantisation and settings
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.pool}/{self.index}"

    @property
    def gpus(self) -> int:
        """GPUs one actor asks Ray for (``pool_gpus``)."""
        return pool_gpus(self.pool_cfg)

    @property
    def resource(self) -> str:
        """The Ray resource that places this actor (Ray's own name for an accelerator type)."""
        return f"accelerator_type:{self.pool_cfg.accelerator.upper()}"


def sampling_params(pool: PoolPlan, cfg: RunConfig, correction: Correction,
                    stop_ids: tuple[int, ...]) -> SamplingParams:
    loop = cfg.loop
    truncates = pool.top_p < 1.0 or pool.top_k > 0
    return SamplingParams(
        temperature=loop.temperature,
        top_p=pool.top_p,
        top_k=pool.top_k,
        max_new_tokens=loop.max_new_tokens,
        num_candidates=correction.head_size,
        support_slots=correction.support_slots if truncates else 0,
        stop_token_ids=stop_ids,
    )


def resolve_fleet(plan: RunPlan, eos_id: int | None, model_dir: str | Path | None = None) -> list[SamplerSpec]:
    """One spec per sampler instance, from the plan's resolved pools.

    Samplers stop where Hugging Face ``generate`` stops: on the tokenizer's ``eos_id`` and the end-of-sequence
    ids of the model directory (``model_dir``, else ``model.path``; ``stop_token_ids``), ConfigError if none.
    """
    from rlmix.models.tokenizer_file import stop_token_ids

    model_dir = model_dir if model_dir is not None else plan.cfg.model.path
    stops = stop_token_ids(model_dir, eos_id) if model_dir is not None else (eos_id,)
    specs = []
    for name, pool in plan.pools.items():
        params = sampling_params(pool, plan.cfg, plan.correction, stops)
        cfg, view = pool.config, pool.view
        tags = view.tags() if view is not None else {"accelerator": cfg.accelerator, "precision": cfg.precision}
        tags = tags | {"backend": cfg.backend.value}
        specs += [SamplerSpec(name, i, cfg, params, view=view, engine=pool.engine, tags=tags) for i in range(cfg.count)]
    return specs


def build_sampler(spec: SamplerSpec, model_dir: str | Path, seed: int):
    """The backend object behind one sampler actor (heavy imports happen here, inside the actor)."""
    if spec.pool_cfg.backend is SamplerBackend.torch:
        from rlmix.samplers.torch_sampler import TorchSampler

        return TorchSampler(model_dir, spec.view, pool=spec.pool, seed=seed)
    from rlmix.samplers.vllm_sampler import VllmSampler

    return VllmSampler(model_dir, pool=spec.pool, engine=spec.engine, seed=seed)


def view_sampler(model_dir: str | Path, view: PrecisionView, pool: str, seed: int, pad_id: int | None = None):
    """A torch sampler computing with ``view`` outside any pool (probes, evaluation's reference)."""
    from rlmix.samplers.torch_sampler import TorchSampler

    return TorchSampler(model_dir, view, pool=pool, seed=seed, pad_id=pad_id)


def fleet_manifest(specs: list[SamplerSpec]) -> dict[str, dict]:
    """Per pool: instance count, accelerator, precision, kernel, backend, sampling settings."""
    out: dict[str, dict] = {}
    for spec in specs:
        entry = out.setdefault(
            spec.pool,
            dict(spec.tags, count=0, top_p=spec.params.top_p, top_k=spec.params.top_k,
                 label=spec.view.label if spec.view else f"{spec.pool_cfg.backend.value}:{spec.pool}"),
        )
        entry["count"] += 1
    return out
