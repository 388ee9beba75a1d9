"""Where a pool's mismatch sits: the sampled tokens' |Δ log-prob| and k3 binned, and router flips.

Per sampled token, ``lr = log p_trainer(a) − log q_sampler(a)`` (clamped as in docs/math.md §6).
A binning groups the tokens by one key (the trainer's probability of the token, its position in
the completion) and reports per bin: the token count, mean |lr|, mean k3 (§6, capped per token)
and the bin's share of the pool's total |lr| mass ``Σ_bin |lr| / Σ_all |lr|``. A bin that holds
few tokens but much of the mass is where the mismatch sits.

For a mixture-of-experts model, ``router_flips`` splits the tokens by whether any sparse layer's
top-k experts differ between the sampler and the trainer (docs/math.md §4.1).

``bin_sums`` and ``bin_index`` are pure tensor functions; the records (``MismatchBin``,
``RouterFlips``) hold plain floats for ``probe.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlmix.correction.diagnostics import PROB_EDGES, bin_index, kl_k3_per_token

# Bin edges: a token falls in [edges[i], edges[i+1]); the last bin is closed (probability, PROB_EDGES,
# shared with training's where/ metrics) or open (position).
POSITION_EDGES = (0, 8, 32, 128)
# Policy tokens since the last environment token: -1 (none yet: the first turn), 0 (right after), 1-3, ...
ENV_DISTANCE_EDGES = (-1, 0, 1, 4, 16, 64)


def prob_labels(edges: tuple[float, ...] = PROB_EDGES) -> tuple[str, ...]:
    """``[a,b)`` per bin, the last one closed: ``[0.9,1]``."""
    labels = [f"[{a:g},{b:g})" for a, b in zip(edges[:-1], edges[1:])]
    labels[-1] = labels[-1][:-1] + "]"
    return tuple(labels)


def position_labels(edges: tuple[int, ...] = POSITION_EDGES) -> tuple[str, ...]:
    """``a-b`` per bin (inclusive), the last one open: ``128+``."""
    return (*(f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])), f"{edges[-1]}+")


def env_distance_labels(edges: tuple[int, ...] = ENV_DISTANCE_EDGES) -> tuple[str, ...]:
    """``first_turn`` for the tokens before any environment token, then ``a-b`` bins, the last open."""
    bins = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in zip(edges[1:-1], edges[2:])]
    return ("first_turn", *bins, f"{edges[-1]}+")


def bin_sums(log_ratio: Tensor, index: Tensor, bins: int) -> dict[str, Tensor]:
    """Per bin, (bins,) each: ``tokens`` (count), ``abs_sum`` (Σ |lr|) and ``k3_sum`` (Σ k3)."""
    zeros = torch.zeros(bins, dtype=torch.float64)
    lr = log_ratio.detach().double()
    return {
        "tokens": zeros.index_add(0, index, torch.ones_like(lr)),
        "abs_sum": zeros.index_add(0, index, lr.abs()),
        "k3_sum": zeros.index_add(0, index, kl_k3_per_token(lr)),
    }


@dataclass(frozen=True)
class MismatchBin:
    """One bin of sampled tokens: means are 0 over an empty bin; share is None when no token differs."""

    bin: str
    tokens: int
    logprob_abs_diff: float  # mean |lr| over the bin's tokens
    kl_k3: float  # mean k3 over the bin's tokens
    abs_diff_share: float | None  # Σ_bin |lr| / Σ_all |lr|


def binned(log_ratio: Tensor, index: Tensor, labels: tuple[str, ...]) -> tuple[MismatchBin, ...]:
    """The ``MismatchBin`` of each label, tokens assigned by ``index`` (N,) (see ``bin_index``)."""
    sums = bin_sums(log_ratio, index, len(labels))
    total = float(sums["abs_sum"].sum())
    out = []
    for i, label in enumerate(labels):
        n = int(sums["tokens"][i])
        out.append(MismatchBin(
            bin=label, tokens=n,
            logprob_abs_diff=float(sums["abs_sum"][i]) / n if n else 0.0,
            kl_k3=float(sums["k3_sum"][i]) / n if n else 0.0,
            abs_diff_share=float(sums["abs_sum"][i]) / total if total > 0 else None,
        ))
    return tuple(out)


def by_trainer_prob(log_ratio: Tensor, trainer_logprobs: Tensor) -> tuple[MismatchBin, ...]:
    """Tokens binned by p_trainer(a) = exp(trainer log-prob at the sampling temperature), ``PROB_EDGES``."""
    index = bin_index(trainer_logprobs.detach().double().exp(), PROB_EDGES, closed_last=True)
    return binned(log_ratio, index, prob_labels())


def by_position(log_ratio: Tensor, positions: Tensor) -> tuple[MismatchBin, ...]:
    """Tokens binned by their 0-based position in the completion, ``POSITION_EDGES`` (last bin open)."""
    return binned(log_ratio, bin_index(positions.double(), POSITION_EDGES, closed_last=False), position_labels())


def completion_positions(mask: Tensor) -> Tensor:
    """(N,) the completion column of each generated token (``mask`` (B, T)), row-major like ``mask``'s tokens."""
    return torch.arange(mask.shape[1], device=mask.device)[None].expand_as(mask)[mask]


def env_distances(mask: Tensor) -> Tensor:
    """(N,) per generated token (``mask`` (B, T) True), the number of policy tokens between the last
    environment token before it in its completion and itself: 0 right after an observation, −1
    when none precedes it (the first policy turn, and every token of a single-turn completion).

    An environment token is a completion token the sampler did not generate (``mask`` false):
    a tool observation and the chat-template tokens around it (``rlmix.agentic.records``).
    Padding follows the last token of a row, so it never precedes a generated one.
    """
    cols = torch.arange(mask.shape[1], device=mask.device)[None].expand_as(mask)  # (B, T)
    last_env = torch.where(mask, -1, cols).cummax(dim=1).values  # (B, T) last non-policy column so far
    dist = torch.where(last_env >= 0, cols - last_env - 1, -1)
    return dist[mask]


def by_env_distance(log_ratio: Tensor, distances: Tensor) -> tuple[MismatchBin, ...] | None:
    """Tokens binned by ``env_distances``, ``ENV_DISTANCE_EDGES``; None when no token follows an
    environment token (single-turn completions: the binning would say nothing)."""
    if not bool((distances >= 0).any()):
        return None
    index = bin_index(distances.double(), ENV_DISTANCE_EDGES, closed_last=False)
    return binned(log_ratio, index, env_distance_labels())


@dataclass(frozen=True)
class RouterFlips:
    """A mixture-of-experts pool's routing against the trainer's, at the position predicting each
    sampled token, over the tokens whose sampler recorded its experts there (``Rollouts.routed_experts``).

    layer_flip_rate: share of (token, sparse layer) whose top-k set differs (``mismatch/router_flip``).
    token_flip_rate: share of tokens with at least one flipped layer.
    logprob_abs_diff_flipped / _unflipped: mean |lr| over tokens with ≥ 1 flipped layer / with none
    (0 over no token). abs_diff_share_flipped: their share of the recorded tokens' Σ |lr| (None when 0).
    """

    tokens: int
    layer_flip_rate: float
    token_flip_rate: float
    logprob_abs_diff_flipped: float
    logprob_abs_diff_unflipped: float
    abs_diff_share_flipped: float | None


def router_flips(log_ratio: Tensor, flip: Tensor) -> RouterFlips | None:
    """From ``flip`` (N,): each token's share of sparse layers whose experts differ (NaN: no record).
    None when no token has a record (a pool that records no experts)."""
    known = ~flip.isnan()
    if not bool(known.any()):
        return None
    lr, share = log_ratio.detach()[known].double().abs(), flip[known].double()
    flipped = share > 0
    n, total = int(known.sum()), float(lr.sum())

    def mean(x: Tensor) -> float:
        return float(x.mean()) if x.numel() else 0.0

    return RouterFlips(
        tokens=n,
        layer_flip_rate=mean(share),
        token_flip_rate=mean(flipped.double()),
        logprob_abs_diff_flipped=mean(lr[flipped]),
        logprob_abs_diff_unflipped=mean(lr[~flipped]),
        abs_diff_share_flipped=float(lr[flipped].sum()) / total if total > 0 else None,
    )
