"""Correction variants and importance-weight functions (docs/math.md §2 and the §3.2 table).

One way to pick a variant: a `CorrectionMode` names a weight function and whether score
centering is on (`MODES`); a `Weight` maps to its implementation through `WEIGHTS`.

Every weight function works on clamped log-ratios ``lr = clamp(log p − log q, −20, 20)``
(§3.3: never exponentiate an unbounded ratio) and returns detached tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch
from torch import Tensor


class CorrectionMode(str, Enum):
    """The loss variant. Member names equal the YAML spelling (Hydra/OmegaConf needs that)."""

    none = "none"
    tis = "tis"
    mis = "mis"
    sc = "sc"
    sc_tis = "sc_tis"
    sc_mis = "sc_mis"


class Weight(str, Enum):
    """The per-token importance weight `f(r)` of docs/math.md §2."""

    none = "none"
    tis = "tis"
    mis = "mis"


class Objective(str, Enum):
    """The policy-gradient objective. Member names equal the YAML spelling."""

    reinforce = "reinforce"  # docs/math.md §3: the SC arms
    ppo_clip = "ppo_clip"  # docs/math.md §5: the grpo / icepop / ppo_bypass arms


class OldLogprobs(str, Enum):
    """What PPO's π_old is (docs/math.md §5). Member names equal the YAML spelling."""

    # The trainer's own detached log-probs at the weights that take the batch's first update: the
    # ratio is 1 with one optimizer step per batch, and the correction's weight f acts on π_old/q
    # ("decoupled" PPO). The study's GRPO, and verl's and slime's default.
    trainer = "trainer"
    # The sampler's log-probs q: PPO's ratio is p/q and its clip is itself a correction (verl's
    # bypass mode, TRL's async GRPO, PipelineRL).
    sampler = "sampler"


class ISLevel(str, Enum):
    """Where the importance ratio is taken (docs/math.md §2). Member names equal the YAML spelling."""

    token = "token"  # r_t = p(a_t)/q(a_t) per token
    sequence = "sequence"  # ρ = Π_t r_t, one ratio per sequence on each of its tokens
    geometric = "geometric"  # exp(mean_t log r_t): the per-token geometric mean, per sequence


class LossAggregation(str, Enum):
    """How per-token loss terms become the step's loss (docs/math.md §5). YAML spelling."""

    token_mean = "token_mean"  # Σ_t ℓ_t / (tokens in the step): the study's, every arm's default
    seq_mean_token_mean = "seq_mean_token_mean"  # mean over sequences of each one's token mean
    seq_mean_token_sum = "seq_mean_token_sum"  # mean over sequences of each one's token sum (Dr. GRPO)


# The knobs' defaults (docs/math.md §2 and §5): the one place they live. config/schema.py and the
# loss functions both read these names.
# MIS band [low, high] on the token ratio p/q: IcePop's (Ring-1T, arXiv 2510.18855), which the
# study's recipes name; MiMo uses [0.2, 5].
MIS_LOW, MIS_HIGH = 0.5, 5.0
# TIS cap C (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
# training"; verl's rollout_is_threshold default).
TIS_CAP = 2.0
# PPO clip range [1 - eps_low, 1 + eps_high]: the study's recipe (0.2 / 0.28, DAPO's clip-higher).
PPO_EPS_LOW, PPO_EPS_HIGH = 0.2, 0.28

_ANY_OBJECTIVE = frozenset(Objective)


@dataclass(frozen=True)
class ModeSpec:
    """One correction variant's row; read only by ``rlmix.correction.variant``, which binds it to its knobs.

    weight: `f` of §2 on the sampled token (inside PPO clip it multiplies the clipped ratio).
    centered: add the score-centering term of §3 over the sampler's head (or the replayed support).
    objectives: the objectives the variant is defined for; score centering cannot be substituted
    into PPO clipping (§3.2), so the SC variants allow only REINFORCE.
    """

    weight: Weight
    centered: bool
    objectives: frozenset[Objective] = _ANY_OBJECTIVE

    @property
    def levels(self) -> frozenset[ISLevel]:
        """Where the weight may be taken: score centering pairs each token's weight with its own
        head terms (§3.2), so the SC variants take it per token only."""
        return frozenset({ISLevel.token}) if self.centered else frozenset(ISLevel)


_REINFORCE = frozenset({Objective.reinforce})

# Adding a variant: one row here, one member of CorrectionMode, one conf/correction/*.yaml.
MODES: dict[CorrectionMode, ModeSpec] = {
    CorrectionMode.none: ModeSpec(Weight.none, centered=False),
    CorrectionMode.tis: ModeSpec(Weight.tis, centered=False),
    CorrectionMode.mis: ModeSpec(Weight.mis, centered=False),
    CorrectionMode.sc: ModeSpec(Weight.none, centered=True, objectives=_REINFORCE),
    CorrectionMode.sc_tis: ModeSpec(Weight.tis, centered=True, objectives=_REINFORCE),
    CorrectionMode.sc_mis: ModeSpec(Weight.mis, centered=True, objectives=_REINFORCE),
}


class WeightFunction(Protocol):
    """`f` in its four uses. Inputs are detached; shapes are elementwise."""

    masks: bool  # True when f can set a token's weight to exactly 0 (MIS)

    def sampled(self, log_ratio: Tensor) -> Tensor:
        """`f(r_a)` for the sampled token (§2)."""

    def head_term(self, p: Tensor, q: Tensor, log_ratio: Tensor) -> Tensor:
        """`q_v · f(p_v / q_v)` for a head token, in closed form (§3.2 table)."""

    def tail_scale(self, tail_ratio: Tensor) -> Tensor:
        """`α = ρ · f(1/ρ)` (§3.2 table)."""

    def ppo(self, log_ratio: Tensor) -> Tensor:
        """The extra factor on a PPO-clip term whose ratio is already `p/q`: `f(r)/r`, 1 for `none`."""


class NoWeight:
    """`f ≡ 1`."""

    masks = False

    def sampled(self, log_ratio: Tensor) -> Tensor:
        return torch.ones_like(log_ratio)

    def head_term(self, p: Tensor, q: Tensor, log_ratio: Tensor) -> Tensor:
        return q

    def tail_scale(self, tail_ratio: Tensor) -> Tensor:
        return tail_ratio

    def ppo(self, log_ratio: Tensor) -> Tensor:
        # PPO with the sampler as π_old already carries r = p/q; "none" adds nothing on top.
        return torch.ones_like(log_ratio)


@dataclass(frozen=True)
class TruncatedIS:
    """TIS: `f(r) = min(r, C)` (Yao et al. 2025)."""

    cap: float
    masks = False

    def sampled(self, log_ratio: Tensor) -> Tensor:
        return log_ratio.exp().clamp_max(self.cap)

    def head_term(self, p: Tensor, q: Tensor, log_ratio: Tensor) -> Tensor:
        # q·min(p/q, C) = min(p, C·q): exact even when q underflows to 0.
        return torch.minimum(p, self.cap * q)

    def tail_scale(self, tail_ratio: Tensor) -> Tensor:
        return (self.cap * tail_ratio).clamp_max(1.0)

    def ppo(self, log_ratio: Tensor) -> Tensor:
        # min(r, C)/r = min(1, C/r): the effective ratio r·f_w is truncated at C.
        return (math.log(self.cap) - log_ratio).exp().clamp_max(1.0)


@dataclass(frozen=True)
class MaskedIS:
    """MIS / IcePop: `f(r) = r · 1[L ≤ r ≤ U]`, no renormalisation by the kept count."""

    low: float
    high: float
    masks = True

    def keep(self, log_ratio: Tensor) -> Tensor:
        """`L ≤ r ≤ U`, compared in log space."""
        return (log_ratio >= math.log(self.low)) & (log_ratio <= math.log(self.high))

    def sampled(self, log_ratio: Tensor) -> Tensor:
        return torch.where(self.keep(log_ratio), log_ratio.exp(), torch.zeros_like(log_ratio))

    def head_term(self, p: Tensor, q: Tensor, log_ratio: Tensor) -> Tensor:
        # q·(p/q)·1[band] = p·1[band]; q = 0 gives lr = +20 (clamped), outside any sane band.
        return p * self.keep(log_ratio)

    def tail_scale(self, tail_ratio: Tensor) -> Tensor:
        inv = 1.0 / tail_ratio
        return ((inv >= self.low) & (inv <= self.high)).to(tail_ratio.dtype)

    def ppo(self, log_ratio: Tensor) -> Tensor:
        # r·1[band]/r: IcePop's mask on a PPO term whose ratio already is p/q.
        return self.keep(log_ratio).to(log_ratio.dtype)


WEIGHTS: dict[Weight, Callable[[float, float, float], WeightFunction]] = {
    Weight.none: lambda low, high, cap: NoWeight(),
    Weight.tis: lambda low, high, cap: TruncatedIS(cap=cap),
    Weight.mis: lambda low, high, cap: MaskedIS(low=low, high=high),
}


def make_weight(weight: Weight | str, *, low: float, high: float, cap: float) -> WeightFunction:
    """The weight function for `weight` with MIS band [low, high] and TIS cap `cap`."""
    weight = parse_enum(Weight, weight, "weight")
    if not 0.0 < low <= high:
        raise ValueError(f"MIS band needs 0 < low <= high, got low={low}, high={high}")
    if not cap > 0.0:
        raise ValueError(f"TIS cap must be > 0, got cap={cap}")
    return WEIGHTS[weight](low, high, cap)


def parse_enum(enum_type: type[Enum], value: Enum | str, name: str):
    """`enum_type(value)` with an error that lists the allowed spellings."""
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum_type)
        raise ValueError(f"{name}={value!r} is not one of: {allowed}") from None
