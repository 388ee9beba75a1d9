"""Off-policy correction math (docs/math.md §2–§6): pure tensor functions, no config, no I/O."""

from rlmix.correction.advantages import group_advantages
from rlmix.correction.centering import Centering, centering_coefficients
from rlmix.correction.diagnostics import (
    TokenMismatch,
    check_alignment,
    effective_sample_size,
    kl_k1,
    kl_k3,
    kl_k3_per_token,
    logprob_abs_diff,
    masked_frac,
    multiplicative_error,
    ratio_tail_frac,
    token_mismatch,
)
from rlmix.correction.logprobs import log_ratio
from rlmix.correction.loss import LossOutput, ppo_clip_loss, token_loss
from rlmix.correction.levels import aggregation_scale, level_log_ratio
from rlmix.correction.regularizers import KLEstimator, kl_estimate, token_entropy
from rlmix.correction.variant import AdvantageNorm, Correction, Variant, variant
from rlmix.correction.weights import (
    MODES,
    WEIGHTS,
    CorrectionMode,
    ISLevel,
    LossAggregation,
    ModeSpec,
    Objective,
    OldLogprobs,
    Weight,
    make_weight,
)

__all__ = [
    "MODES",
    "WEIGHTS",
    "AdvantageNorm",
    "Correction",
    "Variant",
    "variant",
    "Centering",
    "CorrectionMode",
    "ISLevel",
    "KLEstimator",
    "LossAggregation",
    "LossOutput",
    "ModeSpec",
    "Objective",
    "OldLogprobs",
    "TokenMismatch",
    "Weight",
    "centering_coefficients",
    "check_alignment",
    "effective_sample_size",
    "aggregation_scale",
    "group_advantages",
    "kl_k1",
    "kl_k3",
    "kl_k3_per_token",
    "kl_estimate",
    "token_entropy",
    "level_log_ratio",
    "log_ratio",
    "logprob_abs_diff",
    "make_weight",
    "masked_frac",
    "multiplicative_error",
    "ppo_clip_loss",
    "ratio_tail_frac",
    "token_loss",
    "token_mismatch",
]
