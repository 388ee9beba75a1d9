"""Per-token policy-gradient losses with off-policy correction (docs/math.md §2–§5).

`token_loss` is the REINFORCE form with an importance weight and optional score centering;
`ppo_clip_loss` is the PPO-clip objective of the `grpo`, `icepop` and `ppo_bypass` arms, with
π_old either the trainer's own detached log-probs or the sampler's. Both take flattened tokens
(N of them) and return a `LossOutput`; both take the importance ratio at token, sequence or
geometric level and aggregate by token mean or per sequence (`rlmix.correction.levels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlmix.correction.centering import centering_coefficients
from rlmix.correction.diagnostics import centering_stats, kl_k3_per_token, mismatch_stats, weight_stats
from rlmix.correction.levels import aggregation_scale, level_log_ratio
from rlmix.correction.logprobs import (
    Candidates,
    GatheredLogits,
    gather_logprobs,
    head_candidates,
    log_ratio,
    support_candidates,
)
from rlmix.correction.variant import Variant, variant
from rlmix.correction.weights import (
    MIS_HIGH,
    MIS_LOW,
    PPO_EPS_HIGH,
    PPO_EPS_LOW,
    TIS_CAP,
    CorrectionMode,
    ISLevel,
    LossAggregation,
    NoWeight,
    OldLogprobs,
    Weight,
    WeightFunction,
    make_weight,
    parse_enum,
)


@dataclass(frozen=True)
class LossOutput:
    """loss: 0-dim, differentiable. stats: 0-dim detached diagnostics (token means over N).

    token_stats: (N,) detached per-token values: `log_ratio` (clamped log p(a) − log q(a)),
    `kl_k3` (clamped to ≤ 10) and `weight` (the importance weight applied to the token); PPO adds
    `ppo_ratio` (p/π_old) and `clipped` (1 where the clipped branch of the surrogate was taken).
    """

    loss: Tensor
    stats: dict[str, Tensor]
    token_stats: dict[str, Tensor]


def token_loss(
    logits: Tensor | GatheredLogits,
    sampled_ids: Tensor,
    sampler_logprobs: Tensor,
    advantages: Tensor,
    *,
    mode: CorrectionMode | str | Variant = CorrectionMode.sc_mis,
    head_ids: Tensor | None = None,
    head_logprobs: Tensor | None = None,
    support_ids: Tensor | None = None,
    support_probs: Tensor | None = None,
    low: float = MIS_LOW,
    high: float = MIS_HIGH,
    cap: float = TIS_CAP,
    level: ISLevel | str = ISLevel.token,
    aggregation: LossAggregation | str = LossAggregation.token_mean,
    sequence_ids: Tensor | None = None,
    num_tokens: int | Tensor | None = None,
    num_sequences: int | Tensor | None = None,
) -> LossOutput:
    """REINFORCE loss with correction `mode`.

        loss_t = −A_t · ( sg(f(r)) · log p(a) − Σ_{v∈H} c_v · log p(v) )        (c = 0 unless SC)
        loss   = Σ_t s_t · loss_t                 (s_t = 1 / num_tokens for the token mean)

    logits (N, V) float, already divided by the sampling temperature, or the same logits as a
    `GatheredLogits` record (columns `loss_columns(sampled_ids, candidate ids)` plus the full
    log-normaliser: what the trainer's chunked lm-head pass produces); sampled_ids (N,) int64;
    sampler_logprobs (N,) log q(a); advantages (N,) detached. head_ids/head_logprobs (N, K):
    top-K candidates with full-vocabulary log-probs (−1/−inf padding). support_ids/support_probs
    (N, S): the recorded sampling support; when given, p is renormalised over it everywhere and
    it is the SC head with no tail (§4), and any head is ignored. SC modes need a head or a
    support. `f` is none/TIS(cap)/MIS([low, high]) per §2, of the token ratio r_a or, with
    `level` sequence/geometric, of its sequence's ratio (`level_log_ratio`; SC: token only);
    `c_v` per §3.2. `sequence_ids` (N,) names each token's sequence (needed by the sequence
    levels and aggregations); `s_t` per `aggregation_scale`, over the GLOBAL `num_tokens` /
    `num_sequences` of the optimizer step.
    """
    spec = mode if isinstance(mode, Variant) else variant(mode, low=low, high=high, cap=cap)
    level = parse_enum(ISLevel, level, "level")
    if level not in spec.levels:
        raise ValueError(f"mode={spec.mode.value} takes its weight per token (score centering pairs it with the "
                         f"token's head terms); level={level.value} is for the modes without centering")
    weight = spec.weight
    logits = _as_float(logits)
    _check_tokens(logits, sampled_ids, sampler_logprobs, advantages)
    dtype = _dtype(logits)
    candidates = _candidates(
        sampled_ids.shape[0], dtype, spec.centered, head_ids, head_logprobs, support_ids, support_probs
    )
    logp_a, logp_h = gather_logprobs(logits, sampled_ids, candidates)
    lr = log_ratio(logp_a.detach(), sampler_logprobs.to(dtype))
    w = weight.sampled(level_log_ratio(lr, sequence_ids, level))
    objective = w * logp_a  # (N,)
    stats = mismatch_stats(lr)
    if not isinstance(weight, NoWeight):
        stats |= weight_stats(w, weight.masks)
    if spec.centered:
        assert candidates is not None and logp_h is not None  # guaranteed by _candidates
        centering = centering_coefficients(
            logp_h, candidates.sampler_logprobs, candidates.valid, weight, exact=candidates.exact
        )
        objective = objective - torch.linalg.vecdot(centering.coefficients, logp_h)  # Σ_H c_v log p(v)
        stats |= centering_stats(centering)
    scale = aggregation_scale(aggregation, sequence_ids, sampled_ids.shape[0], num_tokens=num_tokens,
                              num_sequences=num_sequences, dtype=dtype, device=sampled_ids.device)
    loss = -(scale * advantages.to(dtype).detach() * objective).sum()
    return LossOutput(loss, stats, _token_stats(lr, w, logp_a))


def ppo_clip_loss(
    logits: Tensor | GatheredLogits,
    sampled_ids: Tensor,
    sampler_logprobs: Tensor,
    advantages: Tensor,
    *,
    old: OldLogprobs | str = OldLogprobs.trainer,
    old_logprobs: Tensor | None = None,
    weight: Weight | str | WeightFunction = Weight.none,
    eps_low: float = PPO_EPS_LOW,
    eps_high: float = PPO_EPS_HIGH,
    support_ids: Tensor | None = None,
    support_probs: Tensor | None = None,
    low: float = MIS_LOW,
    high: float = MIS_HIGH,
    cap: float = TIS_CAP,
    level: ISLevel | str = ISLevel.token,
    aggregation: LossAggregation | str = LossAggregation.token_mean,
    sequence_ids: Tensor | None = None,
    num_tokens: int | Tensor | None = None,
    num_sequences: int | Tensor | None = None,
) -> LossOutput:
    """PPO-clip with π_old the trainer's own log-probs (`old=trainer`) or the sampler's (`old=sampler`).

        r      = exp(clamp(log p(a) − log π_old(a), −20, 20))             (differentiable)
        loss_t = −f_w · min(r·A, clip(r, 1 − eps_low, 1 + eps_high)·A)
        loss   = Σ_t s_t · loss_t                 (s_t = 1 / num_tokens for the token mean)

    `old=trainer` (the study's GRPO, verl's and slime's default): π_old is `old_logprobs` (N,),
    the trainer's detached log-probs at the weights that took the batch's first update, or, when
    None, this forward's own log-probs detached (one optimizer step per batch: r ≡ 1 and the
    gradient is REINFORCE's). The correction weighs each term by `f_w = f(π_old/q)`, detached
    ("decoupled" PPO; IcePop for mis: the trainer/sampler ratio, masked outside the band).
    `old=sampler` (bypass): π_old is q, so r already carries p/q and `f_w = f(r)/r` adds only
    what f puts on top: 1 for `none`, `min(1, cap/r)` for `tis`, `1[low ≤ r ≤ high]` for `mis`.
    With `level` sequence/geometric f reads the sequence's ratio (`level_log_ratio`). Tokens with
    |log r| ≥ 20 get no gradient through the clamp. Shapes, support replay, `s_t` as `token_loss`.
    """
    old = parse_enum(OldLogprobs, old, "old")
    level = parse_enum(ISLevel, level, "level")
    weight_fn = make_weight(weight, low=low, high=high, cap=cap) if isinstance(weight, str) else weight
    if not (0.0 <= eps_low < 1.0 and eps_high >= 0.0):
        raise ValueError(f"PPO clip needs 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
    logits = _as_float(logits)
    _check_tokens(logits, sampled_ids, sampler_logprobs, advantages)
    dtype = _dtype(logits)
    candidates = _candidates(sampled_ids.shape[0], dtype, False, None, None, support_ids, support_probs)
    logp_a, _ = gather_logprobs(logits, sampled_ids, candidates)
    q = sampler_logprobs.to(dtype)
    lr_now = log_ratio(logp_a.detach(), q)  # the mismatch at the weights taking this update
    if old is OldLogprobs.sampler:
        lr = log_ratio(logp_a, q)
        f_w = weight_fn.ppo(level_log_ratio(lr.detach(), sequence_ids, level))
        lr_old = torch.zeros_like(lr_now)
    else:
        pi_old = logp_a.detach() if old_logprobs is None else old_logprobs.to(dtype)
        if pi_old.shape != logp_a.shape:
            raise ValueError(f"old_logprobs must be {tuple(logp_a.shape)}, got {tuple(pi_old.shape)}")
        lr = log_ratio(logp_a, pi_old)
        lr_old = log_ratio(pi_old, q)
        f_w = weight_fn.sampled(level_log_ratio(lr_old, sequence_ids, level))
    ratio = lr.exp()
    adv = advantages.to(dtype).detach()
    unclipped, clipped = ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    scale = aggregation_scale(aggregation, sequence_ids, sampled_ids.shape[0], num_tokens=num_tokens,
                              num_sequences=num_sequences, dtype=dtype, device=sampled_ids.device)
    loss = -(scale * f_w * surrogate).sum()
    took_clip = (clipped.detach() < unclipped.detach()).to(dtype)  # the clipped branch: no gradient here
    stats = mismatch_stats(lr_now) | {"clip_frac": took_clip.mean() if took_clip.numel() else took_clip.sum(),
                                      "old_sampler_gap": lr_old.abs().mean() if lr_old.numel() else lr_old.sum()}
    if not isinstance(weight_fn, NoWeight):
        stats |= weight_stats(f_w, weight_fn.masks)
    token_stats = _token_stats(lr_now, f_w, logp_a) | {"ppo_ratio": ratio.detach(), "clipped": took_clip}
    return LossOutput(loss, stats, token_stats)


def _as_float(logits: Tensor | GatheredLogits) -> Tensor | GatheredLogits:
    # §3.3: fp32 log-softmax even for a BF16 model; fp64 passes through (tests use it).
    def up(x: Tensor) -> Tensor:
        return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x

    if isinstance(logits, GatheredLogits):
        return GatheredLogits(logits.ids, up(logits.z), up(logits.log_norm))
    return up(logits)


def _dtype(logits: Tensor | GatheredLogits) -> torch.dtype:
    return logits.z.dtype if isinstance(logits, GatheredLogits) else logits.dtype


def _check_tokens(
    logits: Tensor | GatheredLogits, sampled_ids: Tensor, sampler_logprobs: Tensor, advantages: Tensor
) -> None:
    if isinstance(logits, GatheredLogits):
        n = logits.num_tokens
    elif logits.dim() != 2:
        raise ValueError(f"logits must be (N, V), got shape {tuple(logits.shape)}")
    else:
        n = logits.shape[0]
    for name, t in (("sampled_ids", sampled_ids), ("sampler_logprobs", sampler_logprobs), ("advantages", advantages)):
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} must be ({n},) to match logits, got shape {tuple(t.shape)}")


def _check_slots(name: str, ids: Tensor, values: Tensor | None, n: int) -> None:
    if ids.dim() != 2 or ids.shape[0] != n:
        raise ValueError(f"{name}_ids must be ({n}, K), got shape {tuple(ids.shape)}")
    if values is not None and values.shape != ids.shape:
        raise ValueError(f"{name} values must match {name}_ids {tuple(ids.shape)}, got {tuple(values.shape)}")


def _candidates(
    n: int,
    dtype: torch.dtype,
    centered: bool,
    head_ids: Tensor | None,
    head_logprobs: Tensor | None,
    support_ids: Tensor | None,
    support_probs: Tensor | None,
) -> Candidates | None:
    """The candidate set: the support when recorded (§4), else the head for SC, else none."""
    if support_ids is not None:
        _check_slots("support", support_ids, support_probs, n)
        if centered and support_probs is None:
            raise ValueError("score centering over a recorded support needs support_probs as well as support_ids")
        return support_candidates(support_ids, support_probs, dtype)
    if not centered:
        return None
    if head_ids is None or head_logprobs is None:
        raise ValueError(
            "score-centering modes (sc, sc_tis, sc_mis) need the sampler's top-K candidates "
            "(head_ids and head_logprobs) or its recorded sampling support (support_ids and support_probs)"
        )
    _check_slots("head", head_ids, head_logprobs, n)
    return head_candidates(head_ids, head_logprobs.to(dtype))


def _token_stats(lr: Tensor, weights: Tensor, logp_a: Tensor) -> dict[str, Tensor]:
    """Per-token values for the step's metrics. ``logp``: the trainer's log p(a) as it is, which the
    clamped ``lr`` cannot give back where the sampler's log q underflowed (rlmix.metrics.where)."""
    return {"log_ratio": lr, "kl_k3": kl_k3_per_token(lr), "weight": weights.detach(), "logp": logp_a.detach()}
