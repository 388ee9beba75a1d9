"""A rollout batch as the loss sees it: its generated tokens flattened, with the trainer's logits.

``token_batch`` is the one place the trainer's view of a batch is computed — the loss
(``rlmix.trainers.loss``) and the mismatch probe (``rlmix.eval.probe``) both read it, so what the
probe measures is exactly what training corrects. The probe asks for dense (N, V) logits (its
exact KLs need whole distributions); the loss asks for the columns it reads (``columns_for``),
which the chunked lm-head pass computes without an (N, V) tensor (``rlmix.trainers.lm_head``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmix.correction.logprobs import Candidates, GatheredLogits, head_candidates, loss_columns, support_candidates
from rlmix.rollout import Rollouts, sequence_input_ids
from rlmix.trainers import lm_head
from rlmix.trainers.precision import autocast_context
from rlmix.trainers.routing import routing


@dataclass(frozen=True)
class TokenBatch:
    """The N generated tokens of a batch (``mask`` true), row-major.

    logits: (N, V) fp32 trainer logits divided by the sampling temperature (docs/math.md §3.3), or
    the same logits as the `GatheredLogits` a loss reads (its columns and the log-normaliser).
    head_*: (N, K) the sampler's top-K head, or None. support_*: (N, S) the recorded sampling
    support, or None when the run does not replay it (docs/math.md §4).
    entropy: (N,) detached entropy of the trainer's distribution, when the loss asked for it.
    old_logprobs: (N,) PPO's π_old when the trainer recorded it before the batch's first update
    (``Rollouts.trainer_logprobs``), else None. sequence_ids: (N,) each token's row in the batch.
    ref_logprobs: (N,) log π_ref(a) under the frozen reference when the KL term is on, else None.
    router_flip: (N,) for a mixture-of-experts model, the share of its sparse layers whose top-k
    experts at the position predicting the token differ from the sampler's (NaN: none recorded);
    None for a dense model (``rlmix.trainers.routing``).
    logit_grad_norm: (N,) fp32, filled by the backward: ‖∂loss/∂ℓ_t‖ over the token's logits ℓ_t
    (before the temperature), whichever path computed them; NaN until then; None without grad.
    """

    logits: Tensor | GatheredLogits
    sampled_ids: Tensor  # (N,) int64
    sampler_logprobs: Tensor  # (N,) log q(a)
    head_ids: Tensor | None
    head_logprobs: Tensor | None
    support_ids: Tensor | None
    support_probs: Tensor | None
    entropy: Tensor | None = None
    old_logprobs: Tensor | None = None
    sequence_ids: Tensor | None = None
    ref_logprobs: Tensor | None = None
    router_flip: Tensor | None = None
    logit_grad_norm: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.sampled_ids.shape[0]

    def candidates(self) -> Candidates:
        """What score centering sums over: the replayed support (§4), else the top-K head (§3.2)."""
        if self.support_ids is not None:
            return support_candidates(self.support_ids, self.support_probs, torch.float32)
        return head_candidates(self.head_ids, self.head_logprobs)


def masked_logits(model: torch.nn.Module, batch: Rollouts, pad_id: int, autocast: torch.dtype | None) -> Tensor:
    """Trainer logits for the generated tokens, (N, V) fp32, divided by the sampling temperature."""
    input_ids, target_pos = sequence_input_ids(batch, pad_id)
    with autocast_context(input_ids.device.type, autocast):
        logits = model(input_ids=input_ids, use_cache=False).logits  # (B, L, V); no KV cache to fill
    V = logits.shape[-1]
    picked = logits.gather(1, target_pos[..., None].expand(-1, -1, V))  # (B, T, V)
    return picked[batch.mask].float() / batch.temperature  # (N, V)


def token_batch(
    model: torch.nn.Module,
    batch: Rollouts,
    *,
    pad_id: int,
    autocast: torch.dtype | None,
    replay_support: bool,
    columns_for: bool | None = None,
    replay_routes: bool = False,
) -> TokenBatch:
    """``batch``'s generated tokens with the trainer's logits (differentiable when grad is on).

    ``columns_for=None``: dense (N, V) logits. ``columns_for=centered`` (a bool): the columns a
    loss with (True) or without (False) score centering reads — the support when replayed, else
    the head when centered, else the sampled token alone — with the entropy, from the chunked
    lm-head pass, or dense where the output layer cannot be chunked (``lm_head.head_path``).
    ``replay_routes``: a mixture-of-experts forward uses the sampler's recorded experts
    (``rlmix.trainers.routing``); either way its router flips against them come back per token.
    """
    mask = batch.mask
    _, target_pos = sequence_input_ids(batch, pad_id)
    with routing(model, batch, int(batch.prompt_lens.max()) + mask.shape[1], replay=replay_routes) as seen:
        tokens = _token_batch(model, batch, pad_id=pad_id, autocast=autocast, replay_support=replay_support,
                              columns_for=columns_for)
    flips = seen.flips(batch.routed_experts, target_pos, mask)
    return tokens if flips is None else dataclasses.replace(tokens, router_flip=flips)


def _token_batch(model: torch.nn.Module, batch: Rollouts, *, pad_id: int, autocast: torch.dtype | None,
                 replay_support: bool, columns_for: bool | None) -> TokenBatch:
    mask = batch.mask

    def per_token(x: Tensor | None) -> Tensor | None:
        return None if x is None else x[mask]

    fields = dict(
        sampled_ids=batch.completion_ids[mask],
        sampler_logprobs=batch.sampler_logprobs[mask],
        head_ids=per_token(batch.head_ids),
        head_logprobs=per_token(batch.head_logprobs),
        support_ids=per_token(batch.support_ids) if replay_support else None,
        support_probs=per_token(batch.support_probs) if replay_support else None,
        old_logprobs=per_token(batch.trainer_logprobs),
        ref_logprobs=per_token(batch.ref_logprobs),
        sequence_ids=torch.arange(len(batch), device=mask.device)[:, None].expand_as(mask)[mask],
    )
    if columns_for is None:
        logits = masked_logits(model, batch, pad_id, autocast)
        return TokenBatch(logits=logits, logit_grad_norm=_dense_grad_norms(logits, batch.temperature), **fields)
    path, why = lm_head.head_path(model)
    if path is lm_head.HeadPath.dense:
        lm_head.say_dense_once(why)
        logits = masked_logits(model, batch, pad_id, autocast)
        return TokenBatch(logits=logits, entropy=lm_head.entropy(logits.detach()),
                          logit_grad_norm=_dense_grad_norms(logits, batch.temperature), **fields)
    support, head = fields["support_ids"], fields["head_ids"]
    candidate_ids = support if support is not None else head if columns_for else None
    columns = loss_columns(fields["sampled_ids"], candidate_ids)
    norms = _unfilled(columns.shape[0], mask.device) if torch.is_grad_enabled() else None
    gathered, entropy = lm_head.chunked_logits(model, batch, columns, pad_id=pad_id, autocast=autocast,
                                               grad_norms=norms)
    return TokenBatch(logits=gathered, entropy=entropy, logit_grad_norm=norms, **fields)


def _unfilled(n: int, device: torch.device) -> Tensor:
    return torch.full((n,), float("nan"), dtype=torch.float32, device=device)


def _dense_grad_norms(logits: Tensor, temperature: float) -> Tensor | None:
    """(N,) that the backward fills with ‖∂loss/∂ℓ_t‖ from the gradient of the dense ``logits`` = ℓ / T."""
    if not logits.requires_grad:
        return None
    norms = _unfilled(logits.shape[0], logits.device)

    def record(grad: Tensor) -> None:  # returns None: the gradient itself passes on unchanged
        norms.copy_(torch.linalg.vector_norm(grad.float(), dim=1) / temperature)

    logits.register_hook(record)
    return norms
