"""The processes of a run: sampler workers and the trainer worker (each becomes one Ray actor).

They are plain classes so tests and the synchronous reference loop can use them in-process;
``rlmix.orchestration.loop`` wraps them with ``ray.remote``. A sampler worker produces each
request's rows with its task kind's rollout producer (``rlmix.assembly.producers``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from rlmix.assembly.fleet import SamplerSpec, build_sampler
from rlmix.assembly.parts import build_trainer
from rlmix.assembly.producers import Request
from rlmix.assembly.task_kinds import TaskKind
from rlmix.config.schema import TrainerConfig
from rlmix.correction import Correction
from rlmix.metrics.quiet import adopt_worker_env
from rlmix.orchestration.session import GROUP_SIGNALS, session_ending
from rlmix.rollout import Rollouts
from rlmix.seeds import derive_seed
from rlmix.tasks.base import OrderedTask, Task
from rlmix.transport import TensorDict


class NotHeld(RuntimeError):
    """A sampler process does not hold what the driver believes it does, so it refuses the request.

    Ray restarted it while the driver was not looking, from the arguments it was *created* with:
    it holds the initial weights again (and no weights came with the request), or an earlier job
    of a sweep created it and it holds that job's seed, spec and task. The message says which. The
    driver re-initialises it with the current job's arguments where needed, resends the weights
    and serves the request again — never samples from the wrong policy or the wrong job.
    """


def make_request(task: Task, request_id: int, groups: int, seed: int) -> Request:
    """Request ``request_id`` of a run: the same problems and sampler seed whoever serves it."""
    if isinstance(task, OrderedTask):  # a dataset: the request's prompts sit at a fixed position
        problems = tuple(task.sample_at(request_id * groups, groups))
    else:
        problems = tuple(task.sample(groups, seed=derive_seed(seed, "problems", request_id)))
    group_ids = tuple(request_id * groups + j for j in range(groups))
    return Request(request_id, problems, group_ids, derive_seed(seed, "sampler", request_id))


# The directory the run was launched from (the driver's working directory), where a user module
# such as a reward's ``module:function`` is imported from, as in the driver.
LAUNCH_DIR_ENV = "RLMIX_LAUNCH_DIR"


def enter_launch_dir() -> None:
    """Put the run's launch directory first on ``sys.path``. Ray adds only the directory Ray was
    started from, and a process kept for the next job (a held session's next command, run from
    another directory) must import that job's modules."""
    launch = os.environ.get(LAUNCH_DIR_ENV)
    if launch and (not sys.path or sys.path[0] != launch):
        if launch in sys.path:
            sys.path.remove(launch)
        sys.path.insert(0, launch)


def become_worker(run_env: Mapping[str, str] | None) -> None:
    """First thing in an actor's constructor: leave SIGTERM and SIGHUP to the driver, then take on
    the run's worker environment (``rlmix.metrics.quiet.adopt_worker_env``).

    A local Ray instance starts its processes with the two blocked (rlmix.orchestration.session),
    and a blocked signal would stay blocked in what an actor starts, through ``exec`` too: an
    engine's processes and sandbox commands, which should end on SIGTERM as usual. So the actor
    unblocks them and handles them instead (``_left_to_the_driver``), which ``exec`` undoes. A
    signal sent to every process of a run (systemd's default stop, Slurm's ``scancel``) then leaves
    the actors to finish the step the driver is saving; the driver ends them. SIGKILL still ends an
    actor at once (Ray restarts a sampler; the trainer is replaced from its newest checkpoint)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, GROUP_SIGNALS)
    for signum in GROUP_SIGNALS:
        signal.signal(signum, _left_to_the_driver)
    if run_env is not None:
        adopt_worker_env(run_env)


def _left_to_the_driver(signum: int, frame) -> None:
    if session_ending():  # the session ends its processes (Session.close): nothing is left to save, and no one
        return  # sent a signal to report; SIGKILL follows
    print(f"{signal.Signals(signum).name} to actor process {os.getpid()} ignored: the run's driver ends it "
          "once the step in flight is saved; SIGKILL ends it now", file=sys.stderr, flush=True)


class SamplerWorker:
    """One sampler instance: loads published weights between requests, produces scored rollouts."""

    def __init__(self, spec: SamplerSpec, model_dir: str, task: TaskKind, seed: int, threads: int, job: int = 0,
                 run_env: Mapping[str, str] | None = None):
        """``task``: the run's task and its kind, which makes the rollout producer (``RunPlan.task``).
        ``job``: the token of the job whose arguments these are; every request carries its own
        job's token, so a process Ray re-created from an earlier job's arguments is recognised.
        ``run_env``: the run's worker environment (``rlmix.metrics.quiet.adopt_worker_env``)."""
        from rlmix.models.tokenizer_file import load_fast_tokenizer

        become_worker(run_env)
        torch.set_num_threads(threads or 1)
        enter_launch_dir()  # before the task is made: its reward may be the user's module
        self._job = job
        self._served = False  # no request yet: what a process Ray re-creates also says (generate)
        self.spec = spec
        self.sampler = build_sampler(spec, model_dir, seed)
        self.tokenizer = load_fast_tokenizer(model_dir)
        self.produce = task.producer(seed, self.tokenizer, spec.pool)

    def generate(
        self, request: Request, group_size: int, weights: Mapping[str, torch.Tensor] | None, version: int,
        job: int = 0, held: int | None = None, served: bool = False,
    ) -> Rollouts:
        """``held``: the version the driver believes this process holds (None: it does not know).
        ``served``: whether the driver has had a request served by this sampler since it was made."""
        # Checked before loading: weights loaded into another job's sampler would be served wrongly.
        if job != self._job:
            raise NotHeld(f"holds job {self._job}'s arguments, asked to sample for job {job}")
        # A process Ray re-created since its last request would serve this one rightly (with the
        # weights sent along, or with the initial ones it holds when the old process held no others),
        # but its death would go uncounted: it refuses, and the driver counts the restart.
        if served and not self._served:
            raise NotHeld("was re-created since its last request (this process has served none)")
        if held is not None and self.sampler.version != held:
            raise NotHeld(f"holds weight version {self.sampler.version}, last sent version {held}")
        self._served = True
        if weights is not None:
            self.sampler.load_weights(weights, version)
        elif self.sampler.version != version:
            raise NotHeld(f"holds weight version {self.sampler.version}, asked to sample at {version} "
                          "without weights")
        params = dataclasses.replace(self.spec.params, seed=request.seed)
        return self.produce(self.sampler, request, group_size, params)

    def version(self) -> int:
        return self.sampler.version

    def job(self) -> int:
        """The token of the job whose arguments this process holds."""
        return self._job

    def reset(self, env_vars: Mapping[str, str], *args) -> int:
        """Become a new worker in this process (the next job of a sweep); returns the version."""
        self.sampler.close()
        self.__init__(*args, run_env=env_vars)
        return self.sampler.version


class TrainerWorker:
    """The trainer process: wraps a backend and hands out versioned weights."""

    def __init__(self, model_dir: str, cfg: TrainerConfig, correction: Correction, seed: int,
                 run_env: Mapping[str, str] | None = None):
        become_worker(run_env)
        if cfg.num_threads:  # None only outside a run (the runner always assigns a number)
            torch.set_num_threads(cfg.num_threads)
        self.trainer = build_trainer(model_dir, cfg, correction, seed)

    def train_step(self, batch: Rollouts) -> tuple[int, dict[str, float]]:
        metrics = self.trainer.train_step(batch)
        return self.trainer.version, metrics

    def version(self) -> int:
        return self.trainer.version

    def reset(self, env_vars: Mapping[str, str], *args) -> int:
        """Become a new trainer in this process (the next job of a sweep); returns the version."""
        close = getattr(self.trainer, "close", None)
        if close is not None:
            close()
        self.__init__(*args, run_env=env_vars)
        return self.trainer.version

    def published_weights(self) -> dict[str, torch.Tensor]:
        return TensorDict(self.trainer.published_weights())  # to every sampler as one buffer

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(Path(path))

    def load_checkpoint(self, path: str) -> int:
        self.trainer.load_checkpoint(Path(path))
        return self.trainer.version
