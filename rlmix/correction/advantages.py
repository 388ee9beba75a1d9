"""Group-relative advantages (docs/math.md §3.2 defaults, §5 arms).

    A_i = r_i − mean_{j ∈ g(i)} r_j                          (normalize_std=False: sc, sc_mis)
    A_i = (r_i − mean_g) / (std_g + eps)                     (normalize_std=True: grpo, icepop)

std_g is the sample standard deviation (n − 1 in the denominator, as `torch.std`); a group of one
has advantage 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_ids: Tensor, normalize_std: bool, eps: float = 1e-6) -> Tensor:
    """Per-sample advantages (B,) from rewards (B,) and any integer group labels (B,)."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        shapes = f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        raise ValueError(f"rewards and group_ids must both be (B,), got {shapes}")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    labels, group = torch.unique(group_ids, return_inverse=True)
    zeros = rewards.new_zeros(labels.shape[0])
    counts = zeros.index_add(0, group, torch.ones_like(rewards))
    means = zeros.index_add(0, group, rewards) / counts
    centred = rewards - means[group]
    if not normalize_std:
        return centred
    var = zeros.index_add(0, group, centred.square()) / (counts - 1.0).clamp_min(1.0)
    return centred / (var.sqrt()[group] + eps)


def uniform_groups(rewards: Tensor, group: Tensor, groups: int) -> Tensor:
    """(groups,) bool: which groups' rewards are all equal, so that every advantage in them is 0.
    ``group`` (B,) is each row's group index in ``[0, groups)``."""
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    high = rewards.new_full((groups,), -torch.inf).scatter_reduce(0, group, rewards, "amax")
    low = rewards.new_full((groups,), torch.inf).scatter_reduce(0, group, rewards, "amin")
    return high == low
