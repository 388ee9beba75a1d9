"""The vLLM sampler backend: one real vLLM engine (CUDA build on GPUs, CPU build on CPUs).

Log-prob semantics (docs/math.md §3.2, §4; derivation in rlmix/samplers/vllm_records.py):
the engine samples at vLLM temperature 1.0 from logits the model itself scales by ``1/T``, with
``logprobs_mode="raw_logprobs"``, so vLLM's returned log-probs are the full-vocabulary log-probs
at ``T``; the kept set of top-p/top-k is derived from them and the sampled token's log-prob is
renormalised over it.

Weight updates go through vLLM's own in-place reload (``Worker.reload_weights``, which also
re-runs the CPU GEMM weight packing), followed by a prefix-cache reset so no KV block computed
with older weights is reused. The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the published tensors reach the worker by reference and
one sampler actor holds exactly one engine.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from rlmix.errors import ConfigError
from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, Rollouts, SamplingParams
from rlmix.samplers.vllm_checks import DEFAULT_MEMORY_UTILIZATION, VllmEngine, check_platform
from rlmix.samplers.vllm_records import FlatPositions, flat_positions, kept_set, pad_slots, support_record

log = logging.getLogger(__name__)

def _set_logits_scale(worker, scale: float) -> float:
    """Runs inside the vLLM worker: make the model's logits come out as z / T."""
    processor = getattr(worker.model_runner.get_model(), "logits_processor", None)
    if processor is None:
        raise ConfigError("this model's vLLM implementation has no logits_processor; the vllm backend needs one")
    if not hasattr(worker, "_rlmix_base_scale"):
        worker._rlmix_base_scale = processor.scale  # e.g. a config logit_scale; compose with it
    processor.scale = worker._rlmix_base_scale * scale
    return processor.scale


def _reload(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the vLLM worker: vLLM's in-place weight reload from HF-named tensors."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)


def _eager_count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (x >= values).sum(-1)


def _skip_rank_compile() -> None:
    """On the CPU, count log-prob ranks eagerly instead of through vLLM's ``torch.compile``d helper.

    ``batched_count_greater_than`` is compiled by inductor on its first call and again when shapes
    change: 10–15 s each on a 2-core machine, longer than a smoke run. It is compiled only to avoid
    a copy of the (batch, vocab) tensor on GPUs; the eager form computes the same ranks.
    """
    import vllm.v1.sample.sampler as vllm_sampler_module

    vllm_sampler_module.batched_count_greater_than = _eager_count_greater_than


class VllmSampler:
    """Implements ``rlmix.samplers.base.Sampler`` with one vLLM engine.

    ``engine`` is the pool's resolved engine (``vllm_checks.resolve_engine``: vLLM's dtype and
    quantisation names, the engine settings). What only the machine it runs on can answer is decided
    here: whether this platform has the kernels (``check_platform``), and the settings left at None
    (memory: ``vllm_checks.DEFAULT_MEMORY_UTILIZATION``; eager on the CPU, CUDA graphs on GPUs).
    """

    def __init__(self, model_dir: str | Path, pool: str, engine: VllmEngine, seed: int = 0,
                 max_logprobs: int = 128, pad_id: int | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise ConfigError(f"model dir {model_dir} has no config.json; point model.path at a Hugging Face model directory")
        # Read by vLLM when the engine is built, so they must be set before it.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.cpu_kv_cache_gib))
        from vllm import LLM
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        dtype, quantization = engine.dtype, engine.quantization
        check_platform(dtype, quantization, on_cpu)
        if on_cpu:
            _skip_rank_compile()
        self.pool = pool
        self.dtype, self.quantization = dtype, quantization
        self.max_logprobs = max_logprobs
        self._version = 0
        self._scale: float | None = None
        memory = engine.gpu_memory_utilization
        settings = dict(
            tensor_parallel_size=engine.tensor_parallel_size, max_model_len=engine.max_model_len,
            kv_cache_dtype=engine.kv_cache_dtype,
            gpu_memory_utilization=DEFAULT_MEMORY_UTILIZATION[on_cpu] if memory is None else memory,
            enforce_eager=on_cpu if engine.enforce_eager is None else engine.enforce_eager,  # CUDA graphs on GPUs
            # A multi-turn episode resends its context every turn: KV blocks of a prompt's cached prefix are
            # reused instead of prefilled again (vLLM's default for decoder models on both builds; stated so a
            # changed default cannot turn it off). load_weights resets it.
            enable_prefix_caching=True,
        )
        if engine.tensor_parallel_size > 1:
            # Worker processes on the GPUs Ray gave this actor; vLLM's Ray executor would ask Ray
            # for a second set of GPUs from inside an actor that already holds them.
            settings["distributed_executor_backend"] = "mp"
        set_num_threads = torch.set_num_threads  # the CPU worker replaces it process-wide
        try:
            # vLLM takes a 32-bit engine seed; run seeds are derived 63-bit hashes.
            self.llm = LLM(model=str(model_dir), dtype=dtype, quantization=quantization, seed=seed % 2**32,
                           logprobs_mode="raw_logprobs", max_logprobs=max_logprobs, **settings)
        except (ValueError, NotImplementedError) as err:
            raise ConfigError(f"vllm pool {pool} (dtype={dtype}, quantization={quantization}): the engine did not "
                              f"start: {str(err).splitlines()[0]}") from None
        finally:
            torch.set_num_threads = set_num_threads
        hf = self.llm.llm_engine.model_config.hf_config
        self.vocab_size = int(hf.vocab_size)
        eos = hf.eos_token_id if isinstance(hf.eos_token_id, int) else 0
        self.pad_id = pad_id if pad_id is not None else (hf.pad_token_id if hf.pad_token_id is not None else eos)
        self.tags = {"backend": "vllm", "precision": quantization or dtype,
                     "accelerator": "CPU" if on_cpu else current_platform.get_device_name(),
                     "kernel": "vllm_cpu_attn" if on_cpu else "vllm_gpu_attn", **(tags or {})}
        log.info("pool %s: vLLM engine, %s on %s", pool, self.tags["precision"], self.tags["accelerator"])

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load HF-named ``weights`` in place (the engine casts to its dtype) and serve them as ``version``."""
        self.llm.collective_rpc(_reload, args=(list(weights.items()),))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self._version = version

    def close(self) -> None:
        del self.llm

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        """One completion per prompt; record semantics in rlmix/rollout.py and vllm_records.py."""
        if params.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {params.temperature})")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        start = time.perf_counter()
        self._use_temperature(params.temperature)
        slots = self._slots(params)
        requests = [self._request(i, params, slots) for i in range(len(prompts))]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], requests, use_tqdm=False)
        record = self._record([o.outputs[0] for o in outs], params, slots)
        return Rollouts(
            prompt_ids=_right_pad([list(p) for p in prompts], self.pad_id),
            prompt_lens=torch.tensor([len(p) for p in prompts], dtype=torch.long),
            policy_version=torch.full((len(prompts),), self._version, dtype=torch.long),
            pool=(self.pool,) * len(prompts),
            temperature=params.temperature,
            gen_time_s=time.perf_counter() - start,
            tags=dict(self.tags),
            **record,
        )

    def _use_temperature(self, temperature: float) -> None:
        if self._scale != 1.0 / temperature:
            self.llm.collective_rpc(_set_logits_scale, args=(1.0 / temperature,))
            self._scale = 1.0 / temperature

    def _slots(self, params: SamplingParams) -> int:
        """R: how many top log-probs to ask vLLM for (enough for the head and the support)."""
        wanted = max(params.num_candidates, params.support_slots if params.truncates else 0, 1)
        if wanted > self.max_logprobs:
            raise ConfigError(f"num_candidates/support_slots={wanted} exceed the vllm engine's max_logprobs="
                              f"{self.max_logprobs}; lower them or raise max_logprobs")
        return min(wanted, self.vocab_size)

    def _request(self, index: int, params: SamplingParams, slots: int):
        from vllm import SamplingParams as VllmParams

        return VllmParams(
            temperature=1.0,  # T is applied by the logits scale (module docstring)
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,  # stop only where the pool's params say, as every backend does
            seed=_row_seed(params, index),
            logprobs=slots,
            flat_logprobs=True,
            detokenize=False,
        )

    def _record(self, outputs: list, params: SamplingParams, slots: int) -> dict:
        """Per-token tensors (B, T[, K|S]) from vLLM's completion outputs."""
        lens = [len(o.token_ids) for o in outputs]
        b, width = len(outputs), max(lens)
        flat = [flat_positions(o.logprobs.token_ids, o.logprobs.logprobs, o.logprobs.start_indices, slots)
                for o in outputs]
        top = FlatPositions(*(torch.cat([getattr(f, name) for f in flat]) for name in FlatPositions.__dataclass_fields__))
        mask = torch.arange(width)[None] < torch.tensor(lens)[:, None]  # (B, T)
        logprobs = top.sampled_logprobs
        fields: dict = {}
        if params.truncates:
            kept = kept_set(top.top_logprobs, params.top_k, params.top_p, self.vocab_size)
            if not bool(kept.covered.all()):
                raise ValueError(f"the kept set of top_k={params.top_k} top_p={params.top_p} extends past the "
                                 f"{slots} recorded slots; raise support_slots or lower top_k")
            logprobs = logprobs - kept.log_mass
            if params.support_slots > 0:
                fields["support_ids"], fields["support_probs"] = support_record(top, kept, params.support_slots)
        if params.num_candidates > 0:
            fields["head_ids"], fields["head_logprobs"] = pad_slots(
                top.top_ids, top.top_logprobs, params.num_candidates, float("-inf"))
        out = {name: _scatter(mask, value, -1 if name.endswith("ids") else (0.0 if "support" in name else float("-inf")))
               for name, value in fields.items()}
        out["completion_ids"] = _scatter(mask, top.sampled_ids, self.pad_id)
        out["sampler_logprobs"] = _scatter(mask, logprobs, 0.0)
        out["mask"] = mask
        out["finish_reason"] = tuple(FINISH_STOP if o.finish_reason == "stop" else FINISH_LENGTH for o in outputs)
        return out


def _scatter(mask: torch.Tensor, values: torch.Tensor, fill: float | int) -> torch.Tensor:
    """Place per-position ``values`` (N, ...) into a (B, T, ...) tensor at ``mask``'s True cells."""
    out = values.new_full((*mask.shape, *values.shape[1:]), fill)
    out[mask] = values
    return out


def _right_pad(rows: list[list[int]], pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def _row_seed(params: SamplingParams, index: int) -> int | None:
    """Request ``index``'s seed: its own from ``params.row_seeds``, else one stream per row after
    ``params.seed`` (None: the engine's)."""
    if params.row_seeds is not None:
        return params.row_seeds[index] % 2**63
    return None if params.seed is None else (params.seed + index) % 2**63
