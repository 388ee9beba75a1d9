"""Trainer log-probs without the (N, V) logits: the chunked lm-head pass.

The correction reads, per generated token, the logits at a few columns (the sampled id, the K
head ids or the S support ids) and the full-vocabulary log-normaliser (docs/math.md §3.3). So the
trainer runs the model with its output layer replaced for one forward by a pass that takes the
output layer's input at the completion positions only (N, d) and walks the output layer over
chunks of tokens:

    z_c   = (h_c W^T) / T                      (c, V) fp32, one chunk at a time
    out   = z_c[ids], logsumexp(z_c), entropy(z_c)

Backward recomputes each chunk's logits instead of keeping them, with the gradient of the
gathered columns `g_z` and of the log-normaliser `g_n`:

    dz_c   = (scatter(ids, g_z) + softmax(z_c) · g_n) / T
    dh_c   = dz_c W            dW += dz_c^T h_c

Backward also writes each token's logit-gradient norm `‖dz_t‖` (the gradient of the loss with
respect to the output layer's product `h_t W^T`) into a buffer the caller holds: which tokens
carry the step's gradient, read after the backward (``rlmix.metrics.where``).

Peak memory is a few (c, V) buffers instead of several (N, V) ones (docs/performance.md).
Output layers this cannot express exactly (a bias, logit soft-capping or scaling, ZeRO-3
partitioned weights) take the dense path, the same numbers at the old cost, and say so once.
"""

from __future__ import annotations

import logging
from enum import Enum

import torch
from torch import Tensor

from rlmix.correction.logprobs import GatheredLogits
from rlmix.rollout import Rollouts, sequence_input_ids
from rlmix.trainers.precision import autocast_context, product

log = logging.getLogger(__name__)

# Bytes of one fp32 (chunk, V) logit buffer; a chunk holds two of them at its peak (plus a BF16
# product while it is cast). 64 MiB: 110 tokens of a 152k vocabulary, 524 of a 32k one.
CHUNK_BYTES = 1 << 26
# Config attributes with which a model transforms the output layer's product: not a plain h W^T.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


class HeadPath(str, Enum):
    chunked = "chunked"  # hidden states (N, d), lm head a chunk of tokens at a time
    dense = "dense"  # the model's own (B, L, V) logits, then the (N, V) rows


def head_path(model: torch.nn.Module) -> tuple[HeadPath, str]:
    """Which path the loss's `token_batch` takes for `model` (an HF causal LM or a DeepSpeed engine), and why."""
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    if not (hasattr(module, "get_output_embeddings") and hasattr(module, "set_output_embeddings")):
        return HeadPath.dense, "the model has no get/set_output_embeddings"
    head = module.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return HeadPath.dense, f"the output layer is {type(head).__name__} with a bias or not a plain Linear"
    config = getattr(module, "config", None)
    for name in _LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1.0):
            return HeadPath.dense, f"the model transforms its logits (config.{name})"
    if hasattr(head.weight, "ds_id"):
        return HeadPath.dense, "the output weight is partitioned (DeepSpeed ZeRO-3)"
    return HeadPath.chunked, "plain output layer"


def chunked_logits(
    model: torch.nn.Module, batch: Rollouts, columns: Tensor, *, pad_id: int, autocast: torch.dtype | None,
    chunk_bytes: int = CHUNK_BYTES, grad_norms: Tensor | None = None,
) -> tuple[GatheredLogits, Tensor]:
    """The logits / T of `batch`'s generated tokens at `columns` (N, C) with the full log-normaliser,
    and the detached entropy (N,), never holding more than a chunk of tokens × V. Needs a model
    that `head_path` says `chunked` for. ``grad_norms`` (N,) fp32, if given, receives each token's
    logit-gradient norm when the backward runs."""
    module = getattr(model, "module", model)
    head = module.get_output_embeddings()
    input_ids, target_pos = sequence_input_ids(batch, pad_id)
    rows = torch.arange(target_pos.shape[0], device=target_pos.device)[:, None].expand_as(target_pos)
    layer = _ChunkedOutputLayer(
        head,
        rows[batch.mask],
        target_pos[batch.mask],
        columns,
        temperature=float(batch.temperature),
        chunk=max(1, chunk_bytes // (4 * head.weight.shape[0])),
        compute=autocast or torch.float32,  # §3.3: 16-bit logits under autocast, fp32 softmax
        grad_norms=grad_norms,
    )
    # The pass runs as the model's output layer, inside the model's own forward: a DeepSpeed
    # engine's backward set-up (hooked on the forward's output) then runs before the output
    # layer's gradient arrives, as with the dense logits.
    module.set_output_embeddings(layer)
    try:
        with autocast_context(input_ids.device.type, autocast):
            packed = model(input_ids=input_ids, use_cache=False).logits  # (N·C + 2N,); no KV cache to fill
    finally:
        module.set_output_embeddings(head)
    n, c = columns.shape
    z, log_norm, entropy = packed[: n * c].view(n, c), packed[n * c : n * c + n], packed[n * c + n :]
    return GatheredLogits(columns, z, log_norm), entropy.detach()


class _ChunkedOutputLayer(torch.nn.Module):
    """Stands in for the output layer during one forward: the chunked pass at the completion
    positions, its three results packed into one tensor (what the model returns as `.logits`)."""

    def __init__(self, head: torch.nn.Linear, rows: Tensor, positions: Tensor, columns: Tensor, *,
                 temperature: float, chunk: int, compute: torch.dtype, grad_norms: Tensor | None = None):
        super().__init__()
        self.head = head
        self.rows, self.positions, self.columns = rows, positions, columns
        self.temperature, self.chunk, self.compute = temperature, chunk, compute
        self.grad_norms = grad_norms

    def forward(self, hidden: Tensor) -> Tensor:  # (B, L, d) → (N·C + 2N,)
        h = hidden[self.rows, self.positions]  # (N, d): only the positions that predict generated tokens
        z, log_norm, entropy = _ChunkedHead.apply(
            h, self.head.weight, self.columns, self.temperature, self.chunk, self.compute, self.grad_norms
        )
        return torch.cat([z.flatten(), log_norm, entropy])


def entropy(logits: Tensor) -> Tensor:
    """(N,) entropy of dense (N, V) logits."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


_said: set[str] = set()


def say_dense_once(why: str) -> None:
    """Log, once per reason, that the dense (N, V) path runs."""
    if why not in _said:
        _said.add(why)
        log.info("lm head: dense (N, V) logits because %s", why)


class _ChunkedHead(torch.autograd.Function):
    """(h (N, d), W (V, d)) → z at `ids` (N, C), logsumexp (N,), entropy (N,, no gradient).
    ``grad_norms`` (N,) or None: filled in backward with ‖dz_t‖, the fp32 logit gradient's norm."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, ids: Tensor, temperature: float, chunk: int, compute: torch.dtype,
                grad_norms: Tensor | None = None):
        ctx.grad_norms = grad_norms
        with torch.autocast(h.device.type, enabled=False):  # the dtypes below are chosen, not autocast's
            return _ChunkedHead._forward(ctx, h, weight, ids, temperature, chunk, compute)

    @staticmethod
    def _forward(ctx, h: Tensor, weight: Tensor, ids: Tensor, temperature: float, chunk: int, compute: torch.dtype):
        ctx.set_materialize_grads(False)
        w = weight.to(compute)  # one cast for all chunks (a no-op for a BF16 or fp32 match)
        n = h.shape[0]
        z = h.new_empty(ids.shape, dtype=torch.float32)
        log_norm = h.new_empty((n,), dtype=torch.float32)
        entropy = h.new_empty((n,), dtype=torch.float32)
        for s in range(0, n, chunk):
            y = _chunk_logits(h[s : s + chunk], w, temperature)  # (c, V) fp32
            z[s : s + chunk] = y.gather(1, ids[s : s + chunk])
            # logsumexp and entropy with two (c, V) buffers: y = z − max in place, e = exp(y),
            # lse = max + log Σe,  H = −Σ p log p = log Σe − Σ e·y / Σe
            top = y.amax(dim=1, keepdim=True)
            y.sub_(top)
            e = y.exp()
            total = e.sum(dim=1)
            log_norm[s : s + chunk] = top[:, 0] + total.log()
            dot = torch.bmm(e[:, None, :], y[:, :, None])[:, 0, 0]  # Σ e·y without a third buffer
            entropy[s : s + chunk] = total.log() - dot / total
            del y, e
        ctx.save_for_backward(h, weight, ids, log_norm)
        ctx.temperature, ctx.chunk, ctx.compute = temperature, chunk, compute
        ctx.mark_non_differentiable(entropy)
        return z, log_norm, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_z: Tensor | None, grad_norm: Tensor | None, _grad_entropy: Tensor | None):
        h, weight, ids, log_norm = ctx.saved_tensors
        t, chunk, compute = ctx.temperature, ctx.chunk, ctx.compute
        w = weight.to(compute)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for s in range(0, h.shape[0], chunk):
            h_c = h[s : s + chunk]
            dz = _chunk_logits(h_c, w, t)
            if grad_norm is None:
                dz.zero_()
            else:  # softmax(z) · g_n, in the recomputed logits' buffer
                dz.sub_(log_norm[s : s + chunk, None]).exp_().mul_(grad_norm[s : s + chunk, None])
            if grad_z is not None:
                dz.scatter_add_(1, ids[s : s + chunk], grad_z[s : s + chunk].float())
            if t != 1.0:  # through z = (h W^T) / T
                dz.div_(t)
            if ctx.grad_norms is not None:
                ctx.grad_norms[s : s + chunk] = torch.linalg.vector_norm(dz, dim=1)
            dz = dz.to(compute)
            if grad_h is not None:
                grad_h[s : s + chunk] = product(dz, w, compute)
            if compute is torch.float32:
                grad_w.addmm_(dz.T, h_c.float())
            else:  # fp32 accumulation over chunks of the 16-bit products
                grad_w += product(dz.T, h_c, compute).float()
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None


def _chunk_logits(h_c: Tensor, w: Tensor, temperature: float) -> Tensor:
    """(c, V) fp32 logits / T: the product in `w`'s dtype (as autocast would), then fp32."""
    logits = product(h_c, w.T, w.dtype).float()
    return logits.div_(temperature) if temperature != 1.0 else logits
