"""What happens to a sampler's finished groups before they wait in the buffer (DAPO's knobs).

``loop.overlong``: a completion cut at ``loop.max_new_tokens`` (finish reason ``length``) is kept
as it is, filtered out of the loss (its tokens leave the mask; its reward still counts in its
group's baseline), or penalised (``loop.overlong_penalty`` taken off its reward before
advantages). ``loop.dynamic_sampling``: a group whose rewards are all equal has zero advantage
everywhere, so it carries no gradient; it is dropped, and the loop requests more groups to fill
the batch (the buffer's capacity counts only what is kept).

A request's rows are its prompts' groups, ``group_size`` consecutive rows each (a sample whose
reward raised keeps its row, under a group id of its own), so groups are cut as row blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmix.config.schema import LoopConfig, Overlong
from rlmix.rollout import FINISH_LENGTH, Rollouts


@dataclass(frozen=True)
class Filtered:
    part: Rollouts | None  # None: every group was dropped
    groups: int  # groups the request brought
    dropped: int  # groups dropped as uniform
    overlong: int  # completions cut at max_new_tokens


def uniform_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(G,) bool: the groups (blocks of ``group_size`` rows of ``rewards`` (G·group_size,)) whose rewards are all equal."""
    blocks = rewards.view(-1, group_size)
    return (blocks == blocks[:, :1]).all(dim=1)


def filter_part(part: Rollouts, cfg: LoopConfig) -> Filtered:
    """``part`` after ``cfg.overlong`` and ``cfg.dynamic_sampling`` (module docstring); the defaults return it unchanged."""
    size = cfg.group_size
    groups = len(part) // size
    cut = torch.tensor([r == FINISH_LENGTH for r in part.finish_reason], dtype=torch.bool)
    if cfg.overlong is Overlong.penalty and bool(cut.any()):
        part = part.replace(rewards=part.rewards - cfg.overlong_penalty * cut.to(part.rewards.dtype))
    elif cfg.overlong is Overlong.filter and bool(cut.any()):
        part = part.replace(mask=part.mask & ~cut.to(part.mask.device)[:, None])
    if not cfg.dynamic_sampling:
        return Filtered(part, groups, 0, int(cut.sum()))
    keep = ~uniform_groups(part.rewards, size)
    dropped = groups - int(keep.sum())
    if dropped == 0:
        return Filtered(part, groups, 0, int(cut.sum()))
    if dropped == groups:
        return Filtered(None, groups, dropped, int(cut.sum()))
    rows = torch.arange(len(part)).view(groups, size)[keep].flatten()
    return Filtered(part.rows(rows), groups, dropped, int(cut.sum()))


def take_groups(buffer: list[Rollouts], groups: int, group_size: int) -> list[Rollouts]:
    """Exactly ``groups`` groups from the front of ``buffer`` (which must hold them), whole parts
    first; the part that crosses the count is cut between groups and its rest stays in front."""
    taken, count = [], 0
    while count < groups:
        part = buffer.pop(0)
        have = len(part) // group_size
        if count + have > groups:
            k = (groups - count) * group_size
            buffer.insert(0, part.rows(slice(k, None)))
            part, have = part.rows(slice(0, k)), groups - count
        taken.append(part)
        count += have
    return taken
