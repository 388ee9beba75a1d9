"""The trainer's expert routing against the sampler's record (``Rollouts.routed_experts``).

A mixture-of-experts model routes each token by the top-k of its router's softmax. A pool that
computes in fp8 or nvfp4 sees a rounded hidden state and may choose other experts than the BF16
trainer for the same token: a discrete mismatch that no log-prob ratio explains. Two things are
done here, on the trainer's own forward, through a forward hook on each sparse layer's router
(transformers' ``TopKRouter`` at ``mlp.gate``, which returns ``(logits, weights, indices)``):

- **flip rate**: the share of (token, sparse layer) whose top-k set differs from the sampler's,
  at the position whose logits give the token's log-prob (``mismatch/router_flip``); under
  replay it is still the trainer's own top-k, on the replayed forward's hidden states;
- **routing replay** (``correction.routing_replay``): the forward uses the sampler's experts at
  every recorded position, each weighted by the trainer's own router probability — renormalised
  over the k experts where the model renormalises (Mixtral, Qwen3-MoE's ``norm_topk_prob``),
  the plain softmax probability where it does not — so the gradient still reaches the router
  (docs/math.md §4.1).
  Positions without a record (the last generated token, padding, a pool that records none) keep
  the trainer's own choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from rlmix.rollout import Rollouts


def sparse_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router of each sparse layer in layer order (the order of ``routed_experts``'s M axis)."""
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the model
    return [m for name, m in module.named_modules() if name.endswith("mlp.gate") and hasattr(m, "top_k")]


class Routing:
    """One forward's routing: the trainer's own top-k per sparse layer, (B·L, k) each."""

    def __init__(self, layers: int) -> None:
        self.own: list[Tensor | None] = [None] * layers

    def flips(self, recorded: Tensor | None, target_pos: Tensor, mask: Tensor) -> Tensor | None:
        """(N,) per generated token: the share of sparse layers whose top-k set at the position that
        predicts it (``target_pos`` (B, T)) differs from ``recorded`` (B, W, M, k); NaN where the
        sampler recorded none. None for a dense model."""
        if not self.own or any(o is None for o in self.own):
            return None
        b, t = target_pos.shape
        own = torch.stack(self.own, dim=1).view(b, -1, len(self.own), self.own[0].shape[-1])  # (B, L, M, k)
        index = target_pos.clamp(min=0)[:, :, None, None].expand(-1, -1, *own.shape[2:])
        mine = own.gather(1, index)[mask]  # (N, M, k)
        if recorded is None:
            return torch.full((mine.shape[0],), float("nan"), device=mine.device)
        recorded = recorded.to(mine.device)
        theirs = _widen(recorded, int(target_pos.max()) + 1).long().gather(1, index)[mask]  # (N, M, k)
        differ = (mine.sort(-1).values != theirs.sort(-1).values).any(-1).float()  # (N, M)
        known = (theirs >= 0).all(-1).all(-1)  # (N,)
        return torch.where(known, differ.mean(-1), float("nan"))


def _widen(recorded: Tensor, width: int) -> Tensor:
    """``recorded`` (B, W, M, k) cut or padded with -1 to ``width`` positions."""
    if recorded.shape[1] >= width:
        return recorded[:, :width]
    pad = recorded.new_full((recorded.shape[0], width - recorded.shape[1], *recorded.shape[2:]), -1)
    return torch.cat([recorded, pad], dim=1)


@contextlib.contextmanager
def routing(model: torch.nn.Module, batch: Rollouts, seq_len: int, *, replay: bool) -> Iterator[Routing]:
    """Hooks on every sparse router for the forwards inside the block over ``batch``'s sequences
    (B, ``seq_len``): the trainer's own choices are kept; with ``replay`` the sampler's recorded
    experts are used instead wherever recorded."""
    routers = sparse_routers(model)
    seen = Routing(len(routers))
    recorded = batch.routed_experts
    if replay and recorded is not None and recorded.shape[2] != len(routers):
        raise ValueError(f"the rollouts record {recorded.shape[2]} sparse layers but the trainer's model has "
                         f"{len(routers)}: routing replay needs the sampler's model")
    replayed = None
    if replay and recorded is not None:
        replayed = _widen(recorded.to(batch.mask.device), seq_len).long().flatten(0, 1)  # (B·L, M, k)

    def hook(i: int, router: torch.nn.Module):
        def on_forward(module, args, output):
            logits, weights, chosen = output
            seen.own[i] = chosen.detach()
            if replayed is None:
                return None
            theirs = replayed[:, i]  # (B·L, k)
            use = torch.where((theirs >= 0).all(-1, keepdim=True), theirs, chosen)
            probs = torch.softmax(logits.float(), dim=-1).gather(-1, use)
            if getattr(router, "norm_topk_prob", True):  # Mixtral has no flag: it always renormalises
                probs = probs / probs.sum(dim=-1, keepdim=True)
            return logits, probs.to(weights.dtype), use

        return on_forward

    handles = [r.register_forward_hook(hook(i, r)) for i, r in enumerate(routers)]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
