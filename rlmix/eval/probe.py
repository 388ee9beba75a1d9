"""Sampler–trainer mismatch of each pool, measured without training (``rlmix probe``).

For one pool the probe

1. samples completions of a fixed prompt set with the pool's own sampler (its precision view,
   its sampling params, K top candidates recorded) and times the generation (tokens/s);
2. recomputes the trainer's logits on exactly those tokens (``rlmix.trainers.view.TrainerView``) — the fp32 HF
   model under BF16 autocast, as ``rlmix train`` computes them — and reports the docs/math.md
   §6 diagnostics of the sampled tokens: k3, k1, mean |Δ log-prob|, multiplicative error, ratio
   tail fraction, and the §3.2 SC tail ratio ρ and head mass P_H over the pool's head;
3. attributes the mismatch to its factors by teacher forcing (below);
4. says where the mismatch sits: the sampled tokens binned by trainer probability, by position and,
   for episodes, by distance after an environment token, and the router-flip share of it for a
   mixture-of-experts model (``rlmix.eval.where``; docs/probe.md).

What a pool samples is a draw (``rlmix.assembly.draws``), chosen by the task's kind: completions of
the prompt set, or whole episodes for an episode task.

Attribution. The *reference view* is the trainer's arithmetic written as a precision view
(``reference_view``): bf16 weights, bf16 activations and linear inputs, bf16 KV, and the exact
``fp32_softmax`` attention kernel — BF16 autocast rounds weights and activations to bf16 for
every matmul while attention's softmax is taken in fp32 (fp16 throughout for an FP16 trainer,
fp32 for an fp32 one). From it, one factor at a time is
switched to the pool's value (``factor_views``):

- ``weights``: the weight format and the arithmetic it implies (activation dtype, W8A8 linear
  inputs, int4 group size — ``resolve_view`` derives these from the weight format);
- ``kv``: the KV-cache format;
- ``kernel``: the attention-kernel family.

Every view is run teacher-forced (``TorchSampler.logits``) on the pool's sampled sequences, so
every factor is compared on identical tokens, and the per-token KL is exact over the full
vocabulary at the sampling temperature (``exact_kl``)::

    KL_f = mean_t Σ_v q_f(v|h_t) · (log q_f(v|h_t) − log p_ref(v|h_t))

A factor's share is ``KL_f / Σ_g KL_g``. The pool's *joint* KL (all factors switched) and the
interaction ``joint − Σ_f KL_f`` are reported beside them, as is ``KL(p_ref ‖ p_trainer)``,
which says how well the reference view stands in for the trainer.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rlmix.config.schema import RunConfig, TrainerConfig, TrainerPrecision
from rlmix.correction import Correction, multiplicative_error, token_entropy, token_mismatch
from rlmix.correction.centering import centering_coefficients
from rlmix.correction.diagnostics import centering_stats, mismatch_stats
from rlmix.correction.logprobs import gather_logprobs
from rlmix.errors import ConfigError
from rlmix.assembly.fleet import SamplerSpec, build_sampler, fleet_manifest, resolve_fleet, view_sampler
from rlmix.assembly.draws import EpisodeDraw, SingleTurnDraw
from rlmix.assembly.parts import package_versions, resolve_model_dir, trainer_view
from rlmix.assembly.plan import RunPlan
from rlmix.assembly.task_kinds import TaskKind
from rlmix.eval.where import (MismatchBin, RouterFlips, by_env_distance, by_position, by_trainer_prob,
                              completion_positions, env_distances, router_flips)
from rlmix.rollout import Rollouts, sequence_input_ids
from rlmix.samplers.accelerators import PrecisionView, resolve_view
from rlmix.seeds import derive_seed

FACTORS = ("weights", "kv", "kernel")
# Defaults that have no RunConfig field yet (the one place they live).
ROWS_PER_CHUNK = 32  # sequences per teacher-forced forward: bounds the (rows, L, V) logits at large V


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe samples (``probe.*``; K defaults to ``correction.num_candidates``)."""

    prompts: int
    samples_per_prompt: int
    num_candidates: int
    seed: int

    @classmethod
    def from_run_config(cls, cfg: RunConfig) -> ProbeSettings:
        k = cfg.correction.num_candidates if cfg.probe.num_candidates is None else cfg.probe.num_candidates
        if k < 1:
            raise ConfigError(f"probe.num_candidates={k}: the probe needs K >= 1 to report the SC tail ratio and head mass")
        n = cfg.probe.samples_per_prompt
        if n < 1:
            raise ConfigError(f"probe.samples_per_prompt={n}: the probe samples each prompt at least once; use >= 1")
        return cls(cfg.probe.prompts, n, k, cfg.seed)


# -- pure math ---------------------------------------------------------------------------------


def exact_kl(q_logits: Tensor, p_logits: Tensor) -> Tensor:
    """Per-token KL(q‖p) = Σ_v q_v (log q_v − log p_v) over the full vocabulary, (N, V) → (N,).

    Logits are already divided by the temperature; softmax in fp32. Where q_v = 0 the term is 0
    (masked before multiplying, so −inf never meets a zero).
    """
    logq = torch.log_softmax(q_logits.float(), dim=-1)
    logp = torch.log_softmax(p_logits.float(), dim=-1)
    q = logq.exp()
    terms = torch.where(q > 0, q * (logq - logp), torch.zeros_like(q))
    return terms.sum(-1)


def attribution_shares(factor_kls: dict[str, float]) -> dict[str, float] | None:
    """``KL_f / Σ_g KL_g`` per factor; None when the sum is 0 (nothing to attribute)."""
    total = sum(factor_kls.values())
    if total <= 0:
        return None
    return {name: kl / total for name, kl in factor_kls.items()}


# -- views -------------------------------------------------------------------------------------


def reference_view(precision: TrainerPrecision = TrainerPrecision.bf16) -> PrecisionView:
    """The trainer's arithmetic as a view: weights/activations/KV in its autocast format, exact
    fp32-softmax kernel (fp32 throughout for an fp32 trainer)."""
    if precision is TrainerPrecision.fp32:
        return PrecisionView.exact()
    return resolve_view("CPU", precision.value, allow_emulation=True)  # the CPU catalog lacks fp16


def factor_views(view: PrecisionView, reference: PrecisionView) -> dict[str, PrecisionView]:
    """``reference`` with exactly one factor switched to ``view``'s value, keyed by FACTORS."""
    return {
        "weights": dataclasses.replace(
            reference, weights=view.weights, activations=view.activations,
            linear_inputs=view.linear_inputs, int4_group=view.int4_group, fp8_scales=view.fp8_scales,
        ),
        "kv": dataclasses.replace(reference, kv_cache=view.kv_cache),
        "kernel": dataclasses.replace(reference, kernel=view.kernel, fp8_attention=view.fp8_attention),
    }


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attribution:
    """Teacher-forced exact KLs against the reference view (see the module docstring)."""

    factor_kl: dict[str, float]  # KL(q_f ‖ p_ref) per factor
    shares: dict[str, float] | None  # KL_f / Σ KL_f; None when every factor KL is 0
    joint_kl: float  # KL(q_pool ‖ p_ref): all factors switched at once
    interaction: float  # joint_kl − Σ_f KL_f
    reference_to_trainer_kl: float  # KL(p_ref ‖ p_trainer): how well the reference stands in for the trainer
    views: dict[str, str]  # factor → label of the view it ran


@dataclass(frozen=True)
class PoolProbe:
    """One pool's measurements (means over the sampled tokens)."""

    pool: str
    label: str
    tags: dict[str, str]
    sequences: int
    tokens: int
    tokens_per_s: float
    kl_k3: float
    kl_k1: float
    logprob_abs_diff: float
    multiplicative_error: float
    ratio_tail_frac: float
    kl_exact: float | None  # teacher-forced exact KL(q_pool ‖ p_trainer); None without a torch view
    sc_tail_ratio: float
    sc_head_mass: float  # P_H: the trainer's mass on the sampler's head
    sc_sampler_head_mass: float  # Q_H: the sampler's own
    sc_coef_l1: float
    attribution: Attribution | None  # None for pools without a torch precision view (vllm)
    by_trainer_prob: tuple[MismatchBin, ...]  # where the mismatch sits (rlmix.eval.where)
    by_position: tuple[MismatchBin, ...]
    by_env_distance: tuple[MismatchBin, ...] | None  # episodes only: None when no token follows an observation
    router: RouterFlips | None  # None for a dense model
    # The trainer's entropy at the sampled positions, nats per token, full vocabulary, at the
    # sampling temperature: how much of the answer is still free (mismatch needs freedom to matter).
    trainer_entropy: float = 0.0


# -- measurement -------------------------------------------------------------------------------


def sequence_attention(batch: Rollouts, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """``input_ids`` (B, L) right-padded, ``attention_mask`` (B, L) and ``target_pos`` (B, T)."""
    input_ids, target_pos = sequence_input_ids(batch, pad_id)
    # (B,) real tokens per row, up to its last generated one (an episode's mask has holes: observations)
    ends = batch.prompt_lens + (batch.mask * torch.arange(1, batch.mask.shape[1] + 1)).amax(1)
    return input_ids, torch.arange(input_ids.shape[1])[None] < ends[:, None], target_pos


def teacher_forced_logits(sampler, batch: Rollouts, pad_id: int) -> Tensor:
    """(N, V) fp32 logits / T of a torch sampler's view at the positions that predict masked tokens."""
    input_ids, attention, target_pos = sequence_attention(batch, pad_id)
    logits = sampler.logits(input_ids, attention)  # (B, L, V)
    V = logits.shape[-1]
    picked = logits.gather(1, target_pos[..., None].expand(-1, -1, V))  # (B, T, V)
    return picked[batch.mask] / batch.temperature


class ProbeContext:
    """What every pool's probe shares: the trainer's view, the reference view and a cache of view samplers."""

    def __init__(self, model_dir: Path, pad_id: int, correction: Correction, trainer: TrainerConfig, seed: int):
        self.model_dir, self.pad_id, self.correction, self.seed = model_dir, pad_id, correction, seed
        self.trainer = trainer_view(model_dir, trainer, correction, pad_id)
        self.reference = reference_view(trainer.precision)
        self._samplers: dict[PrecisionView, object] = {}

    def view_sampler(self, view: PrecisionView):
        """A torch sampler computing with ``view`` (built once per distinct view)."""
        if view not in self._samplers:
            self._samplers[view] = view_sampler(self.model_dir, view, pool="probe", seed=self.seed, pad_id=self.pad_id)
        return self._samplers[view]


def _chunk_measure(ctx: ProbeContext, chunk: Rollouts, view: PrecisionView | None) -> dict[str, Tensor]:
    """Per-token tensors of one chunk: trainer log-probs of the sampled tokens and candidates, and KLs."""
    tokens = ctx.trainer.tokens(chunk)
    trainer = tokens.logits  # (n, V)
    cand = tokens.candidates()
    logp_a, logp_h = gather_logprobs(trainer, tokens.sampled_ids, cand)
    out = {"trainer_logprobs": logp_a, "trainer_head": logp_h, "valid": cand.valid,
           "sampler_head": cand.sampler_logprobs, "entropy": token_entropy(trainer)}
    if tokens.router_flip is not None:  # a mixture-of-experts model (the same for every chunk)
        out["router_flip"] = tokens.router_flip
    if view is None:
        return out
    ref = teacher_forced_logits(ctx.view_sampler(ctx.reference), chunk, ctx.pad_id)
    pool = teacher_forced_logits(ctx.view_sampler(view), chunk, ctx.pad_id)
    out["kl_exact"] = exact_kl(pool, trainer)
    out["kl_joint"] = exact_kl(pool, ref)
    out["kl_ref_trainer"] = exact_kl(ref, trainer)
    for name, fview in factor_views(view, ctx.reference).items():
        same = fview == ctx.reference  # the factor already has the reference's value: KL is exactly 0
        out[f"kl_{name}"] = torch.zeros(len(ref)) if same else exact_kl(
            teacher_forced_logits(ctx.view_sampler(fview), chunk, ctx.pad_id), ref)
    return out


def _mean(x: Tensor) -> float:
    return float(x.mean()) if x.numel() else 0.0


def measure(ctx: ProbeContext, batch: Rollouts, spec: SamplerSpec, tokens_per_s: float) -> PoolProbe:
    """All of a pool's statistics on its sampled ``batch`` (teacher-forced parts need ``spec.view``)."""
    step = ROWS_PER_CHUNK
    parts = [_chunk_measure(ctx, batch.rows(slice(i, i + step)), spec.view) for i in range(0, len(batch), step)]
    per_token = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    lr = token_mismatch(per_token["trainer_logprobs"], batch.sampler_logprobs[batch.mask]).log_ratio
    stats = {k: float(v) for k, v in mismatch_stats(lr).items()}
    cfg = ctx.correction
    weight = cfg.variant.weight
    exact = cfg.replay_support and batch.support_ids is not None
    centering = centering_coefficients(
        per_token["trainer_head"], per_token["sampler_head"], per_token["valid"], weight, exact=exact
    )
    sc = {k: float(v) for k, v in centering_stats(centering).items()}
    return PoolProbe(
        pool=spec.pool,
        label=spec.view.label if spec.view is not None else f"{spec.pool_cfg.backend.value}:{spec.pool}",
        tags=dict(spec.tags),
        sequences=len(batch),
        tokens=batch.num_tokens,
        tokens_per_s=tokens_per_s,
        multiplicative_error=float(multiplicative_error(lr)),
        kl_exact=_mean(per_token["kl_exact"]) if spec.view is not None else None,
        attribution=_attribution(per_token, spec.view, ctx.reference) if spec.view is not None else None,
        by_trainer_prob=by_trainer_prob(lr, per_token["trainer_logprobs"]),
        by_position=by_position(lr, completion_positions(batch.mask)),
        by_env_distance=by_env_distance(lr, env_distances(batch.mask)),
        router=router_flips(lr, per_token["router_flip"]) if "router_flip" in per_token else None,
        trainer_entropy=_mean(per_token["entropy"]),
        **stats,
        **sc,
    )


def _attribution(per_token: dict[str, Tensor], view: PrecisionView, reference: PrecisionView) -> Attribution:
    factor_kl = {name: _mean(per_token[f"kl_{name}"]) for name in FACTORS}
    joint = _mean(per_token["kl_joint"])
    return Attribution(
        factor_kl=factor_kl,
        shares=attribution_shares(factor_kl),
        joint_kl=joint,
        interaction=joint - sum(factor_kl.values()),
        reference_to_trainer_kl=_mean(per_token["kl_ref_trainer"]),
        views={name: v.label for name, v in factor_views(view, reference).items()},
    )


def probe_pool(ctx: ProbeContext, spec: SamplerSpec, draw: SingleTurnDraw | EpisodeDraw,
               settings: ProbeSettings) -> PoolProbe:
    """Draw the prompt set with one instance of ``spec``'s pool (``rlmix.assembly.draws``), time it, and
    measure it against the trainer.

    Every pool draws with the same seed (common random numbers), so pools differ by their
    arithmetic, not by their luck.
    """
    sampler = build_sampler(spec, ctx.model_dir, derive_seed(settings.seed, "probe", spec.pool))
    params = dataclasses.replace(
        spec.params, num_candidates=settings.num_candidates, seed=derive_seed(settings.seed, "probe")
    )
    draw.warm_up(sampler, params)
    start = time.perf_counter()
    batch = draw(sampler, params, spec.pool)
    elapsed = time.perf_counter() - start
    sampler.close()
    return measure(ctx, batch, spec, batch.num_tokens / max(elapsed, 1e-9))


REFERENCE_DEFINITION = (
    "trainer-like precision view: weights, activations, linear inputs and KV cache in the trainer's "
    "autocast format (bf16 by default; trainer.precision), "
    "exact fp32-softmax attention kernel. Factors switch one at a time to the pool's value: "
    "weights (weight format with the activation dtype / W8A8 inputs / int4 group it implies), "
    "kv (KV-cache format), kernel (attention-kernel family). Factor KLs are exact full-vocabulary "
    "KL(q_factor || p_ref) per token, teacher-forced on the pool's sampled sequences, averaged over tokens."
)


def probe_prompts(task: TaskKind, seed: int, count: int, split: str) -> list:
    """``count`` problems of the task's ``split``, evenly spaced through it (a split ordered by difficulty, as
    minicode's, has every level from as many prompts as levels up); a split the task lacks is the task's
    one-line ConfigError."""
    problems = task.make(seed).split(split)
    if not 1 <= count <= len(problems):
        raise ConfigError(
            f"probe.prompts={count}: the probe samples that many prompts from the {split} split, "
            f"which has {len(problems)}; use 1..{len(problems)}"
        )
    return [problems[i * len(problems) // count] for i in range(count)]


def probe_fleet(plan: RunPlan, progress=print, split: str = "test") -> tuple[list[PoolProbe], dict]:
    """Probe every pool of the plan's fleet (one instance each) on the task's ``split`` (``rlmix probe``
    passes ``task.split`` as ``rlmix eval`` reads it): (per-pool results, what ``probe.json`` holds)."""
    from rlmix.models.tokenizer_file import load_fast_tokenizer

    cfg = plan.cfg
    if not cfg.fleet.pools:
        raise ConfigError("fleet.pools is empty: the probe needs at least one pool (e.g. fleet=emulated_hetero6)")
    settings = ProbeSettings.from_run_config(cfg)
    problems = probe_prompts(plan.task, cfg.seed, settings.prompts, split)
    model_dir = resolve_model_dir(plan, progress=progress)
    tokenizer = load_fast_tokenizer(model_dir)
    plan.task.check_prompts(problems, tokenizer, model_dir, cfg.loop.max_new_tokens, "loop.max_new_tokens",
                            f"the probe's prompts (task.split={split})")
    specs = resolve_fleet(plan, tokenizer.eos_token_id, model_dir)
    firsts = [spec for spec in specs if spec.index == 0]
    draw = plan.task.probe_draw(cfg.seed, problems, tokenizer, settings.samples_per_prompt)
    ctx = ProbeContext(model_dir, tokenizer.pad_token_id, plan.correction, cfg.trainer, cfg.seed)
    results: list[PoolProbe] = []
    try:
        for i, spec in enumerate(firsts):
            start = time.perf_counter()
            result = probe_pool(ctx, spec, draw, settings)
            results.append(result)
            progress(
                f"[{i + 1}/{len(firsts)}] {spec.pool} ({result.label}): kl_k3={result.kl_k3:.3g} "
                f"|dlogp|={result.logprob_abs_diff:.3g} entropy={result.trainer_entropy:.3g} "
                f"{result.sequences} seqs {result.tokens} tokens {result.tokens_per_s:.0f} tok/s "
                f"({time.perf_counter() - start:.1f} s)"
            )
    finally:
        draw.close()
    return results, {
        "fleet": fleet_manifest(specs),
        "reference": {"definition": REFERENCE_DEFINITION, "view": ctx.reference.tags(),
                      "label": ctx.reference.label},
        "trainer": {"model_dir": str(model_dir), "autocast": cfg.trainer.precision.value, "dtype": "fp32"},
        "settings": dataclasses.asdict(settings) | {
            "temperature": cfg.loop.temperature,
            "max_new_tokens": cfg.loop.max_new_tokens,
            "correction": cfg.correction.mode.value,
            "prompt_set": split,
            "task_ids": [p.task_id for p in problems],
        },
        "pools": {r.pool: dataclasses.asdict(r) for r in results},
        "versions": package_versions(),
    }
