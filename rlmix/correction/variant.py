"""A correction resolved once: a mode's row of `MODES` with its knobs bound.

`variant(mode, low=, high=, cap=)` is the only place a mode's row is read. `Correction.resolve`
checks a run's `correction.*` settings against that row (the messages name the keys, because the
keyword arguments are the keys) and returns the record the trainer's loss, the samplers' head
size and the mismatch probe all take; nothing below it looks the mode up again.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from rlmix.correction.regularizers import KLEstimator
from rlmix.correction.weights import (
    MODES,
    CorrectionMode,
    ISLevel,
    LossAggregation,
    Objective,
    OldLogprobs,
    WeightFunction,
    make_weight,
    parse_enum,
)


class AdvantageNorm(str, enum.Enum):
    """How group rewards become advantages (docs/math.md §5). Member names equal the YAML spelling."""

    group_mean = "group_mean"  # reward minus its group's mean (the SC arms)
    group_mean_std = "group_mean_std"  # ... divided by the group's std (GRPO)


@dataclass(frozen=True)
class Variant:
    """One mode with its bounds bound: the weight `f` of §2 and whether the SC term of §3 is added.

    objectives / levels: what the mode is defined for (score centering cannot go inside PPO
    clipping, §3.2, and pairs each token's weight with its own head terms, so SC modes take
    REINFORCE at token level only).
    """

    mode: CorrectionMode
    weight: WeightFunction
    centered: bool
    objectives: frozenset[Objective]
    levels: frozenset[ISLevel]


def variant(mode: CorrectionMode | str, *, low: float, high: float, cap: float) -> Variant:
    """The row of ``MODES`` for ``mode``, its weight function built with band [low, high] and cap."""
    mode = parse_enum(CorrectionMode, mode, "mode")
    row = MODES[mode]
    return Variant(mode, make_weight(row.weight, low=low, high=high, cap=cap), row.centered,
                   row.objectives, row.levels)


def _modes_with(predicate) -> str:
    return "|".join(m.value for m, row in MODES.items() if predicate(row))


@dataclass(frozen=True)
class Correction:
    """A run's objective and correction, resolved from ``correction.*`` (``Correction.resolve``).

    head_size: the top-K candidates samplers record per token (0 when the variant reads no head).
    support_slots: slots for a truncated (top-p / top-k) sampler's support, recorded only by the
    pools that truncate. The rest are the knobs of the same names, typed.
    """

    variant: Variant
    objective: Objective
    old_logprobs: OldLogprobs
    advantage: AdvantageNorm
    level: ISLevel
    aggregation: LossAggregation
    eps_low: float
    eps_high: float
    head_size: int
    support_slots: int
    replay_support: bool
    routing_replay: bool
    kl_coef: float
    kl_estimator: KLEstimator
    entropy_coef: float

    @property
    def mode(self) -> CorrectionMode:
        return self.variant.mode

    @property
    def centered(self) -> bool:
        """The SC term enters the loss (REINFORCE only: the PPO arms never centre)."""
        return self.variant.centered and self.objective is Objective.reinforce

    @classmethod
    def resolve(
        cls,
        *,
        mode: CorrectionMode | str,
        objective: Objective | str,
        old_logprobs: OldLogprobs | str,
        advantage: AdvantageNorm | str,
        level: ISLevel | str,
        aggregation: LossAggregation | str,
        low: float,
        high: float,
        cap: float,
        eps_low: float,
        eps_high: float,
        num_candidates: int,
        support_slots: int,
        replay_support: bool,
        routing_replay: bool,
        kl_coef: float,
        kl_estimator: KLEstimator | str,
        entropy_coef: float,
    ) -> Correction:
        """Check the knobs against the mode's row and each other; ValueError names the keys to change.

        The keyword arguments are the fields of the config's ``correction`` group, one for one.
        """
        _require(0 < low <= 1 <= high, f"correction.low={low}, correction.high={high}: need 0 < low <= 1 <= high")
        _require(cap >= 1, f"correction.cap={cap}: the TIS cap must be >= 1")
        v = variant(mode, low=low, high=high, cap=cap)
        objective = parse_enum(Objective, objective, "correction.objective")
        level = parse_enum(ISLevel, level, "correction.level")
        old_logprobs = parse_enum(OldLogprobs, old_logprobs, "correction.old_logprobs")
        _require(
            objective in v.objectives,
            f"correction.mode={v.mode.value} cannot be combined with correction.objective={objective.value} "
            "(score centering cannot be substituted into PPO clipping, docs/math.md §3.2); use "
            f"correction.objective={'|'.join(sorted(o.value for o in v.objectives))} or correction.mode="
            + _modes_with(lambda row: objective in row.objectives),
        )
        _require(
            level in v.levels,
            f"correction.level={level.value} cannot be combined with correction.mode={v.mode.value} (score "
            "centering pairs each token's weight with its own head terms, docs/math.md §3.2); use "
            "correction.level=token or correction.mode=" + _modes_with(lambda row: level in row.levels),
        )
        _require(
            objective is Objective.ppo_clip or old_logprobs is OldLogprobs.trainer,
            f"correction.old_logprobs={old_logprobs.value} needs correction.objective=ppo_clip: REINFORCE has no "
            "pi_old (PPO against the sampler's log-probs is +experiment=ppo_bypass)",
        )
        for key, value in (("kl_coef", kl_coef), ("entropy_coef", entropy_coef)):
            _require(math.isfinite(value) and value >= 0, f"correction.{key}={value}: must be >= 0 (0 = off)")
        _require(0 < eps_low < 1 and eps_high > 0,
                 f"correction.eps_low={eps_low}, correction.eps_high={eps_high}: "
                 "need 0 < eps_low < 1 and eps_high > 0")
        _require(num_candidates >= 0 and support_slots >= 0,
                 f"correction.num_candidates={num_candidates}, correction.support_slots={support_slots}: "
                 "must be >= 0")
        _require(not v.centered or num_candidates >= 1,
                 f"correction.mode={v.mode.value} needs correction.num_candidates >= 1 (the sampler's top-K head)")
        return cls(
            variant=v,
            objective=objective,
            old_logprobs=old_logprobs,
            advantage=parse_enum(AdvantageNorm, advantage, "correction.advantage"),
            level=level,
            aggregation=parse_enum(LossAggregation, aggregation, "correction.aggregation"),
            eps_low=eps_low,
            eps_high=eps_high,
            head_size=num_candidates if v.centered else 0,
            support_slots=support_slots,
            replay_support=replay_support,
            routing_replay=routing_replay,
            kl_coef=kl_coef,
            kl_estimator=parse_enum(KLEstimator, kl_estimator, "correction.kl_estimator"),
            entropy_coef=entropy_coef,
        )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
