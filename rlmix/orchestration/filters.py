"""What happens to a sampler's finished groups before they wait in the buffer (DAPO's knobs).

``loop.overlong``: a completion cut at ``loop.max_new_tokens`` (finish reason ``length``) is kept
as it is, filtered out of the loss (its tokens leave the mask; its reward still counts in its
group's baseline), or penalised (``loop.overlong_penalty`` taken off its reward before
advantages). ``loop.dynamic_sampling``: a group whose rewards are all equal has zero advantage
everywhere, so it carries no gradient; it is dropped, and the loop requests more groups to fill
the batch (the buffer's capacity counts only what is kept).

A request's rows are its prompts' groups, each in consecutive rows: ``group_size`` of them for a
single-turn task (a sample whose reward raised keeps its row, under a group id of its own), fewer
for an agentic group whose episode the sandbox lost (``rlmix.agentic.train``). Groups are counted
and cut by their ids (``group_lengths``), never as fixed row blocks, so a short group neither shifts
the next ones nor is split between two steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlmix.assembly.producers import request_group
from rlmix.config.schema import LoopConfig, Overlong
from rlmix.correction.advantages import uniform_groups
from rlmix.rollout import FINISH_LENGTH, Rollouts


@dataclass(frozen=True)
class Filtered:
    part: Rollouts | None  # None: every group was dropped
    groups: int  # groups the request brought
    dropped: int  # groups dropped as uniform
    overlong: int  # completions cut at max_new_tokens


def group_lengths(part: Rollouts, group_size: int) -> list[int]:
    """The row count of each of ``part``'s groups, in row order (module docstring)."""
    if part.group_ids is None:
        return [group_size] * (len(part) // group_size)
    lengths: list[int] = []
    last = None
    for group_id in part.group_ids.tolist():  # a Python loop: the loop asks this on every dispatch
        group = request_group(group_id, group_size)
        if group == last:
            lengths[-1] += 1
        else:
            lengths.append(1)
            last = group
    return lengths


def count_groups(parts: list[Rollouts], group_size: int) -> int:
    return sum(len(group_lengths(p, group_size)) for p in parts)


def filter_part(part: Rollouts, cfg: LoopConfig) -> Filtered:
    """``part`` after ``cfg.overlong`` and ``cfg.dynamic_sampling`` (module docstring); the defaults return it unchanged."""
    lengths = group_lengths(part, cfg.group_size)
    groups = len(lengths)
    cut = torch.tensor([r == FINISH_LENGTH for r in part.finish_reason], dtype=torch.bool)
    if cfg.overlong is Overlong.penalty and bool(cut.any()):
        part = part.replace(rewards=part.rewards - cfg.overlong_penalty * cut.to(part.rewards.dtype))
    elif cfg.overlong is Overlong.filter and bool(cut.any()):
        part = part.replace(mask=part.mask & ~cut.to(part.mask.device)[:, None])
    if not cfg.dynamic_sampling:
        return Filtered(part, groups, 0, int(cut.sum()))
    group = torch.repeat_interleave(torch.arange(groups), torch.tensor(lengths))
    keep = ~uniform_groups(part.rewards, group, groups)
    dropped = groups - int(keep.sum())
    if dropped == 0:
        return Filtered(part, groups, 0, int(cut.sum()))
    if dropped == groups:
        return Filtered(None, groups, dropped, int(cut.sum()))
    return Filtered(part.rows(torch.nonzero(keep[group]).flatten()), groups, dropped, int(cut.sum()))


def take_groups(buffer: list[Rollouts], groups: int, group_size: int) -> list[Rollouts]:
    """Exactly ``groups`` groups from the front of ``buffer`` (which must hold them), whole parts
    first; the part that crosses the count is cut between groups and its rest stays in front."""
    taken, count = [], 0
    while count < groups:
        part = buffer.pop(0)
        lengths = group_lengths(part, group_size)
        have = len(lengths)
        if count + have > groups:
            k = sum(lengths[:groups - count])
            buffer.insert(0, part.rows(slice(k, None)))
            part, have = part.rows(slice(0, k)), groups - count
        taken.append(part)
        count += have
    return taken
