"""Episodes as the rollout unit of ``rlmix train``: task sources and the episode producer.

An agentic task (``AgentTask``) hands out problems like a single-turn ``rlmix.tasks.base.Task``
(``sample``, ``split``) and turns each into a Harbor task for the sandbox (``harbor_task``):
``HarborTaskSet`` serves a directory of Harbor tasks (SWE-bench Pro); the built-in
``rlmix.embedded.minicode_agent.task.MiniCodeAgentTask`` writes generated minicode problems as task
directories. ``rlmix.assembly.parts.make_task`` picks one from the config.

``EpisodeRollouts`` is what a sampler process runs for one request: ``group_size`` episodes of
each problem, up to ``concurrent_episodes`` at once in threads (the environment side: sandbox
commands and grading run in their own processes, so a thread per episode mostly waits), their
turns generated together by one ``TurnBatcher`` over the sampler (continuously batched on torch
pools). An episode's error ends the others at their next turn and fails the request. Each
finished episode is graded in a fresh sandbox; one whose sandbox failed on every attempt is left
out of its group (counted in ``Rollouts.infra_errors``), never scored 0. See docs/agentic.md.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from typing import Protocol

from rlmix.agentic.batching import TurnBatcher
from rlmix.agentic.harbor import HarborTask
from rlmix.agentic.policy import ModelPolicy
from rlmix.agentic.records import episode_stat_row, episodes_to_rollouts
from rlmix.agentic.run import (SampleResult, check_runtime, refuse_unrunnable, resolve_tasks, run_episodes,
                              run_sample)
from rlmix.config.swebench import AgentEnvConfig, SwebenchProConfig
from rlmix.rollout import Rollouts, SamplingParams
from rlmix.tasks.base import Problem

log = logging.getLogger(__name__)


class AgentTask(Protocol):
    name: str

    def sample(self, n: int, seed: int) -> list[Problem]:
        """n training problems, deterministic in seed."""

    def split(self, name: str) -> list[Problem]:
        """A fixed evaluation split."""

    def harbor_task(self, problem: Problem) -> HarborTask:
        """The Harbor task the sandbox runs for ``problem``."""

    def release(self, task: HarborTask) -> None:
        """``task``'s episodes are graded: drop whatever ``harbor_task`` made for it."""


class HarborTaskSet:
    """A directory of Harbor tasks (``task=swebench_pro``): problems drawn uniformly from the chosen set."""

    name = "swebench_pro"

    def __init__(self, cfg: SwebenchProConfig, seed: int, tasks: list[HarborTask] | None = None):
        """The configured tasks (``resolve_tasks``), or ``tasks`` where the caller resolved them."""
        tasks = resolve_tasks(cfg)[0] if tasks is None else tasks
        self.tasks = {t.task_id: t for t in tasks}
        self.seed = seed

    def _problem(self, task: HarborTask) -> Problem:
        return Problem(task_id=task.task_id, prompt=task.instruction, difficulty=0, payload=task)

    def sample(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"harbor:{self.seed}:{seed}")
        ids = sorted(self.tasks)
        return [self._problem(self.tasks[rng.choice(ids)]) for _ in range(n)]

    def split(self, name: str) -> list[Problem]:
        return [self._problem(t) for t in self.tasks.values()]

    def harbor_task(self, problem: Problem) -> HarborTask:
        return problem.payload

    def release(self, task: HarborTask) -> None:
        pass  # the user's task directories stay as they are


@dataclass(frozen=True)
class _Job:
    task: HarborTask
    sample: int
    group_id: int


def episode_jobs(task: AgentTask, problems: tuple[Problem, ...], group_ids: tuple[int, ...],
                 group_size: int) -> list[_Job]:
    """``group_size`` episodes of each problem. A task a request drew twice (Harbor task sets draw
    with replacement) numbers its second group's samples on from the first's: a turn's seed comes
    from the task, the sample and the turn (``policy.turn_seed``), so the two groups would otherwise
    draw the same episodes, and write them to the same files."""
    jobs, taken = [], {}
    for problem, group in zip(problems, group_ids):
        harbor = task.harbor_task(problem)
        first = taken.get(harbor.task_id, 0)
        taken[harbor.task_id] = first + group_size
        jobs += [_Job(harbor, first + s, group) for s in range(group_size)]
    return jobs


class EpisodeRollouts:
    """Runs a request's episodes on one sampler and returns them scored, as one ``Rollouts``."""

    def __init__(self, cfg: AgentEnvConfig, task: AgentTask, tokenizer, pool: str):
        self.cfg, self.task, self.tokenizer, self.pool = cfg, task, tokenizer, pool
        self.runtime = check_runtime(cfg)

    def __call__(self, sampler, problems: tuple[Problem, ...], group_ids: tuple[int, ...], group_size: int,
                 params: SamplingParams) -> Rollouts:
        params = replace(params, max_new_tokens=self.cfg.max_turn_tokens)
        jobs = episode_jobs(self.task, problems, group_ids, group_size)
        batcher = TurnBatcher(sampler, seed=params.seed, continuous=self.cfg.continuous_batching)
        policies = [ModelPolicy(self.tokenizer, batcher, params) for _ in jobs]  # each times its own turns

        def play(i: int, policy) -> SampleResult:
            return run_sample(jobs[i].task, jobs[i].sample, policy, self.runtime, self.cfg)

        try:  # an episode's error ends the request at the others' next turn, not when they finish
            results = list(zip(run_episodes(play, range(len(jobs)), policies.__getitem__, self.cfg.concurrent_episodes),
                               policies))
        finally:
            batcher.close()
            for task in {job.task.path: job.task for job in jobs}.values():
                self.task.release(task)
        kept = [(job, r, p) for job, (r, p) in zip(jobs, results)
                if r.outcome.infra_error is None and r.episode.tokens.ids]
        infra = len(jobs) - len(kept)
        for job, (r, _) in zip(jobs, results):
            if r.outcome.infra_error is not None:
                log.warning("%s sample %d left out of its group: %s", job.task.task_id, job.sample,
                            r.outcome.infra_error)
        if not kept:
            raise RuntimeError(f"every one of {len(jobs)} episodes failed in the sandbox (infrastructure); "
                               f"see the warnings above")
        out = episodes_to_rollouts(
            [r.episode for _, r, _ in kept], [r.outcome.reward for _, r, _ in kept], self.tokenizer.pad_token_id,
            pool=self.pool, temperature=params.temperature, group_ids=[job.group_id for job, _, _ in kept],
            stats=[episode_stat_row(r.episode, p.generate_s, r.outcome.wall_s) for _, r, p in kept])
        return out.replace(infra_errors=infra, gen_time_s=sum(p.generate_s for _, _, p in kept))


def check_agent_run(cfg: AgentEnvConfig, task: AgentTask, tokenizer, max_positions: int | None) -> None:
    """Everything about an agentic run that can be wrong before a process starts, as one-line ConfigErrors:
    the runtime (bwrap, Docker), the tasks (directory missing or malformed, not runnable here), and a
    model without room for one turn (``check_turn_room``)."""
    runtime = check_runtime(cfg)
    if isinstance(task, HarborTaskSet):
        refuse_unrunnable(runtime, cfg, task.tasks.values())
    check_turn_room(cfg, task, tokenizer, max_positions)


def check_turn_room(cfg: AgentEnvConfig, task: AgentTask, tokenizer, max_positions: int | None) -> None:
    """The first prompt plus one token must fit ``task.max_total_tokens``, which must fit the model's context."""
    from rlmix.agentic.policy import Message
    from rlmix.agentic.run import system_prompt
    from rlmix.errors import ConfigError
    from rlmix.tasks.chat import chat_renderer

    problems = task.split("all") if isinstance(task, HarborTaskSet) else task.sample(4, seed=0)
    if max_positions is not None and cfg.max_total_tokens > max_positions:
        raise ConfigError(f"task.max_total_tokens={cfg.max_total_tokens} exceeds the model's context of "
                          f"{max_positions} tokens; lower it to at most {max_positions}")
    chat, system = chat_renderer(tokenizer), system_prompt(cfg)
    longest = max(problems, key=lambda p: len(p.prompt))
    first = ([Message("system", system)] if system else []) + [Message("user", longest.prompt)]
    n = len(tokenizer.encode(chat.suffix(first, 0), add_special_tokens=False))
    if n + 1 > cfg.max_total_tokens:
        raise ConfigError(f"task.max_total_tokens={cfg.max_total_tokens} leaves no room for one turn: the first "
                          f"prompt of {longest.task_id} alone has {n} tokens")
