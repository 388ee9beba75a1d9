"""A rollout batch's optimizer steps and each step's forward/backward, shared by every trainer backend.

The backend supplies ``backward`` (``Tensor.backward`` for torch, ``engine.backward`` for
DeepSpeed) and how one optimizer step is applied; everything else — advantages, PPO's π_old,
mini-batches and epochs, the global token and sequence counts, micro-batching, the aggregation
of diagnostics — is written once here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import torch

from rlmix.config.schema import TrainerConfig
from rlmix.correction import AdvantageNorm, Correction, Objective, OldLogprobs
from rlmix.correction.advantages import group_advantages
from rlmix.correction.diagnostics import effective_sample_size
from rlmix.correction.logprobs import gather_logprobs, support_candidates
from rlmix.metrics.aggregate import StepResult, step_metrics
from rlmix.metrics.names import LR, OPTIMIZER_STEPS, SKIPPED_STEPS
from rlmix.rollout import Rollouts
from rlmix.trainers.loss import batch_loss
from rlmix.trainers.tokens import token_batch


def advantages_for(batch: Rollouts, cfg: Correction) -> torch.Tensor:
    """(B,) detached sequence advantages from the group rewards (docs/math.md §5)."""
    return group_advantages(
        batch.rewards, batch.group_ids, normalize_std=cfg.advantage is AdvantageNorm.group_mean_std
    )


def optimizer_step_rows(batch: Rollouts, cfg: TrainerConfig) -> list[torch.Tensor]:
    """Row indices of each optimizer step on ``batch``, in order: ``ppo_epochs`` passes over
    mini-batches of ``ppo_mini_batch_size`` whole groups (in the order groups first appear; the
    last may hold fewer). ``ppo_mini_batch_size`` null: the whole batch is one mini-batch."""
    rows = torch.arange(len(batch))
    if cfg.ppo_mini_batch_size is None or batch.group_ids is None:
        passes = [rows]
    else:
        labels = batch.group_ids.cpu()
        groups = list(dict.fromkeys(labels.tolist()))
        size = cfg.ppo_mini_batch_size
        passes = [rows[torch.isin(labels, torch.tensor(groups[i:i + size]))] for i in range(0, len(groups), size)]
    return passes * cfg.ppo_epochs


def needs_trainer_logprobs(passes: list[torch.Tensor], correction: Correction) -> bool:
    """Whether PPO's π_old must be recorded before the first update: the trainer's own log-probs
    with more than one optimizer step (``passes``) on the batch (with one, the step's own forward
    is π_old)."""
    ppo_on_trainer = correction.objective is Objective.ppo_clip and correction.old_logprobs is OldLogprobs.trainer
    return ppo_on_trainer and len(passes) > 1


@torch.no_grad()
def trainer_logprobs(
    model: torch.nn.Module,
    batch: Rollouts,
    cfg: Correction,
    *,
    pad_id: int,
    micro_batch_size: int,
    max_tokens: int | None,
    autocast: torch.dtype | None,
) -> torch.Tensor:
    """(B, T) float32 log p(a) of every generated token at the current weights (0 elsewhere),
    renormalised over the recorded support as the loss does (docs/math.md §4): PPO's π_old."""
    out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
    for rows in plan_micro_batches(batch, micro_batch_size, max_tokens):
        micro = micro_batch(batch, rows)
        if not micro.mask.any():
            continue
        tokens = token_batch(model, micro, pad_id=pad_id, autocast=autocast, replay_support=cfg.replay_support,
                             columns_for=False, replay_routes=cfg.routing_replay)
        candidates = None
        if tokens.support_ids is not None:
            candidates = support_candidates(tokens.support_ids, tokens.support_probs, torch.float32)
        logp_a, _ = gather_logprobs(tokens.logits, tokens.sampled_ids, candidates)
        width = micro.mask.shape[1]
        block = torch.zeros(micro.mask.shape, dtype=torch.float32, device=out.device)
        block[micro.mask] = logp_a.float().to(out.device)
        out[rows.to(out.device), :width] = block
    return out


def checkpoint_activations(model: torch.nn.Module, on: bool) -> None:
    """``trainer.activation_checkpointing``: keep only each decoder layer's input in the forward
    and recompute the layer in the backward (HF ``gradient_checkpointing_enable``, non-reentrant):
    activation memory for a second forward, the same gradients."""
    if not on:
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        from rlmix.errors import ConfigError

        raise ConfigError(f"trainer.activation_checkpointing=true: {type(model).__name__} does not support "
                          "gradient checkpointing; set it to false")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # a KV cache under checkpointing is recomputed for nothing (and HF warns)


def reference_model(model_dir, cfg: Correction, device: torch.device | str,
                    dtype: torch.dtype = torch.float32) -> torch.nn.Module | None:
    """The frozen reference of the KL term: the start weights on ``device``, in the ``dtype`` of
    the trainer's own module (so that before the first update the two agree exactly), or None
    when ``cfg.kl_coef`` is 0: no copy is built. Built from the run's model dir, so a resumed
    run's reference is still its start, not the checkpoint."""
    if cfg.kl_coef == 0:
        return None
    from rlmix.models.io import load_causal_lm

    return load_causal_lm(model_dir, dtype=dtype).to(device).requires_grad_(False)


def with_ref_logprobs(reference: torch.nn.Module | None, batch: Rollouts, cfg: Correction,
                      **micro) -> Rollouts:
    """``batch`` with ``ref_logprobs`` (B, T): log π_ref(a) of every generated token under
    ``reference`` (on its own device; renormalised over the recorded support as the loss does)."""
    if reference is None:
        return batch
    import contextlib

    device = next(reference.parameters()).device
    # index tensors are made on the default device: the reference's (on the CPU skip the device
    # mode, it intercepts every torch call)
    with torch.device(device) if device.type != "cpu" else contextlib.nullcontext():
        ref = trainer_logprobs(reference, batch.to(device), cfg, **micro)
    return batch.replace(ref_logprobs=ref.to(batch.mask.device))


def count_sequences(batch: Rollouts) -> int:
    """Rows with at least one generated token: what a per-sequence loss aggregation divides by."""
    return int(batch.mask.any(dim=1).sum())


def merge_step_results(results: list[StepResult], order: list[torch.Tensor] | None = None) -> StepResult:
    """Several forward/backwards (ranks, or mini-batches) as one: token-weighted means, summed
    counts, per-token values concatenated — put back in the batch's row-major order when
    ``order`` gives each result's token positions in it."""
    n = sum(r.num_tokens for r in results)
    denom = max(n, 1)
    keys = sorted({k for r in results for k in r.stats})
    token_keys = sorted({k for r in results for k in r.token_stats})
    per_token = {k: [r.token_stats[k] for r in results if k in r.token_stats] for k in token_keys}
    if order is not None:
        token_stats = {k: _row_major(v, order) for k, v in per_token.items()}
    else:
        token_stats = {k: torch.cat(v) for k, v in per_token.items()}
    return StepResult(
        loss=sum(r.loss for r in results),
        stats=step_stats({k: sum(r.stats.get(k, 0.0) * r.num_tokens for r in results) / denom for k in keys},
                         token_stats),
        token_stats=token_stats,
        entropy=sum(r.entropy * r.num_tokens for r in results) / denom,
        num_tokens=n,
        positions=sum(r.positions for r in results),
        sequence_tokens=sum(r.sequence_tokens for r in results),
    )


def mean_grad_norm(norms: list[float]) -> float:
    """The batch's gradient norm: its one step's, or the mean over its optimizer steps (NaN if any is)."""
    return norms[0] if len(norms) == 1 else sum(norms) / len(norms)


def batch_result(batch: Rollouts, passes: list[torch.Tensor], results: list[StepResult]) -> StepResult:
    """The batch's diagnostics from its optimizer steps' results (``passes``: each step's rows).

    The mismatch diagnostics are per token of the batch, so they come from the first epoch
    (one result per row); PPO's ratio quantiles and clip fraction cover every step.
    """
    seen: set[int] = set()
    first, order = [], []
    mask = batch.mask.cpu()
    token_index = torch.full(mask.shape, -1, dtype=torch.long)
    token_index[mask] = torch.arange(int(mask.sum()))
    for rows, result in zip(passes, results):
        if rows[0].item() in seen:
            break
        seen.update(rows.tolist())
        first.append(result)
        order.append(token_index[rows][mask[rows]])
    merged = merge_step_results(first, order) if len(results) > 1 else results[0]
    ratios = [r.token_stats["ppo_ratio"] for r in results if "ppo_ratio" in r.token_stats]
    if not ratios:
        return merged
    tokens = max(sum(r.num_tokens for r in results), 1)
    clip_frac = sum(r.stats.get("clip_frac", 0.0) * r.num_tokens for r in results) / tokens  # token-weighted
    ratio = torch.cat(ratios).double()
    q = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)) if ratio.numel() else torch.zeros(3)
    ppo = {"clip_frac": clip_frac, "ratio_p05": float(q[0]), "ratio_p50": float(q[1]),
           "ratio_p95": float(q[2]), "ratio_max": float(ratio.max()) if ratio.numel() else 0.0}
    return dataclasses.replace(merged, stats=merged.stats | ppo)


def batch_metrics(batch: Rollouts, passes: list[torch.Tensor], results: list[StepResult], grad_norms: list[float],
                  version: int, skipped_steps: int, lr: float) -> dict[str, float]:
    """Every metric of one rollout batch's optimizer steps (``passes``, with their results and norms)."""
    metrics = step_metrics(batch, batch_result(batch, passes, results), mean_grad_norm(grad_norms), version)
    metrics[SKIPPED_STEPS] = float(skipped_steps)
    metrics[OPTIMIZER_STEPS] = float(len(passes))
    metrics[LR] = lr
    return metrics


def micro_batches(batch: Rollouts, size: int) -> Iterator[tuple[Rollouts, slice]]:
    """Contiguous blocks of ``size`` rows (how DeepSpeed shards a batch over ranks)."""
    for start in range(0, len(batch), size):
        rows = slice(start, start + size)
        yield batch.rows(rows), rows


def completion_lengths(mask: torch.Tensor) -> torch.Tensor:
    """(B,) one past each row's last generated token (0 for a row without one)."""
    last = mask.shape[1] - mask.flip(1).int().argmax(dim=1)
    return torch.where(mask.any(dim=1), last, 0)


def sequence_lengths(batch: Rollouts) -> torch.Tensor:
    """(B,) positions each row's forward needs: its prompt and its completion up to the last generated token."""
    return batch.prompt_lens + completion_lengths(batch.mask)


# A forward/backward's fixed cost (launches, per-call overhead), in positions, as a share of a
# full micro-batch: the planner trades one more micro-batch for this much less padding.
MICRO_BATCH_OVERHEAD = 0.05


def plan_micro_batches(batch: Rollouts, max_rows: int, max_tokens: int | None) -> list[torch.Tensor]:
    """Row indices of each micro-batch: at most ``max_rows`` rows and ``max_tokens`` padded positions.

    Without a token budget: contiguous blocks of ``max_rows`` rows. With one, rows are sorted
    longest first and cut into runs that minimise the forward's cost, Σ rows × (longest prompt +
    longest completion: the width its forward runs on) +
    ``MICRO_BATCH_OVERHEAD`` × ``max_tokens`` per micro-batch (an exact dynamic programme over the
    cuts), so long and short rows never share a micro-batch and padding stays small. A row
    longer than the budget gets a micro-batch of its own. The loss is a token mean over the
    GLOBAL count, so the grouping changes the work, never the update.
    """
    # Index tensors stay on the CPU whatever the batch's device (DeepSpeed sets a default device).
    if max_tokens is None:
        return [torch.arange(s, min(s + max_rows, len(batch)), device="cpu") for s in range(0, len(batch), max_rows)]
    order = torch.argsort(sequence_lengths(batch).cpu(), descending=True, stable=True)
    prompts = batch.prompt_lens.cpu()[order].tolist()
    completions = completion_lengths(batch.mask).cpu()[order].tolist()
    n, overhead = len(order), MICRO_BATCH_OVERHEAD * max_tokens
    cost, cut = [0.0] * (n + 1), [n] * (n + 1)  # cost[i]: best cost of rows i.., first run i..cut[i]
    for i in range(n - 1, -1, -1):
        cost[i] = float("inf")
        end, longest_prompt, longest_completion = i + 1, prompts[i], completions[i]
        while end <= n and end - i <= max_rows:
            # rows i..end-1 in one micro-batch: its forward runs on the longest prompt plus the longest
            # completion, which may belong to two rows (sequence_input_ids)
            longest_prompt = max(longest_prompt, prompts[end - 1])
            longest_completion = max(longest_completion, completions[end - 1])
            positions = (end - i) * (longest_prompt + longest_completion)
            if positions > max_tokens and end > i + 1:
                break
            run = overhead + positions + cost[end]
            if run < cost[i]:
                cost[i], cut[i] = run, end
            end += 1
    plan, i = [], 0
    while i < n:
        plan.append(order[i : cut[i]])
        i = cut[i]
    return plan


def plan_positions(batch: Rollouts, plan: list[torch.Tensor]) -> tuple[int, int]:
    """(positions the forwards of ``plan`` run on, real tokens among them); padding is the rest.

    A micro-batch without generated tokens runs no forward and counts for neither.
    """
    lengths, generated = sequence_lengths(batch).cpu(), batch.mask.any(dim=1).cpu()
    prompts, completions = batch.prompt_lens.cpu(), completion_lengths(batch.mask).cpu()
    positions = real = 0
    for rows in plan:
        if bool(generated[rows].any()):  # the forward's width: longest prompt + longest completion
            positions += len(rows) * int(prompts[rows].max() + completions[rows].max())
            real += int(lengths[rows].sum())
    return positions, real


def micro_batch(batch: Rollouts, rows: torch.Tensor) -> Rollouts:
    """The rows ``rows`` of ``batch``, trimmed to their longest prompt and completion."""
    micro = batch.rows(rows)
    width = int(completion_lengths(micro.mask).max()) if len(micro) else 0
    prompt_width = max(int(micro.prompt_lens.max()) if len(micro) else 0, 1)
    T = micro.mask.shape[1]
    trimmed = {
        f.name: value[:, :width]
        for f in dataclasses.fields(micro)
        if isinstance(value := getattr(micro, f.name), torch.Tensor) and value.dim() >= 2 and value.shape[1] == T
        and f.name != "prompt_ids"
    }
    return micro.replace(prompt_ids=micro.prompt_ids[:, :prompt_width], **trimmed)


def forward_backward(
    model: torch.nn.Module,
    batch: Rollouts,
    advantages: torch.Tensor,  # (B,)
    cfg: Correction,
    *,
    pad_id: int,
    micro_batch_size: int,
    autocast: torch.dtype | None,
    num_tokens: int,
    backward: Callable[[torch.Tensor], None],
    max_tokens: int | None = None,
    num_sequences: int | None = None,
) -> StepResult:
    """Accumulate gradients of the token-mean loss over micro-batches of ``batch``.

    ``num_tokens`` is the GLOBAL masked-token count of the whole step (all micro-batches and,
    for several ranks, all ranks), so the sum of micro-batch losses is the token-mean over the
    step (docs/math.md §3.2: "the global token count is passed in") whatever the micro-batches
    are; ``num_sequences`` likewise for the per-sequence aggregations (None: ``batch``'s own).
    ``max_tokens`` packs rows into micro-batches by a budget of padded positions
    (``plan_micro_batches``); per-token values come back in the batch's row-major order.
    """
    loss_sum, weighted, entropy_sum, n_total = 0.0, {}, 0.0, 0
    # Where each generated token sits in the batch's row-major order, to undo the packing's reordering.
    mask = batch.mask.cpu()
    token_index = torch.full(mask.shape, -1, dtype=torch.long, device="cpu")
    token_index[mask] = torch.arange(int(mask.sum()), device="cpu")
    token_stats: dict[str, list[torch.Tensor]] = {}
    order: list[torch.Tensor] = []
    plan = plan_micro_batches(batch, micro_batch_size, max_tokens)
    sequences = count_sequences(batch) if num_sequences is None else num_sequences
    for rows in plan:
        micro = micro_batch(batch, rows)
        if not micro.mask.any():
            continue
        out = batch_loss(model, micro, advantages[rows.to(advantages.device)], cfg,
                         num_tokens=num_tokens, num_sequences=sequences, pad_id=pad_id, autocast=autocast)
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
        order.append(token_index[rows][mask[rows]])
    denom = max(n_total, 1)
    positions, sequence_tokens = plan_positions(batch, plan)
    per_token = {key: _row_major(values, order) for key, values in token_stats.items()}
    return StepResult(
        loss=loss_sum,
        stats=step_stats({key: value / denom for key, value in weighted.items()}, per_token),
        token_stats=per_token,
        entropy=entropy_sum / denom,
        num_tokens=n_total,
        positions=positions,
        sequence_tokens=sequence_tokens,
    )


def step_stats(token_means: dict[str, float], token_stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """The step's diagnostics: token means stay, the effective sample size is recomputed.

    ESS = (Σw)² / (n Σw²) is not a token mean, so averaging it over micro-batches would make it
    depend on how rows were grouped; it is taken over the step's weights instead.
    """
    if "ess" in token_means and "weight" in token_stats:
        token_means = token_means | {"ess": float(effective_sample_size(token_stats["weight"].double()))}
    return token_means


def _row_major(values: list[torch.Tensor], order: list[torch.Tensor]) -> torch.Tensor:
    """Per-token values of the micro-batches put back in the batch's row-major token order."""
    flat, index = torch.cat(values), torch.cat(order)
    out = torch.empty_like(flat)
    out[index] = flat
    return out
