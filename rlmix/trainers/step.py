"""One optimizer step's forward/backward over micro-batches, shared by every trainer backend.

The backend supplies ``backward`` (``Tensor.backward`` for torch, ``engine.backward`` for
DeepSpeed); everything else — advantages, the global token count, micro-batching, the
aggregation of diagnostics — is written once here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from rlmix.config.schema import AdvantageNorm, CorrectionConfig
from rlmix.correction.advantages import group_advantages
from rlmix.rollout import Rollouts
from rlmix.trainers.loss import batch_loss


@dataclass
class StepResult:
    loss: float
    stats: dict[str, float]  # token-weighted means of the correction diagnostics
    token_stats: dict[str, torch.Tensor]  # (N,) per masked token, batch row-major
    entropy: float
    num_tokens: int


def advantages_for(batch: Rollouts, cfg: CorrectionConfig) -> torch.Tensor:
    """(B,) detached sequence advantages from the group rewards (corrections.md §5)."""
    return group_advantages(
        batch.rewards, batch.group_ids, normalize_std=cfg.advantage is AdvantageNorm.group_mean_std
    )


def micro_batches(batch: Rollouts, size: int) -> Iterator[tuple[Rollouts, slice]]:
    for start in range(0, len(batch), size):
        rows = slice(start, start + size)
        yield _rows(batch, rows), rows


def _rows(batch: Rollouts, rows: slice) -> Rollouts:
    def take(x):
        return None if x is None else x[rows]

    return batch.replace(
        prompt_ids=batch.prompt_ids[rows],
        prompt_lens=batch.prompt_lens[rows],
        completion_ids=batch.completion_ids[rows],
        mask=batch.mask[rows],
        sampler_logprobs=batch.sampler_logprobs[rows],
        policy_version=batch.policy_version[rows],
        pool=batch.pool[rows],
        finish_reason=batch.finish_reason[rows],
        head_ids=take(batch.head_ids),
        head_logprobs=take(batch.head_logprobs),
        support_ids=take(batch.support_ids),
        support_probs=take(batch.support_probs),
        task_ids=batch.task_ids[rows],
        group_ids=take(batch.group_ids),
        rewards=take(batch.rewards),
        format_ok=take(batch.format_ok),
        reward_errors=take(batch.reward_errors),
    )


def forward_backward(
    model: torch.nn.Module,
    batch: Rollouts,
    advantages: torch.Tensor,  # (B,)
    cfg: CorrectionConfig,
    *,
    pad_id: int,
    micro_batch_size: int,
    bf16: bool,
    num_tokens: int,
    backward: Callable[[torch.Tensor], None],
) -> StepResult:
    """Accumulate gradients of the token-mean loss over micro-batches of ``batch``.

    ``num_tokens`` is the GLOBAL masked-token count of the whole step (all micro-batches and,
    for several ranks, all ranks), so the sum of micro-batch losses is the token-mean over the
    step (corrections.md §3.2: "the global token count is passed in").
    """
    loss_sum, weighted, entropy_sum, n_total = 0.0, {}, 0.0, 0
    token_stats: dict[str, list[torch.Tensor]] = {}
    for micro, rows in micro_batches(batch, micro_batch_size):
        if not micro.mask.any():
            continue
        out = batch_loss(model, micro, advantages[rows], cfg, num_tokens, pad_id, bf16)
        backward(out.loss)
        n = out.num_tokens
        loss_sum += float(out.loss.detach())
        entropy_sum += float(out.entropy.sum())
        n_total += n
        for key, value in out.stats.items():
            weighted[key] = weighted.get(key, 0.0) + float(value) * n
        for key, value in out.token_stats.items():
            token_stats.setdefault(key, []).append(value.detach().cpu())
    denom = max(n_total, 1)
    return StepResult(
        loss=loss_sum,
        stats={key: value / denom for key, value in weighted.items()},
        token_stats={key: torch.cat(values) for key, values in token_stats.items()},
        entropy=entropy_sum / denom,
        num_tokens=n_total,
    )
