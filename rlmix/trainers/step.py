"""One optimizer step's forward/backward over micro-batches, shared by every trainer backend.

The backend supplies ``backward`` (``Tensor.backward`` for torch, ``engine.backward`` for
DeepSpeed); everything else — advantages, the global token count, micro-batching, the
aggregation of diagnostics — is written once here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from rlmix.config.schema import AdvantageNorm, CorrectionConfig
from rlmix.correction.advantages import group_advantages
from rlmix.metrics.aggregate import StepResult
from rlmix.rollout import Rollouts
from rlmix.trainers.loss import batch_loss


def advantages_for(batch: Rollouts, cfg: CorrectionConfig) -> torch.Tensor:
    """(B,) detached sequence advantages from the group rewards (docs/math.md §5)."""
    return group_advantages(
        batch.rewards, batch.group_ids, normalize_std=cfg.advantage is AdvantageNorm.group_mean_std
    )


def micro_batches(batch: Rollouts, size: int) -> Iterator[tuple[Rollouts, slice]]:
    for start in range(0, len(batch), size):
        rows = slice(start, start + size)
        yield batch.rows(rows), rows


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
    step (docs/math.md §3.2: "the global token count is passed in").
    """
    loss_sum, weighted, entropy_sum, n_total = 0.0, {}, 0.0, 0
    token_stats: dict[str, list[torch.Tensor]] = {}
    for micro, rows in micro_batches(batch, micro_batch_size):
        if not micro.mask.any():
            continue
        out = batch_loss(model, micro, advantages[rows], cfg, num_tokens=num_tokens, pad_id=pad_id, bf16=bf16)
        backward(out.loss)
        entropy = out.token_stats.pop("entropy")  # (n,)
        n = entropy.numel()
        loss_sum += float(out.loss.detach())
        entropy_sum += float(entropy.sum())
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
