"""The ``local`` runtime: a temporary working copy, its commands isolated by bubblewrap (``rlmix/isolation``).

Convention: the task carries its repository as ``environment/repo/`` (the Dockerfile copies it to
its WORKDIR). A sandbox is a host temporary directory ``{repo/, tests/, logs/, home/, tmp/}``. Inside
the sandbox a command sees them as the task's WORKDIR (writable), ``/tests`` (read-only: grading
copies the task's tests there from the host, where no command can reach them), ``/logs``, ``$HOME``
and ``/tmp`` (writable), over a read-only system and nothing else of the host; no network unless
asked; its own PID namespace, so it cannot signal host processes and nothing it starts outlives it.
Commands run as ``nobody`` when the runner is root (the working copy is handed to it), with
RLIMIT_AS / RLIMIT_NPROC / RLIMIT_CPU on top. Output is read in chunks and capped. A working copy's
commands share one sandbox whose init clears it after each (``rlmix.isolation.resident``;
``resident=False``: a sandbox per command).

Where bwrap cannot run (not installed, or the kernel forbids its namespaces) the runtime refuses to
start, with one line naming the fix, unless ``task.trusted=true``: then commands run as plain
subprocesses in their own process group (no network through ``unshare -n`` where permitted) with
host paths, which isolates resources, not trust.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rlmix.agentic.harbor import DEFAULT_WORKDIR, HarborTask
from rlmix.agentic.sandbox import DEFAULT_OUTPUT_CAP_BYTES, ExecResult, FileTooLarge, InfraError
from rlmix.isolation.bwrap import (BUSY, PATH, Bind, isolation_fix, isolation_problem, sandbox_user,
                                  sandbox_workdir)
from rlmix.isolation.scratch import scratch_dir
from rlmix.isolation.process import Finished, Isolation, LocalLimits, run_limited
from rlmix.isolation.resident import ResidentShell, ResidentUnavailable
from rlmix.errors import ConfigError

log = logging.getLogger(__name__)

TESTS_DIR, LOGS_DIR, HOME_DIR, TMP_DIR = "/tests", "/logs", "/home/sandbox", "/tmp"


@functools.cache
def no_network_prefix() -> tuple[str, ...]:
    """``unshare -n`` (or ``-rn`` through a user namespace) if either drops the network here; checked once.

    Only for trusted tasks without bwrap; empty when neither is permitted (logged once).
    """
    for flags in ("-n", "-rn"):
        try:
            if subprocess.run(["unshare", flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return ("unshare", flags)
        except (OSError, subprocess.SubprocessError):
            pass
    log.warning("local runtime: unshare -n is not permitted here; trusted commands keep the host network")
    return ()


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


@functools.cache
def _warn_per_command(problem: str) -> None:
    log.warning("local runtime: %s; each command gets a sandbox of its own (slower, as isolated)", problem)


@functools.cache
def _warn_unisolated(problem: str) -> None:
    log.warning("task.trusted=true and %s: agent commands run without isolation", problem)


class LocalSandbox:
    """One working copy; see the module docstring. ``isolated=False`` only for trusted tasks; ``proc=False``:
    its commands see no ``/proc`` (unisolated ones see the host's)."""

    def __init__(self, task: HarborTask, limits: LocalLimits, network: bool, isolated: bool,
                 resident: bool = True, proc: bool = True):
        if not task.repo_dir.is_dir():
            raise ConfigError(f"task {task.task_id} has no environment/repo/ directory, which the local "
                              f"runtime copies; use task.runtime=docker")
        self._user = sandbox_user() if isolated else {}
        self.root = Path(tempfile.mkdtemp(prefix=f"rlmix-{task.task_id[:40]}-", dir=scratch_dir()))
        try:
            shutil.copytree(task.repo_dir, self.root / "repo", symlinks=True)
            for d in ("tests", "logs/verifier", "home", "tmp"):
                (self.root / d).mkdir(parents=True, exist_ok=True)
            self._give(self.root)  # commands run as an unprivileged user: its working copy
        except OSError as e:
            shutil.rmtree(self.root, ignore_errors=True)
            raise InfraError(f"could not create the working copy of {task.task_id}: {e}") from e
        inside = ((sandbox_workdir(task.workdir, DEFAULT_WORKDIR), TESTS_DIR, LOGS_DIR, HOME_DIR, TMP_DIR)
                  if isolated else tuple(str(self.root / d) for d in ("repo", "tests", "logs", "home", "tmp")))
        self.workdir, self.tests_dir, self.logs_dir, self._home, self._tmp = inside
        # sandbox path -> host path, longest first; tests/ is read-only inside.
        self._mounts = sorted(((p, self.root / d) for p, d in zip(inside, ("repo", "tests", "logs", "home", "tmp"))),
                              key=lambda m: -len(m[0]))
        self._limits, self._network = limits, network
        binds = [Bind(str(self.root / d), p, writable=d != "tests")
                 for p, d in zip((self._tmp, self._home, self.logs_dir, self.tests_dir, self.workdir),
                                 ("tmp", "home", "logs", "tests", "repo"))]
        self._isolation = Isolation(binds, self.workdir, network, proc=proc) if isolated else None
        # One namespace for all of the sandbox's commands (rlmix.isolation.resident), started at the first.
        self._shell = (ResidentShell(self._isolation, self.root / "repo", limits, self._user)
                       if isolated and resident else None)

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        path = PATH if self._isolation is not None else os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": path, "HOME": self._home, "TMPDIR": self._tmp, "LANG": "C.UTF-8", "APP_DIR": self.workdir,
               "TESTS_DIR": self.tests_dir, "LOGS_DIR": self.logs_dir, "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra or {})
        return env

    def run(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult:
        try:
            done = self._run(command, timeout_s, self._env(env))
        except (OSError, subprocess.SubprocessError) as e:  # fork failed, working copy gone
            raise InfraError(f"could not start a command in {self.root}: {e}") from e
        return ExecResult(exit_code=done.exit_code, output=done.output.decode("utf-8", errors="replace"),
                          timed_out=done.timed_out, duration_s=done.duration_s)

    def _run(self, command: str, timeout_s: float, env: dict[str, str]) -> Finished:
        if self._shell is not None:
            try:
                return self._shell.run(["bash", "-c", command], env, timeout_s)
            except ResidentUnavailable as e:
                _warn_per_command(str(e))
                self._shell = None
        argv = ["bash", "-c", command]
        if self._isolation is None and not self._network:  # unisolated (trusted): the network off where permitted
            argv = [*no_network_prefix(), *argv]
        return run_limited(argv, self._isolation, self.root / "repo", env, self._limits, timeout_s, self._user)

    def _host(self, sandbox_path: str) -> Path:
        """The host path of a sandbox path; InfraError if it (or a link in it) leads out of the sandbox."""
        p = sandbox_path if sandbox_path.startswith("/") else f"{self.workdir}/{sandbox_path}"
        for inside, host in self._mounts:
            if p == inside or p.startswith(inside.rstrip("/") + "/"):
                target = host / p[len(inside):].lstrip("/")
                # A command may have planted a symlink: never follow one to a host file.
                if target.resolve().is_relative_to(host.resolve()):
                    return target
        raise InfraError(f"{sandbox_path} is not inside the sandbox")

    def _give(self, path: Path) -> None:
        """Hand what we copied in to the sandbox user (read-only mounts stay read-only regardless)."""
        if self._user:
            _chown_tree(path, self._user["user"], self._user["group"])

    def put_dir(self, host_dir: Path, sandbox_dir: str) -> None:
        target = self._host(sandbox_dir)
        try:
            shutil.copytree(host_dir, target, symlinks=True, dirs_exist_ok=True)
            self._give(target)
        except OSError as e:
            raise InfraError(f"could not copy {host_dir} into the sandbox: {e}") from e

    def put_file(self, sandbox_path: str, data: bytes) -> None:
        target = self._host(sandbox_path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            self._give(target.parent)
        except OSError as e:
            raise InfraError(f"could not write {target}: {e}") from e

    def read_file(self, sandbox_path: str, max_bytes: int) -> bytes | None:
        try:
            target = self._host(sandbox_path)
        except InfraError:
            return None
        if not target.is_file():
            return None
        with target.open("rb") as f:
            data = f.read(max_bytes + 1)  # never more: a sparse file of gigabytes costs a command nothing
            if len(data) > max_bytes:
                raise FileTooLarge(f"{sandbox_path} has {os.fstat(f.fileno()).st_size} bytes, more than the "
                                   f"{max_bytes} read")
        return data

    def close(self) -> None:
        # Every command's processes died with it (see run); the resident namespace goes now.
        if self._shell is not None:
            self._shell.close()
        shutil.rmtree(self.root, ignore_errors=True)


class LocalRuntime:
    """Builds nothing; each ``start`` copies ``environment/repo/`` into a fresh temporary directory.

    ``cpu_s=None`` sets RLIMIT_CPU to twice the longer of ``turn_timeout_s`` and the task's verifier
    timeout, so only a runaway (not a slow test suite) meets it before the wall-clock limit.
    ``trusted=True`` permits running without isolation where bwrap cannot run (never otherwise).
    """

    def __init__(self, memory_mb: int | None, max_procs: int, cpu_s: int | None, turn_timeout_s: float,
                 trusted: bool = False, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES, resident: bool = True):
        self._memory_mb, self._max_procs, self._cpu_s, self._resident = memory_mb, max_procs, cpu_s, resident
        self._turn_timeout_s, self._trusted, self._output_cap = turn_timeout_s, trusted, output_cap_bytes

    def unavailable(self) -> str | None:
        problem = isolation_problem()
        if problem is None or self._trusted:
            return None
        return (f"task.runtime=local isolates agent commands with bubblewrap, but {problem}: "
                f"{isolation_fix(problem)}, or set task.trusted=true for tasks you wrote yourself")

    def check(self, task: HarborTask) -> str | None:
        if not task.repo_dir.is_dir():
            return (f"task {task.task_id} has no environment/repo/ directory, which the local runtime "
                    f"copies; use task.runtime=docker")
        return None

    def prepare(self, task: HarborTask) -> None:
        problem = self.unavailable() or self.check(task)
        if problem:
            raise ConfigError(problem)

    def start(self, task: HarborTask, network: bool, proc: bool = True) -> LocalSandbox:
        problem = isolation_problem()
        if problem is not None and problem.startswith(BUSY):  # not this machine's lack: the episode is retried
            raise InfraError(f"could not start a sandbox for {task.task_id}: {problem}")
        self.prepare(task)  # never degrade silently: an untrusted task without isolation is refused here too
        if problem is not None:
            _warn_unisolated(problem)
        cpu_s = self._cpu_s or int(2 * max(self._turn_timeout_s, task.verifier_timeout_s)) + 1
        limits = LocalLimits(memory_mb=self._memory_mb or task.memory_mb, max_procs=self._max_procs, cpu_s=cpu_s,
                             output_cap_bytes=self._output_cap)
        return LocalSandbox(task, limits, network, isolated=problem is None, resident=self._resident, proc=proc)
