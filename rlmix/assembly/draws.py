"""What the probe asks each pool's sampler to draw: single-turn completions or whole episodes.

The probe's prompt set is fixed (the task's ``test`` split, thinned evenly), so every pool is
measured on the same problems; a draw turns it into a pool's sampled ``Rollouts``. For an episode
task (``task=minicode_agent``, Harbor tasks) each row is one sandboxed multi-turn episode, run
with the code training runs (``rlmix.agentic.train.EpisodeRollouts``): policy turns and
environment observations interleaved, ``mask`` true on policy tokens only. A task's kind
(``rlmix.assembly.task_kinds``) picks the draw; ``rlmix.eval.probe`` runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlmix.config.swebench import AgentEnvConfig
from rlmix.rollout import Rollouts, SamplingParams

WARMUP_TOKENS = 2  # a short untimed generation first, so tokens/s excludes first-call overheads


class SingleTurnDraw:
    """``samples_per_prompt`` completions of each encoded prompt, in one ``generate`` call."""

    def __init__(self, prompts: list[list[int]]):
        self.prompts = prompts

    def warm_up(self, sampler, params: SamplingParams) -> None:
        sampler.generate(self.prompts[:1], dataclasses.replace(params, max_new_tokens=WARMUP_TOKENS))

    def __call__(self, sampler, params: SamplingParams, pool: str) -> Rollouts:
        return sampler.generate(self.prompts, params)

    def close(self) -> None:
        return None


class EpisodeDraw:
    """``group_size`` sandboxed episodes of each problem; a policy turn generates up to
    ``task.max_turn_tokens`` (tokens/s then counts policy tokens over the episodes' wall time,
    sandbox included)."""

    def __init__(self, task_cfg: AgentEnvConfig, task, problems: Sequence, tokenizer, group_size: int):
        self.task_cfg, self.task, self.tokenizer = task_cfg, task, tokenizer
        self.problems, self.group_size = tuple(problems), group_size

    def warm_up(self, sampler, params: SamplingParams) -> None:
        return None  # the first episode turn's cost is small beside the sandbox's

    def __call__(self, sampler, params: SamplingParams, pool: str) -> Rollouts:
        from rlmix.agentic.train import EpisodeRollouts

        run = EpisodeRollouts(self.task_cfg, self.task, self.tokenizer, pool)
        return run(sampler, self.problems, tuple(range(len(self.problems))), self.group_size, params)

    def close(self) -> None:
        """Remove the task directories the episodes were written to (a task set over the user's own
        Harbor directories has nothing to remove and no ``close``)."""
        close = getattr(self.task, "close", None)
        if close is not None:
            close()
