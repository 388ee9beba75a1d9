"""The library entry point of ``rlmix eval task=swebench_pro``: tasks -> episodes -> grades -> results.

For each task and sample: start a sandbox (network off), snapshot the repository, run the episode,
capture the patch, close the sandbox; then grade the patch in a fresh sandbox (``grading.py``).
Infrastructure failures of the agent phase are retried ``grade_retries`` times, like grading's.
Up to ``concurrent`` episodes run at once, in threads (an episode mostly waits: on its sandbox's
commands, which run in their own processes, and on the policy, which a ``TurnBatcher`` serves to
many episodes in one batch); a line per finished episode goes to ``progress``, in the order they
finish, and eval.json lists them in task order whatever that order was. An episode's error or an
interrupt starts no other episode and ends the running ones at their next turn, sandboxes closed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from rlmix.agentic.actions import SYSTEM_PROMPT
from rlmix.config.swebench import AgentEnvConfig, RuntimeKind, SwebenchProConfig
from rlmix.agentic.docker import DockerRuntime
from rlmix.agentic.episode import Episode, EpisodeLimits, run_episode
from rlmix.agentic.grading import grade_patch
from rlmix.agentic.harbor import HarborTask, load_tasks, read_subset_file, select_subset
from rlmix.agentic.local import LocalRuntime
from rlmix.agentic.policy import AgentPolicy
from rlmix.agentic.results import SampleOutcome, log_wandb, summarize, write_episode, write_results
from rlmix.agentic.sandbox import InfraError, Runtime, capture_patch, snapshot_baseline
from rlmix.errors import ConfigError

log = logging.getLogger(__name__)
R = TypeVar("R")

RUNTIMES: dict[RuntimeKind, Callable[[AgentEnvConfig], Runtime]] = {
    RuntimeKind.local: lambda cfg: LocalRuntime(memory_mb=cfg.local_memory_mb, max_procs=cfg.local_max_procs,
                                                cpu_s=cfg.local_cpu_s, turn_timeout_s=cfg.turn_timeout_s,
                                                trusted=cfg.trusted, output_cap_bytes=cfg.command_output_cap_bytes,
                                                resident=cfg.local_resident),
    RuntimeKind.docker: lambda cfg: DockerRuntime(image_prefix=cfg.docker_image_prefix,
                                                  output_cap_bytes=cfg.command_output_cap_bytes),
}
MIN_OUTPUT_CAP_BYTES = 4096


def check_runtime(cfg: AgentEnvConfig) -> Runtime:
    """The configured runtime, or a one-line ConfigError if it cannot run here (no bwrap, no Docker engine).

    Cheap and side-effect free: call it before anything expensive starts (Ray, a sampler).
    """
    if cfg.command_output_cap_bytes < MIN_OUTPUT_CAP_BYTES:
        raise ConfigError(f"task.command_output_cap_bytes={cfg.command_output_cap_bytes} must be >= "
                          f"{MIN_OUTPUT_CAP_BYTES}")
    runtime = RUNTIMES[cfg.runtime](cfg)
    problem = runtime.unavailable()
    if problem:
        raise ConfigError(problem)
    return runtime


def resolve_tasks(cfg: SwebenchProConfig) -> tuple[list[HarborTask], list[str] | None]:
    """(tasks to evaluate, subset task ids or None when ``subset=all``); every input problem is a ConfigError."""
    if not cfg.tasks_dir_set():
        raise ConfigError("task.tasks_dir is not set: give the directory holding the Harbor task directories")
    if cfg.subset == "all" and cfg.subset_file:  # which one was meant is not for rlmix to guess
        raise ConfigError(f"task.subset=all takes every task, and task.subset_file={cfg.subset_file} names some: "
                          "drop one of the two")
    tasks = load_tasks(Path(cfg.tasks_dir))
    if cfg.subset == "all":
        return list(tasks.values()), None
    if not cfg.subset_file:
        raise ConfigError(f"task.subset={cfg.subset} needs task.subset_file (a list of instance ids), "
                          f"or set task.subset=all")
    ids = select_subset(tasks, read_subset_file(Path(cfg.subset_file)), cfg.expected_subset_size, cfg.subset_file)
    chosen = list(tasks.values()) if cfg.eval_all_tasks else [tasks[t] for t in ids]
    return chosen, ids


class Playable(NamedTuple):
    """The tasks an evaluation plays, each checked runnable on ``runtime`` (``playable``), and the subset's
    ids (None: ``task.subset=all``)."""

    runtime: Runtime
    tasks: list[HarborTask]
    subset_ids: list[str] | None


def playable(cfg: SwebenchProConfig) -> Playable:
    """The runtime (``check_runtime``), then the configured tasks (``resolve_tasks``), each runnable on it."""
    runtime = check_runtime(cfg)
    tasks, subset_ids = resolve_tasks(cfg)
    refuse_unrunnable(runtime, cfg, tasks)
    return Playable(runtime, tasks, subset_ids)


def refuse_unrunnable(runtime: Runtime, cfg: AgentEnvConfig, tasks: Iterable[HarborTask]) -> None:
    """A ConfigError naming the first of ``tasks`` the runtime cannot run (and how many), before any episode."""
    bad = [p for p in (runtime.check(t) for t in tasks) if p]
    if bad:
        raise ConfigError(f"{len(bad)} task(s) cannot run with task.runtime={cfg.runtime.name}: {bad[0]}")


def check_ks(ks: Sequence[int], samples: int) -> None:
    if samples < 1:
        raise ConfigError(f"eval.samples={samples} must be >= 1")
    bad = [k for k in ks if not 1 <= k <= samples]
    if not ks or bad:
        raise ConfigError(f"eval.k={list(ks)} must be a non-empty list of values in 1..eval.samples={samples}")


def episode_limits(cfg: AgentEnvConfig, task: HarborTask) -> EpisodeLimits:
    return EpisodeLimits(max_turns=cfg.max_turns, turn_timeout_s=cfg.turn_timeout_s,
                         agent_timeout_s=cfg.agent_timeout_s or task.agent_timeout_s,
                         max_total_tokens=cfg.max_total_tokens, max_format_errors=cfg.max_format_errors,
                         max_output_chars=cfg.max_output_chars)


def _agent_phase(task: HarborTask, sample: int, policy: AgentPolicy, runtime: Runtime,
                 cfg: AgentEnvConfig) -> tuple[Episode, str, str | None]:
    """(episode, the patch it left, why the patch is missing); raises InfraError if the sandbox fails."""
    sandbox = runtime.start(task, network=False)
    try:
        baseline = snapshot_baseline(sandbox)
        episode = run_episode(task, sample, policy, sandbox, episode_limits(cfg, task), system_prompt(cfg))
        return (episode, *capture_patch(sandbox, baseline))
    finally:
        sandbox.close()


def system_prompt(cfg: AgentEnvConfig) -> str:
    return SYSTEM_PROMPT if cfg.system_prompt is None else cfg.system_prompt


@dataclass(frozen=True)
class SampleResult:
    episode: Episode
    outcome: SampleOutcome
    patch: str


def run_sample(task: HarborTask, sample: int, policy: AgentPolicy, runtime: Runtime,
               cfg: AgentEnvConfig) -> SampleResult:
    """Agent phase (retried on infra failure) then grading (retried inside ``grade_patch``)."""
    start, error = time.monotonic(), None
    for attempt in range(cfg.grade_retries + 1):
        try:
            runtime.prepare(task)
            episode, patch, patch_error = _agent_phase(task, sample, policy, runtime, cfg)
            break
        except InfraError as e:
            error = str(e)
            log.warning("%s sample %d: agent phase infrastructure failure (attempt %d): %s", task.task_id,
                        sample, attempt + 1, error)
    else:
        outcome = SampleOutcome(task.task_id, sample, 0.0, error, "infra_error", 0, 0, 0, 0,
                                time.monotonic() - start, None)
        return SampleResult(Episode(task.task_id, sample, end_reason="infra_error"), outcome, "")
    grade = grade_patch(task, patch, runtime, cfg.grade_retries, network=cfg.grade_network)
    outcome = SampleOutcome(task.task_id, sample, grade.reward, grade.infra_error, episode.end_reason,
                            episode.num_actions, episode.format_errors, len(patch.encode()), grade.attempts,
                            time.monotonic() - start, patch_error, grade.note)
    return SampleResult(episode, outcome, patch)


class EpisodesStopped(Exception):
    """Raised into a running episode at its next turn once an episode beside it has failed or its
    caller was interrupted."""


class _Stoppable:
    """``policy`` for an episode that ends at its next turn once ``stop`` is set, closing its sandbox
    on the way out."""

    def __init__(self, policy: AgentPolicy, stop: threading.Event):
        self.policy, self.stop = policy, stop

    def act(self, transcript):
        if self.stop.is_set():
            raise EpisodesStopped(f"{transcript.task_id} #{transcript.sample}: stopped with the episodes beside it")
        try:
            return self.policy.act(transcript)
        except BaseException:
            self.stop.set()  # now, not once this episode's sandbox has closed: the others stop at their next turn
            raise


def run_episodes(play: Callable[[object, AgentPolicy], R], jobs: Sequence, policies: Callable[[object], AgentPolicy],
                 workers: int, done: Callable[[int, R], None] | None = None) -> list[R]:
    """``play(job, policy)`` for every job, ``workers`` at a time in threads (0: all at once), with
    ``policies(job)`` as the episode's policy; results in job order, and ``done(index, result)`` as
    each finishes. The first error or an interrupt starts no further job and ends the running ones
    at their next turn (their sandboxes closed): waited for are their current command and turn,
    not the episodes, and then the error is raised."""
    stop = threading.Event()
    results: list = [None] * len(jobs)

    def guarded(job, policy: _Stoppable):
        if stop.is_set():  # a job the pool had already handed out when an episode beside it failed
            raise EpisodesStopped("not started: an episode beside it failed")
        try:
            return play(job, policy)
        except BaseException:
            stop.set()  # here, before this thread takes the next job
            raise

    with ThreadPoolExecutor(max_workers=max(1, workers or len(jobs)), thread_name_prefix="episode") as pool:
        futures = {pool.submit(guarded, job, _Stoppable(policies(job), stop)): i for i, job in enumerate(jobs)}
        try:
            for future in as_completed(futures):
                if isinstance(future.exception(), EpisodesStopped):
                    continue  # an episode the failure stopped: raised is the failure, which is still to come
                results[futures[future]] = result = future.result()
                if done is not None:
                    done(futures[future], result)
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise
    return results


def _progress_line(done: int, total: int, o: SampleOutcome) -> str:
    verdict = f"infra failure ({o.infra_error[:80]})" if o.infra_error else f"reward {o.reward:g}"
    return (f"[{done}/{total}] {o.task_id} #{o.sample}: {verdict}, {o.end_reason} after {o.actions} actions, "
            f"{o.format_errors} format errors, {o.wall_s:.1f}s")


def run_swebench_eval(cfg: SwebenchProConfig, policy: AgentPolicy, ks: list[int], samples: int, out_dir: Path,
                      progress: Callable[[str], None] | None = None, wandb_run=None,
                      groups: Mapping[str, Sequence[str]] | None = None, concurrent: int = 1,
                      play: Playable | None = None, record: Mapping | None = None) -> dict:
    """Evaluate ``policy`` on the configured tasks (``play``, where the caller has checked them already);
    writes the run directory and returns eval.json's content (pass@k also per named group of task ids in
    ``groups``, and ``record``'s entries). ``concurrent``: episodes at once (0: all), each calling
    ``policy.act`` from its own thread, so a policy shared by them must allow that."""
    check_ks(ks, samples)
    runtime, tasks, subset_ids = play if play is not None else playable(cfg)  # before the first episode
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(task, sample) for task in tasks for sample in range(samples)]
    finished = 0

    def done(_: int, result: SampleResult) -> None:
        nonlocal finished
        finished += 1
        write_episode(out_dir, result.episode, result.outcome)
        if progress is not None:
            progress(_progress_line(finished, len(jobs), result.outcome))

    results = run_episodes(lambda job, stoppable: run_sample(*job, stoppable, runtime, cfg), jobs,
                           lambda _: policy, concurrent, done)
    outcomes = [r.outcome for r in results]
    summary = {**summarize(outcomes, ks, samples, cfg.subset, subset_ids, groups), **(record or {})}
    write_results(out_dir, outcomes, summary)
    log_wandb(wandb_run, outcomes, summary, subset_ids)
    return summary
