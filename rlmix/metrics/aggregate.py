"""Per-step metrics from a trained batch: overall, per pool and per staleness bucket.

The metric names are the stable ones of architecture.md ("Metric names"); W&B and
``metrics.jsonl`` use the same keys. This is the one place that prefixes and reduces them.
"""

from __future__ import annotations

import math

import torch

from rlmix.rollout import Rollouts

# Staleness buckets for ``mismatch/kl_k3/lag_<a>_<b>`` (inclusive; None = unbounded).
LAG_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, None))

# Correction-library stat name -> metric name.
STAT_NAMES = {
    "kl_k3": "mismatch/kl_k3",
    "kl_k1": "mismatch/kl_k1",
    "logprob_abs_diff": "mismatch/logprob_abs_diff",
    "ratio_tail_frac": "mismatch/ratio_tail_frac",
    "weight_mean": "correction/weight_mean",
    "masked_frac": "correction/masked_frac",
    "ess": "correction/ess",
    "sc_tail_ratio": "correction/sc_tail_ratio",
    "sc_head_mass": "correction/sc_head_mass",
    "sc_coef_l1": "correction/sc_coef_l1",
}


def lag_bucket_name(staleness: int) -> str:
    for low, high in LAG_BUCKETS:
        if staleness >= low and (high is None or staleness <= high):
            return f"lag_{low}_{'inf' if high is None else high}"
    raise ValueError(f"negative staleness {staleness}")


def reward_metrics(batch: Rollouts) -> dict[str, float]:
    """Reward, pass rate, format errors (overall and per pool) and response length."""
    rewards, format_ok = batch.rewards.float(), batch.format_ok
    out = {
        "reward/mean": float(rewards.mean()),
        "reward/pass_rate": float((rewards >= 1.0).float().mean()),
        "format/error_rate": float((~format_ok).float().mean()),
        "train/response_len": float(batch.mask.sum(1).float().mean()),
    }
    if batch.reward_errors is not None:
        out["reward/errors"] = float(batch.reward_errors.sum())
    pools = batch.pool
    for pool in sorted(set(pools)):
        rows = torch.tensor([p == pool for p in pools])
        out[f"format/error_rate/{pool}"] = float((~format_ok[rows]).float().mean())
    return out


def mismatch_metrics(
    batch: Rollouts, token_stats: dict[str, torch.Tensor], trainer_version: int
) -> dict[str, float]:
    """Sampler–trainer KL by pool and by staleness bucket, and staleness itself.

    ``token_stats`` holds per-token values (N,) for the batch's masked tokens in row-major
    order, so repeating each row's pool/staleness by its token count lines them up.
    """
    staleness = trainer_version - batch.policy_version  # (B,)
    counts = batch.mask.sum(1)  # (B,)
    out = {
        "staleness/mean": float(staleness.float().mean()),
        "staleness/max": float(staleness.max()),
        "policy_version/min": float(batch.policy_version.min()),
        "policy_version/max": float(batch.policy_version.max()),
    }
    k3 = token_stats.get("kl_k3")
    log_ratio = token_stats.get("log_ratio")
    if log_ratio is not None and log_ratio.numel():
        out["mismatch/mult_error"] = math.exp(float(log_ratio.abs().mean()))
    weights = token_stats.get("weight")
    if weights is not None and weights.numel():
        out["correction/ess"] = float(weights.sum() ** 2 / (weights.numel() * (weights**2).sum()).clamp_min(1e-30))
    if k3 is None or not k3.numel():
        return out
    out.update(_mean_by_label(k3, batch.pool, counts, "mismatch/kl_k3/"))
    lags = [lag_bucket_name(int(s)) for s in staleness]
    out.update(_mean_by_label(k3, lags, counts, "mismatch/kl_k3/"))
    return out


def _mean_by_label(values: torch.Tensor, row_labels, counts: torch.Tensor, prefix: str) -> dict[str, float]:
    """Mean of per-token ``values`` (N,) grouped by a label per row, rows holding ``counts`` tokens."""
    names = sorted(set(row_labels))
    index = {name: i for i, name in enumerate(names)}
    token_label = torch.tensor([index[x] for x in row_labels]).repeat_interleave(counts)  # (N,)
    sums = torch.zeros(len(names)).index_add_(0, token_label, values.float())
    n = torch.zeros(len(names)).index_add_(0, token_label, torch.ones_like(values, dtype=torch.float))
    return {f"{prefix}{name}": float(sums[i] / n[i]) for i, name in enumerate(names) if n[i] > 0}


def correction_metrics(stats: dict[str, float]) -> dict[str, float]:
    return {STAT_NAMES[key]: value for key, value in stats.items() if key in STAT_NAMES}
