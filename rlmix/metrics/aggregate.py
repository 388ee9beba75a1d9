"""Per-step metrics from a trained batch: overall, per pool and per staleness bucket.

The names are the constants of ``rlmix.metrics.names`` (docs/architecture.md, "Metric names");
W&B and ``metrics.jsonl`` use the same keys. This is the one place that prefixes and reduces them,
for every trainer backend, and no two sources may write the same key (``merge_metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmix.correction import check_alignment, effective_sample_size, multiplicative_error
from rlmix.correction.advantages import uniform_groups
from rlmix.metrics import names as m
from rlmix.metrics.names import STAT_NAMES
from rlmix.metrics.where import where_metrics
from rlmix.rollout import END_REASONS, EPISODE_STATS, Rollouts


@dataclass
class StepResult:
    """One optimizer step's forward/backward, reduced over its micro-batches (and ranks)."""

    loss: float
    stats: dict[str, float]  # token-weighted means of the correction diagnostics
    token_stats: dict[str, torch.Tensor]  # (N,) per masked token, batch row-major
    entropy: float
    num_tokens: int
    positions: int = 0  # positions the forwards ran on (rows × width, summed over micro-batches)
    sequence_tokens: int = 0  # of those, real prompt and completion tokens

    @property
    def padding_frac(self) -> float:
        return 1.0 - self.sequence_tokens / self.positions if self.positions else 0.0

# Staleness buckets for ``mismatch/kl_k3/lag_<a>_<b>`` (inclusive; None = unbounded).
LAG_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, None))

def lag_bucket_name(staleness: int) -> str:
    for low, high in LAG_BUCKETS:
        if staleness >= low and (high is None or staleness <= high):
            return f"lag_{low}_{'inf' if high is None else high}"
    raise ValueError(f"negative staleness {staleness}")


def _format_error_rate(batch: Rollouts, rows: torch.Tensor) -> float:
    """Rows with a format error; for episodes, malformed actions / actions (names.py, agent/)."""
    if batch.episode_stats is None:
        return float((~batch.format_ok[rows]).float().mean())
    stats = batch.episode_stats[rows]
    actions = stats[:, EPISODE_STATS.index("actions")].sum()
    return float(stats[:, EPISODE_STATS.index("format_errors")].sum() / actions.clamp(min=1.0))


def uniform_groups_frac(group_ids: torch.Tensor, rewards: torch.Tensor) -> float:
    """Share of the groups (rows sharing a ``group_ids`` value) whose rewards are all equal."""
    labels, group = torch.unique(group_ids, return_inverse=True)
    return float(uniform_groups(rewards, group, len(labels)).float().mean())


def reward_metrics(batch: Rollouts) -> dict[str, float]:
    """Reward, pass rate, format errors (overall and per pool), response length, uniform groups."""
    rewards = batch.rewards.float()
    everything = torch.ones(len(batch), dtype=torch.bool)
    out = {
        m.REWARD_KEY: float(rewards.mean()),
        m.PASS_RATE: float((rewards >= 1.0).float().mean()),
        m.FORMAT_KEY: _format_error_rate(batch, everything),
        m.RESPONSE_LEN: float(batch.mask.sum(1).float().mean()),
    }
    if batch.group_ids is not None and len(batch):
        out[m.UNIFORM_GROUPS_FRAC] = uniform_groups_frac(batch.group_ids, rewards)
    if batch.reward_errors is not None:
        out[m.REWARD_ERRORS] = float(batch.reward_errors.sum())
    if batch.exploit_suspected is not None:
        out[m.EXPLOIT_SUSPECTED] = float(batch.exploit_suspected.sum())
    pools = batch.pool
    for pool in sorted(set(pools)):
        rows = torch.tensor([p == pool for p in pools])
        out[f"{m.FORMAT_KEY}/{pool}"] = _format_error_rate(batch, rows)
    return out


def _agent_block(stats: torch.Tensor, suffix: str) -> dict[str, float]:
    """The agent/ metrics of the episodes ``stats`` (E, len(EPISODE_STATS)); ``suffix`` "" or "/<pool>"."""
    col = {name: stats[:, i] for i, name in enumerate(EPISODE_STATS)}
    out = {
        m.TURNS_MEAN + suffix: float(col["actions"].mean()),
        m.TOOL_CALLS_MEAN + suffix: float(col["tool_calls"].mean()),
        m.EPISODE_TOKENS_MEAN + suffix: float(col["episode_tokens"].mean()),
        m.POLICY_TOKEN_FRAC + suffix: float(col["policy_tokens"].sum() / col["episode_tokens"].sum().clamp(min=1.0)),
        m.ENV_TIME_FRAC + suffix: float(col["env_s"].sum() / col["wall_s"].sum().clamp(min=1e-9)),
    }
    for i, reason in enumerate(END_REASONS):
        out[f"{m.END_REASON}/{reason}{suffix}"] = float((col["end_reason"] == i).float().mean())
    return out


def agent_metrics(batch: Rollouts) -> dict[str, float]:
    """Episode shape and cost (names.py, agent/), overall and per pool; empty for single-turn batches."""
    if batch.episode_stats is None:
        return {}
    out = _agent_block(batch.episode_stats, "") | {m.INFRA_ERRORS: float(batch.infra_errors)}
    for pool in sorted(set(batch.pool)):
        rows = torch.tensor([p == pool for p in batch.pool])
        out |= _agent_block(batch.episode_stats[rows], f"/{pool}")
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
        m.STALENESS_MEAN: float(staleness.float().mean()),
        m.STALENESS_MAX: float(staleness.max()),
        m.POLICY_VERSION_MIN: float(batch.policy_version.min()),
        m.POLICY_VERSION_MAX: float(batch.policy_version.max()),
    }
    k3 = token_stats.get("kl_k3")
    log_ratio = token_stats.get("log_ratio")
    if log_ratio is not None and log_ratio.numel():
        out[m.MULT_ERROR] = float(multiplicative_error(log_ratio))
    weights = token_stats.get("weight")
    if weights is not None and weights.numel():  # over the whole step, not a mean of micro-batch ESS
        out[m.ESS] = float(effective_sample_size(weights))
    out.update(_router_flips(batch, token_stats.get("router_flip"), counts))
    if k3 is None or not k3.numel():
        return out
    out.update(_mean_by_label(k3, batch.pool, counts, f"{m.KL_KEY}/"))
    lags = [lag_bucket_name(int(s)) for s in staleness]
    out.update(_mean_by_label(k3, lags, counts, f"{m.KL_KEY}/"))
    return out


def alignment_metrics(batch: Rollouts) -> dict[str, float]:
    """``correction/alignment_error`` over the batch's tokens (docs/math.md §3.3); empty when the
    samplers recorded neither a head nor a support.

    A token of a truncating pool (a support recorded) is checked against its support: its recorded
    log q is the truncated one, which the full-softmax head differs from by log S.
    """
    if batch.head_ids is None and batch.support_ids is None:
        return {}
    sampled, recorded = batch.completion_ids[batch.mask], batch.sampler_logprobs[batch.mask]
    truncated = torch.zeros_like(sampled, dtype=torch.bool)
    error = torch.zeros(())
    if batch.support_ids is not None:
        support = batch.support_ids[batch.mask]
        truncated = (support >= 0).any(dim=-1)
        error = check_alignment(sampled[truncated], recorded[truncated], support[truncated],
                                batch.support_probs[batch.mask][truncated].log())
    if batch.head_ids is not None:
        full = ~truncated
        error = torch.maximum(error, check_alignment(sampled[full], recorded[full], batch.head_ids[batch.mask][full],
                                                     batch.head_logprobs[batch.mask][full]))
    return {m.ALIGNMENT_ERROR: float(error)}


def _router_flips(batch: Rollouts, flips: torch.Tensor | None, counts: torch.Tensor) -> dict[str, float]:
    """``mismatch/router_flip`` overall and per pool, over the tokens whose sampler recorded its experts."""
    if flips is None or not flips.numel():
        return {}
    known = ~flips.isnan()
    if not bool(known.any()):
        return {}
    labels = [p for p in batch.pool]
    per_pool = _mean_by_label(torch.where(known, flips, 0.0), labels, counts, f"{m.ROUTER_FLIP}/")
    recorded = _mean_by_label(known.float(), labels, counts, "")
    out = {m.ROUTER_FLIP: float(flips[known].mean())}
    for pool, share in recorded.items():  # the mean over a pool's recorded tokens only
        if share > 0:
            out[f"{m.ROUTER_FLIP}/{pool}"] = per_pool[f"{m.ROUTER_FLIP}/{pool}"] / share
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


def merge_metrics(*parts: dict[str, float]) -> dict[str, float]:
    """One dict from several sources; a key written twice is a bug, not a silent overwrite."""
    out: dict[str, float] = {}
    for part in parts:
        clash = out.keys() & part.keys()
        if clash:
            raise ValueError(f"metric names written twice: {sorted(clash)}")
        out |= part
    return out


def step_metrics(batch: Rollouts, result: StepResult, grad_norm: float, version: int) -> dict[str, float]:
    """Every per-step metric a trainer reports, from the batch and its forward/backward."""
    train = {
        m.LOSS: result.loss,
        m.GRAD_NORM_KEY: grad_norm,
        m.ENTROPY: result.entropy,
        m.TOKENS: float(result.num_tokens),
        m.PADDING_FRAC: result.padding_frac,
    }
    return merge_metrics(
        train,
        reward_metrics(batch),
        agent_metrics(batch),
        correction_metrics(result.stats),
        mismatch_metrics(batch, result.token_stats, version),
        alignment_metrics(batch),
        where_metrics(batch, result.token_stats),
    )
