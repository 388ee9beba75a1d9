"""A rollout batch as the loss sees it: its generated tokens flattened, with the trainer's logits.

``token_batch`` is the one place the trainer's view of a batch is computed — the loss
(``rlmix.trainers.loss``) and the mismatch probe (``rlmix.eval.probe``) both read it, so what the
probe measures is exactly what training corrects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlmix.correction.logprobs import Candidates, head_candidates, support_candidates
from rlmix.rollout import Rollouts, sequence_input_ids


@dataclass(frozen=True)
class TokenBatch:
    """The N generated tokens of a batch (``mask`` true), row-major.

    logits: (N, V) fp32 trainer logits divided by the sampling temperature (docs/math.md §3.3).
    head_*: (N, K) the sampler's top-K head, or None. support_*: (N, S) the recorded sampling
    support, or None when the run does not replay it (docs/math.md §4).
    """

    logits: Tensor
    sampled_ids: Tensor  # (N,) int64
    sampler_logprobs: Tensor  # (N,) log q(a)
    head_ids: Tensor | None
    head_logprobs: Tensor | None
    support_ids: Tensor | None
    support_probs: Tensor | None

    @property
    def num_tokens(self) -> int:
        return self.logits.shape[0]

    def candidates(self) -> Candidates:
        """What score centering sums over: the replayed support (§4), else the top-K head (§3.2)."""
        if self.support_ids is not None:
            return support_candidates(self.support_ids, self.support_probs, torch.float32)
        return head_candidates(self.head_ids, self.head_logprobs)


def masked_logits(model: torch.nn.Module, batch: Rollouts, pad_id: int, bf16: bool) -> Tensor:
    """Trainer logits for the generated tokens, (N, V) fp32, divided by the sampling temperature."""
    input_ids, target_pos = sequence_input_ids(batch, pad_id)
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=input_ids).logits  # (B, L, V)
    V = logits.shape[-1]
    picked = logits.gather(1, target_pos[..., None].expand(-1, -1, V))  # (B, T, V)
    return picked[batch.mask].float() / batch.temperature  # (N, V)


def token_batch(model: torch.nn.Module, batch: Rollouts, *, pad_id: int, bf16: bool, replay_support: bool) -> TokenBatch:
    """``batch``'s generated tokens with the trainer's logits (differentiable when grad is on)."""
    mask = batch.mask

    def per_token(x: Tensor | None) -> Tensor | None:
        return None if x is None else x[mask]

    return TokenBatch(
        logits=masked_logits(model, batch, pad_id, bf16),
        sampled_ids=batch.completion_ids[mask],
        sampler_logprobs=batch.sampler_logprobs[mask],
        head_ids=per_token(batch.head_ids),
        head_logprobs=per_token(batch.head_logprobs),
        support_ids=per_token(batch.support_ids) if replay_support else None,
        support_probs=per_token(batch.support_probs) if replay_support else None,
    )
