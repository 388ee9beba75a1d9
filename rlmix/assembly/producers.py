"""A task's rollout unit: what a sampler worker produces for one request, as one scored ``Rollouts``.

``SingleTurn`` encodes, generates and scores in one call; ``Episodes`` runs sandboxed multi-turn
episodes (``rlmix.agentic.train.EpisodeRollouts``). A task's kind (``rlmix.assembly.task_kinds``)
picks one; ``rlmix.orchestration.workers.SamplerWorker`` calls it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from rlmix.assembly.parts import decode_completions, encode_prompts
from rlmix.rollout import Rollouts, SamplingParams
from rlmix.tasks.base import Problem, Task

log = logging.getLogger(__name__)
# A sample whose reward function raised gets a group of its own (advantage 0): ids from here up.
ERROR_GROUP_BASE = 1 << 48


def request_group(group_id: int, group_size: int) -> int:
    """A row's group in its request: a failed reward's row gets an id of its own (``score_rollouts``),
    but it still came from, and sits among the rows of, its problem's group."""
    return (group_id - ERROR_GROUP_BASE) // group_size if group_id >= ERROR_GROUP_BASE else group_id


@dataclass(frozen=True)
class Request:
    """``groups`` prompts for one sampler call, each to be sampled ``group_size`` times."""

    request_id: int
    problems: tuple[Problem, ...]
    group_ids: tuple[int, ...]
    seed: int


def score_rollouts(out: Rollouts, request: Request, group_size: int, tokenizer, task: Task) -> Rollouts:
    """Decode each completion and fill task ids, group ids, rewards and format flags."""
    problems = [p for p in request.problems for _ in range(group_size)]
    texts = decode_completions(tokenizer, out)
    scores = [task.score(p, text) for p, text in zip(problems, texts)]
    group_ids = [g for g in request.group_ids for _ in range(group_size)]
    for row, score in enumerate(scores):
        if score.error is not None:
            # Out of its group (a group of one has advantage 0) so the others' baseline ignores it.
            group_ids[row] = ERROR_GROUP_BASE + group_ids[row] * group_size + row % group_size
            log.warning("reward failed on %s (sample %d): %s", problems[row].task_id, row % group_size, score.error)
    return out.replace(
        task_ids=tuple(p.task_id for p in problems),
        group_ids=torch.tensor(group_ids),
        rewards=torch.tensor([s.reward for s in scores], dtype=torch.float32),
        format_ok=torch.tensor([s.format_ok for s in scores]),
        reward_errors=torch.tensor([s.error is not None for s in scores]),
        exploit_suspected=torch.tensor([s.exploit_suspected for s in scores]),
    )


class RolloutProducer(Protocol):
    """A task's rollout unit, the one interface single-turn tasks and multi-turn environments share:
    ``group_size`` scored rollouts of each problem, drawn with ``sampler``, as one ``Rollouts``."""

    def __call__(self, sampler, request: Request, group_size: int, params: SamplingParams) -> Rollouts: ...


class SingleTurn:
    """One completion per row: encode the prompts, generate them in one call, score the text."""

    def __init__(self, task: Task, tokenizer, chat_template):
        self.task, self.tokenizer, self.chat_template = task, tokenizer, chat_template

    def __call__(self, sampler, request: Request, group_size: int, params: SamplingParams) -> Rollouts:
        prompts = encode_prompts(self.tokenizer, request.problems, group_size, self.chat_template)
        out = sampler.generate(prompts, params)
        return score_rollouts(out, request, group_size, self.tokenizer, self.task)


class Episodes:
    """One sandboxed multi-turn episode per row (``rlmix.agentic.train.EpisodeRollouts``)."""

    def __init__(self, task_cfg, task, tokenizer, pool: str):
        from rlmix.agentic.train import EpisodeRollouts

        self.run = EpisodeRollouts(task_cfg, task, tokenizer, pool)

    def __call__(self, sampler, request: Request, group_size: int, params: SamplingParams) -> Rollouts:
        return self.run(sampler, request.problems, request.group_ids, group_size, params)
