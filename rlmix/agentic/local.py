"""The ``local`` runtime: a temporary working copy and limited subprocesses (tests, embedded tasks).

Convention: the task carries its repository as ``environment/repo/`` (the Dockerfile copies it to
its WORKDIR). A sandbox is a temporary directory ``{repo/, tests/, logs/, home/}``; each command runs
as ``bash -c`` in ``repo/`` in its own process group, with RLIMIT_AS / RLIMIT_NPROC / RLIMIT_CPU set
in the child, and with no network (``unshare -n``) when the platform allows it. On a timeout the
whole process group is killed, so ``sleep 1000`` (and anything it spawned) cannot outlive its limit.
This isolates resources, not trust: the local runtime is for tasks you wrote, the docker runtime for
the benchmark.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlmix.agentic.harbor import HarborTask
from rlmix.agentic.sandbox import ExecResult, InfraError
from rlmix.errors import ConfigError

log = logging.getLogger(__name__)


@functools.cache
def no_network_prefix() -> tuple[str, ...]:
    """``unshare -n`` (or ``-rn`` through a user namespace) if either drops the network here; checked once.

    Empty when neither is permitted: commands then keep the host network, which is logged once.
    """
    for flags in ("-n", "-rn"):
        try:
            if subprocess.run(["unshare", flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return ("unshare", flags)
        except (OSError, subprocess.SubprocessError):
            pass
    log.warning("local runtime: unshare -n is not permitted here; commands keep the host network")
    return ()


@dataclass(frozen=True)
class LocalLimits:
    memory_mb: int  # RLIMIT_AS
    max_procs: int  # RLIMIT_NPROC (the kernel ignores it for root)
    cpu_s: int  # RLIMIT_CPU


def _lower_limit(which: int, value: int) -> None:
    # Never above the inherited hard limit: an unprivileged process may not raise it.
    hard = resource.getrlimit(which)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


def _limit_child(limits: LocalLimits) -> None:
    # Runs in the child between fork and exec: no logging, no locks.
    _lower_limit(resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024)
    _lower_limit(resource.RLIMIT_NPROC, limits.max_procs)
    _lower_limit(resource.RLIMIT_CPU, limits.cpu_s)


class LocalSandbox:
    """One working copy; see the module docstring."""

    def __init__(self, task: HarborTask, limits: LocalLimits, network: bool):
        if not task.repo_dir.is_dir():
            raise ConfigError(f"task {task.task_id} has no environment/repo/ directory, which the local "
                              f"runtime copies; use task.runtime=docker")
        self.root = Path(tempfile.mkdtemp(prefix=f"rlmix-{task.task_id[:40]}-"))
        try:
            shutil.copytree(task.repo_dir, self.root / "repo", symlinks=True)
            for d in ("tests", "logs/verifier", "home"):
                (self.root / d).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            shutil.rmtree(self.root, ignore_errors=True)
            raise InfraError(f"could not create the working copy of {task.task_id}: {e}") from e
        self.workdir = str(self.root / "repo")
        self.tests_dir = str(self.root / "tests")
        self.logs_dir = str(self.root / "logs")
        self._limits = limits
        self._prefix = () if network else no_network_prefix()

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root / "home"),
               "LANG": "C.UTF-8", "APP_DIR": self.workdir, "TESTS_DIR": self.tests_dir,
               "LOGS_DIR": self.logs_dir, "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra or {})
        return env

    def run(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult:
        argv = [*self._prefix, "bash", "-c", command]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=self.workdir, env=self._env(env), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=functools.partial(_limit_child, self._limits))
        except (OSError, subprocess.SubprocessError) as e:  # fork failed, working copy gone
            raise InfraError(f"could not start a command in {self.root}: {e}") from e
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: children of a hung command too
            try:
                out, _ = proc.communicate(timeout=5.0)
            except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds the pipe
                proc.kill()
                out = b""
            timed_out = True
        return ExecResult(exit_code=-1 if timed_out else proc.returncode,
                          output=out.decode("utf-8", errors="replace"), timed_out=timed_out,
                          duration_s=time.monotonic() - start)

    def _host(self, sandbox_path: str) -> Path:
        p = Path(sandbox_path)
        return p if p.is_absolute() else Path(self.workdir) / p

    def put_dir(self, host_dir: Path, sandbox_dir: str) -> None:
        try:
            shutil.copytree(host_dir, self._host(sandbox_dir), symlinks=True, dirs_exist_ok=True)
        except OSError as e:
            raise InfraError(f"could not copy {host_dir} into the sandbox: {e}") from e

    def put_file(self, sandbox_path: str, data: bytes) -> None:
        target = self._host(sandbox_path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as e:
            raise InfraError(f"could not write {target}: {e}") from e

    def read_file(self, sandbox_path: str) -> bytes | None:
        target = self._host(sandbox_path)
        return target.read_bytes() if target.is_file() else None

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class LocalRuntime:
    """Builds nothing; each ``start`` copies ``environment/repo/`` into a fresh temporary directory.

    ``cpu_s=None`` sets RLIMIT_CPU to twice the longer of ``turn_timeout_s`` and the task's verifier
    timeout, so only a runaway (not a slow test suite) meets it before the wall-clock limit.
    """

    def __init__(self, memory_mb: int | None, max_procs: int, cpu_s: int | None, turn_timeout_s: float):
        self._memory_mb, self._max_procs, self._cpu_s = memory_mb, max_procs, cpu_s
        self._turn_timeout_s = turn_timeout_s

    def check(self, task: HarborTask) -> str | None:
        if not task.repo_dir.is_dir():
            return (f"task {task.task_id} has no environment/repo/ directory, which the local runtime "
                    f"copies; use task.runtime=docker")
        return None

    def prepare(self, task: HarborTask) -> None:
        problem = self.check(task)
        if problem:
            raise ConfigError(problem)

    def start(self, task: HarborTask, network: bool) -> LocalSandbox:
        cpu_s = self._cpu_s or int(2 * max(self._turn_timeout_s, task.verifier_timeout_s)) + 1
        limits = LocalLimits(memory_mb=self._memory_mb or task.memory_mb, max_procs=self._max_procs, cpu_s=cpu_s)
        return LocalSandbox(task, limits, network)
