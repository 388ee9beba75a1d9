"""The torch sampler backend: batched KV-cache generation under an emulated precision view.

Prompts are left-padded so every row generates at the same cache column; each row's RoPE
positions count its own tokens only and padding columns are masked, so under the exact view a
prompt's result does not depend on what else is in the batch. One uniform per (row, step) is
drawn up front from a ``torch.Generator`` as a (B, max_new_tokens) tensor, so a row's draws do
not depend on the batch size either.

Seeding: with ``params.seed`` set, ``generate`` is a pure function of (weights, prompts, params)
— callers that want fresh samples per request vary the seed. With ``params.seed=None`` the
sampler's own generator (seeded by the constructor's ``seed``) advances across calls. With
``params.row_seeds`` each row's uniforms come from a generator of its own, so a row draws what it
would draw alone (the first n uniforms of a generator do not depend on how many follow).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rlmix.errors import ConfigError
from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, Rollouts, SamplingParams, concat_rollouts
from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.continuous import DecodeBatch
from rlmix.samplers.emulated_decoder import DecoderShape, EmulatedDecoder, KVCache
from rlmix.samplers.model_config import read_config
from rlmix.samplers.prefix_cache import CachedPrefix, PrefixCache
from rlmix.samplers.sampling import check_support, draw

log = logging.getLogger(__name__)

# Each sampler process holds its own prefix cache, and single-turn requests fill it with sequences no
# later prompt extends, so the default is modest: 64k tokens of the embedded agent model (2 KiB each),
# about 130 of its longest episodes.
PREFIX_CACHE_BYTES = 128 << 20


def read_model_dir(model_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The completed config fields (``model_config``) and the safetensors state dict of
    ``model_dir``; ConfigError when unreadable."""
    from safetensors.torch import load_file

    if not model_dir.is_dir():
        raise ConfigError(f"model dir {model_dir} does not exist; point model.path at a Hugging Face model directory")
    fields = read_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model dir {model_dir} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    return fields, weights


class TorchSampler:
    """Implements ``rlmix.samplers.base.Sampler`` on the CPU with precision emulation."""

    def __init__(self, model_dir: str | Path, view: PrecisionView, pool: str, seed: int = 0,
                 max_batch: int = 256, pad_id: int | None = None, prefix_cache_bytes: int = PREFIX_CACHE_BYTES) -> None:
        fields, weights = read_model_dir(Path(model_dir))
        self.pool = pool
        self.view = view
        self.max_batch = max_batch
        self.model = EmulatedDecoder(DecoderShape.from_fields(fields), view)
        eos, pad = fields.get("eos_token_id"), fields.get("pad_token_id")
        fallback = eos if isinstance(eos, int) else 0
        self.pad_id = pad_id if pad_id is not None else (pad if pad is not None else fallback)
        self._generator = torch.Generator().manual_seed(seed)
        self._version = 0
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        try:
            self.load_weights(weights, 0)
        except ValueError as err:  # a format's block/group size that does not divide the model's dims
            raise ConfigError(f"pool {pool}: cannot serve {model_dir} as {view.label}: {err}") from None
        log.info("pool %s: torch sampler, %s (CPU emulation)", pool, view.label)
        if view.emulated_beyond_hardware:
            log.warning("pool %s: %s emulates formats %s has no native support for", pool, view.label, view.accelerator)

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Quantise ``weights`` (HF names) by this view once and serve them as ``version``."""
        with torch.no_grad():
            self.model.load(weights)
        self.prefix_cache.clear()  # KV computed with the old weights is never reused
        self._version = version

    def close(self) -> None:
        self.model.layers = []

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, L, V) fp32 under this view; any padding side (positions
        count real tokens only). Rows at padding positions are meaningless."""
        attention_mask = attention_mask.bool()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = self.model.new_cache(*input_ids.shape)
        return self.model.forward(input_ids, positions, attention_mask, cache, 0)

    def decode_batch(self, params: SamplingParams) -> DecodeBatch:
        """A running batch that turns join and leave one by one (continuous batching; continuous.py)."""
        return DecodeBatch(self, params)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        """Sample one completion per prompt (record semantics: rlmix/rollout.py, sampling.py)."""
        if params.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {params.temperature})")
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        start = time.perf_counter()
        uniforms = self.uniforms(len(prompts), params)
        parts = [
            self._generate_batch(prompts[i : i + self.max_batch], params, uniforms[i : i + self.max_batch])
            for i in range(0, len(prompts), self.max_batch)
        ]
        out = parts[0] if len(parts) == 1 else concat_rollouts(parts, self.pad_id)
        return out.replace(gen_time_s=time.perf_counter() - start, tags={**self.view.tags(), "backend": "torch"})

    def uniforms(self, rows: int, params: SamplingParams) -> torch.Tensor:
        """(rows, max_new_tokens): from ``params.row_seeds``, one generator per row; else from
        ``params.seed`` (or the sampler's own generator), row after row."""
        steps = params.max_new_tokens
        if params.row_seeds is not None:
            if len(params.row_seeds) != rows:
                raise ValueError(f"{len(params.row_seeds)} row seeds for {rows} prompts")
            return torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(s)) for s in params.row_seeds])
        generator = self._generator if params.seed is None else torch.Generator().manual_seed(params.seed)
        return torch.rand((rows, steps), generator=generator)

    def _generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                        uniforms: torch.Tensor) -> Rollouts:
        """Left-padded prefill (``prefill``), then one decode step per token for the whole batch."""
        steps = params.max_new_tokens
        pre = self.prefill(prompts, steps)
        lens, width, cache, key_valid, routes = pre.lens, pre.width, pre.cache, pre.key_valid, pre.routes
        logits = pre.logits
        rec = _Recorder(len(prompts), steps, params, self.pad_id)
        for t in range(steps):
            step = draw(logits, uniforms[:, t], params.temperature, params.top_k, params.top_p,
                        params.num_candidates, params.support_slots)
            rec.record(t, step)
            if t == steps - 1 or bool(rec.done.all()):
                break
            logits = self.model.forward(step.tokens[:, None], (lens + t)[:, None], key_valid[:, : width + t + 1],
                                        cache, width + t, last_only=True,
                                        routes=routes.step(t, ~rec.done) if routes else None)[:, 0]
        self._keep_prefixes(prompts, rec, cache, pre.pad, width, routes)
        out = rec.rollouts(pre.right_padded(prompts, self.pad_id), lens, self._version, self.pool, params)
        return out if routes is None else out.replace(routed_experts=routes.record(lens, rec.steps))

    def prefill(self, prompts: Sequence[Sequence[int]], steps: int) -> Prefill:
        """Run ``prompts`` left-padded to one width, ending at the same cache column, with room for
        ``steps`` more columns. Cache columns [0, start) of each row come from the prefix cache where
        an earlier call ran the same tokens; the forward feeds the columns from ``start`` on, so the
        column layout (and each row's padding) is the one a prefill of the whole prompts has."""
        b = len(prompts)
        lens = torch.tensor([len(p) for p in prompts])
        width = int(lens.max())
        pad = width - lens
        left = torch.full((b, width), self.pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            left[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        key_valid = torch.ones((b, width + steps), dtype=torch.bool)
        key_valid[:, :width] = torch.arange(width)[None] >= pad[:, None]
        positions = (torch.arange(width)[None] - pad[:, None]).clamp(min=0)
        cache = self.model.new_cache(b, width + steps)
        moe = self.model.shape.spec.moe
        routes = _Routes(pad, width, steps, moe) if moe is not None else None
        start = self._reuse_prefixes(prompts, cache, pad, width, routes)
        logits = self.model.forward(left[:, start:], positions[:, start:], key_valid[:, :width], cache, start,
                                    last_only=True, routes=routes.prefill(start) if routes else None)[:, 0]
        return Prefill(logits, cache, key_valid, lens, pad, width, routes)

    def _reuse_prefixes(self, prompts: Sequence[Sequence[int]], cache, pad: torch.Tensor, width: int,
                        routes: _Routes | None) -> int:
        """Copy each row's longest cached prefix into ``cache`` (and its experts into ``routes``) and
        return the first column to feed: every row has its tokens before that column cached (a row
        with fewer new tokens than the batch's most recomputes some of its cached ones, and
        overwrites them with values equal to fp32 rounding)."""
        if self.prefix_cache.max_bytes <= 0:
            return 0
        matches = [self.prefix_cache.match(tuple(p), self._version) for p in prompts]
        start = width - max(len(p) - n for p, (_, n) in zip(prompts, matches))
        for i, (entry, _) in enumerate(matches):
            keep = start - int(pad[i])  # row i's tokens left of ``start``; at most its cached length
            if keep > 0:
                cache.k[:, i, :, int(pad[i]) : start] = entry.k[:, :, :keep]
                cache.v[:, i, :, int(pad[i]) : start] = entry.v[:, :, :keep]
                if routes is not None:
                    routes.columns[i, int(pad[i]) : start] = entry.routes[:keep]
        for entry, n in matches:  # extended in full: this call's own entry replaces it
            if entry is not None and n == len(entry.tokens):
                self.prefix_cache.discard(entry.tokens)
        return start

    def _keep_prefixes(self, prompts: Sequence[Sequence[int]], rec: _Recorder, cache, pad: torch.Tensor,
                       width: int, routes: _Routes | None) -> None:
        """Cache each row's prompt and the completion tokens that were fed back: every drawn token but
        the batch's last (a finished row's stop token was fed while the others went on), with the
        experts those positions were routed to. A mixture of experts records no experts for a finished
        row's stop token, so there the cache ends before it (a later call recomputes it)."""
        if self.prefix_cache.max_bytes <= 0:
            return
        columns = routes.by_column() if routes is not None else None
        fed = rec.steps - 1
        counts = rec.mask.sum(dim=1).clamp(max=fed)
        if columns is not None:  # a stop token fed after its row finished was routed for no one: not kept
            counts = torch.minimum(counts, rec.mask.sum(dim=1) - rec.stopped.long())
        counts = counts.tolist()
        for i, p in enumerate(prompts):
            n = int(counts[i])
            cols = slice(int(pad[i]), width + n)
            tokens = tuple(p) + tuple(rec.tokens[i, :n].tolist())
            self.prefix_cache.store(CachedPrefix(tokens, cache.k[:, i, :, cols].clone(),
                                                 cache.v[:, i, :, cols].clone(), self._version,
                                                 columns[i, cols].clone() if columns is not None else None))


@dataclass
class Prefill:
    """Prompts run through the decoder, left-padded to ``width`` cache columns (``TorchSampler.prefill``)."""

    logits: torch.Tensor  # (B, V): each row's next-token logits
    cache: KVCache  # (.., B, .., width + steps, ..): columns [0, width) written
    key_valid: torch.Tensor  # (B, width + steps) bool: False on each row's left padding
    lens: torch.Tensor  # (B,) prompt lengths
    pad: torch.Tensor  # (B,) left padding: width - lens
    width: int
    routes: _Routes | None  # mixture-of-experts models: the experts chosen so far, by cache column

    def right_padded(self, prompts: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
        """(B, width) the prompts from column 0, as ``Rollouts.prompt_ids`` holds them."""
        out = torch.full((len(prompts), self.width), pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            out[i, : len(p)] = torch.as_tensor(p, dtype=torch.long)
        return out


class _Routes:
    """The experts each sparse layer chose, per row and sequence position (``Rollouts.routed_experts``).

    The forward appends one (B, L, k) tensor per sparse layer to the list it is given; ``record``
    moves them from cache columns (left-padded prompts) to sequence positions (prompt from 0).
    """

    def __init__(self, pad: torch.Tensor, width: int, steps: int, moe) -> None:
        if moe.experts > torch.iinfo(torch.int16).max:
            raise ValueError(f"{moe.experts} experts do not fit the int16 record")
        self.pad, self.width = pad, width
        b, m = len(pad), len(moe.layers)
        self.columns = torch.full((b, width + steps, m, moe.top_k), -1, dtype=torch.int16)  # by cache column
        self._pending: tuple[list[torch.Tensor], int, torch.Tensor | None] | None = None

    def _flush(self) -> None:
        if self._pending is None:
            return
        layers, start, active = self._pending
        chosen = torch.stack(layers, dim=2).to(torch.int16)  # (B, L, M, k)
        if active is not None:  # rows that had finished fed padding: no route
            chosen = torch.where(active[:, None, None, None], chosen, -1)
        self.columns[:, start : start + chosen.shape[1]] = chosen
        self._pending = None

    def prefill(self, start: int) -> list[torch.Tensor]:
        """The list for the prefill forward, which feeds the cache columns from ``start`` on (those
        before it came from the prefix cache, experts included)."""
        self._pending = ([], start, None)
        return self._pending[0]

    def step(self, t: int, active: torch.Tensor) -> list[torch.Tensor]:
        """The list for the forward that feeds completion token ``t``; rows not ``active`` (finished:
        padding, or a stop token that predicts nothing) record none."""
        self._flush()
        self._pending = ([], self.width + t, active.clone())
        return self._pending[0]

    def by_column(self) -> torch.Tensor:
        """(B, width + steps, M, k): every forward so far, by cache column."""
        self._flush()
        return self.columns

    def record(self, lens: torch.Tensor, steps: int) -> torch.Tensor:
        """(B, width + steps, M, k): row i's columns shifted left by its padding."""
        self._flush()
        b, n = self.columns.shape[:2]
        total = self.width + steps
        source = (torch.arange(total)[None] + self.pad[:, None]).clamp(max=n - 1)  # (B, total)
        out = self.columns.gather(1, source[:, :, None, None].expand(-1, -1, *self.columns.shape[2:]))
        return out.masked_fill((torch.arange(total)[None] + self.pad[:, None] >= n)[:, :, None, None], -1)


class _Recorder:
    """Per-step outputs written into preallocated (B, T[, K|S]) tensors; finished rows get padding."""

    def __init__(self, b: int, steps: int, params: SamplingParams, pad_id: int) -> None:
        self.pad_id, self.slots, self.steps = pad_id, params.support_slots, 0
        self.stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long)
        self.done = torch.zeros(b, dtype=torch.bool)
        self.stopped = torch.zeros(b, dtype=torch.bool)
        self.kept_max = torch.zeros(b, dtype=torch.long)
        self.tokens = torch.full((b, steps), pad_id, dtype=torch.long)
        self.mask = torch.zeros((b, steps), dtype=torch.bool)
        self.logprobs = torch.zeros((b, steps))
        k, s = params.num_candidates, params.support_slots
        self.head_ids = torch.full((b, steps, k), -1, dtype=torch.long) if k > 0 else None
        self.head_logprobs = torch.full((b, steps, k), float("-inf")) if k > 0 else None
        with_support = params.truncates and s > 0
        self.support_ids = torch.full((b, steps, s), -1, dtype=torch.long) if with_support else None
        self.support_probs = torch.zeros((b, steps, s)) if with_support else None

    def record(self, t: int, step) -> None:
        active = ~self.done
        self.steps = t + 1
        self.tokens[:, t] = torch.where(active, step.tokens, self.pad_id)
        self.mask[:, t] = active
        self.logprobs[:, t] = torch.where(active, step.logprobs, 0.0)
        if self.head_ids is not None:
            self.head_ids[active, t] = step.head_ids[active]
            self.head_logprobs[active, t] = step.head_logprobs[active]
        if self.support_ids is not None:
            self.support_ids[active, t] = step.support_ids[active]
            self.support_probs[active, t] = step.support_probs[active]
            self.kept_max = torch.maximum(self.kept_max, torch.where(active, step.kept, 0))
        hit = active & torch.isin(step.tokens, self.stop_ids)
        self.stopped |= hit
        self.done |= hit

    def rollouts(self, prompt_ids, lens, version: int, pool: str, params: SamplingParams) -> Rollouts:
        if self.support_ids is not None:
            check_support(int(self.kept_max.max()), self.slots)
        n = self.steps

        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[:, :n].contiguous()

        return Rollouts(
            prompt_ids=prompt_ids,
            prompt_lens=lens,
            completion_ids=cut(self.tokens),
            mask=cut(self.mask),
            sampler_logprobs=cut(self.logprobs),
            policy_version=torch.full((len(lens),), version, dtype=torch.long),
            pool=(pool,) * len(lens),
            finish_reason=tuple(FINISH_STOP if s else FINISH_LENGTH for s in self.stopped.tolist()),
            temperature=params.temperature,
            head_ids=cut(self.head_ids),
            head_logprobs=cut(self.head_logprobs),
            support_ids=cut(self.support_ids),
            support_probs=cut(self.support_probs),
        )
