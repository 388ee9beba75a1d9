"""The ``local`` runtime: a temporary working copy, each command isolated by bubblewrap (``isolation.py``).

Convention: the task carries its repository as ``environment/repo/`` (the Dockerfile copies it to
its WORKDIR). A sandbox is a host temporary directory ``{repo/, tests/, logs/, home/, tmp/}``. Inside
the sandbox a command sees them as the task's WORKDIR (writable), ``/tests`` (read-only: grading
copies the task's tests there from the host, where no command can reach them), ``/logs``, ``$HOME``
and ``/tmp`` (writable), over a read-only system and nothing else of the host; no network unless
asked; its own PID namespace, so it cannot signal host processes and nothing it starts outlives it.
Commands run as ``nobody`` when the runner is root (the working copy is handed to it), with
RLIMIT_AS / RLIMIT_NPROC / RLIMIT_CPU on top. Output is read in chunks and capped.

Where bwrap cannot run (not installed, or the kernel forbids its namespaces) the runtime refuses to
start, with one line naming the fix, unless ``task.trusted=true``: then commands run as plain
subprocesses in their own process group (no network through ``unshare -n`` where permitted) with
host paths, which isolates resources, not trust.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlmix.agentic.harbor import DEFAULT_WORKDIR, HarborTask
from rlmix.agentic.isolation import PATH, Bind, bwrap_argv, isolation_problem, sandbox_user, sandbox_workdir
from rlmix.agentic.sandbox import DEFAULT_OUTPUT_CAP_BYTES, ExecResult, InfraError, read_capped
from rlmix.errors import ConfigError

log = logging.getLogger(__name__)

TESTS_DIR, LOGS_DIR, HOME_DIR, TMP_DIR = "/tests", "/logs", "/home/sandbox", "/tmp"
NAMESPACE_EXIT_WAIT_S = 30.0  # the kernel kills and reaps a namespace's processes; a bound, never reached


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


@dataclass(frozen=True)
class LocalLimits:
    memory_mb: int  # RLIMIT_AS
    max_procs: int  # RLIMIT_NPROC (the kernel ignores it for root)
    cpu_s: int  # RLIMIT_CPU
    output_cap_bytes: int  # command output kept (first and last halves)


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


def _open_ns_init(info_fd: int, bwrap_pid: int) -> int | None:
    """A pidfd on the PID namespace's init (bwrap's child), from bwrap's ``--info-fd``; None if it is gone.

    A pidfd names one process for good, so signalling it later can never hit a recycled pid; the
    parent check makes sure it was opened on bwrap's child and not on a pid recycled before that.
    """
    with os.fdopen(info_fd, "rb") as f:  # bwrap writes it and closes it as soon as the sandbox exists
        data = f.read()
    try:
        pid = int(json.loads(data)["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (ValueError, KeyError, TypeError, OSError):
        return None  # bwrap failed before it started the sandbox (its exit says why), or it already ended
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    except (OSError, StopIteration, ValueError):
        ppid = -1
    if ppid != bwrap_pid:
        os.close(pidfd)
        return None
    return pidfd


def _end_namespace(pidfd: int) -> None:
    """SIGKILL the namespace's init and wait until it is gone.

    When a PID namespace's init dies, the kernel kills every process in the namespace and waits for
    all of them before the init's exit is reported: once the pidfd reads as exited, nothing is left.
    """
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    select.select([pidfd], [], [], NAMESPACE_EXIT_WAIT_S)
    os.close(pidfd)


def _kill(pid: int, ns_init: int | None) -> None:
    """SIGKILL the command: its whole PID namespace, then its process group (bwrap, or unisolated children)."""
    if ns_init is not None:
        _end_namespace(os.dup(ns_init))
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _searchable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in (path.resolve(), *path.resolve().parents))


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


@functools.cache
def _warn_unisolated(problem: str) -> None:
    log.warning("task.trusted=true and %s: agent commands run without isolation", problem)


class LocalSandbox:
    """One working copy; see the module docstring. ``isolated=False`` only for trusted tasks."""

    def __init__(self, task: HarborTask, limits: LocalLimits, network: bool, isolated: bool):
        if not task.repo_dir.is_dir():
            raise ConfigError(f"task {task.task_id} has no environment/repo/ directory, which the local "
                              f"runtime copies; use task.runtime=docker")
        self._user = sandbox_user() if isolated else {}
        parent = tempfile.gettempdir()
        if self._user and not _searchable_by_others(Path(parent)):
            parent = "/tmp"  # bwrap, run as the sandbox user, must reach the working copy to mount it
        self.root = Path(tempfile.mkdtemp(prefix=f"rlmix-{task.task_id[:40]}-", dir=parent))
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
        self._limits, self._network, self._isolated = limits, network, isolated

    def _argv(self, command: str, info_fd: int | None) -> list[str]:
        if info_fd is None:
            return [*(() if self._network else no_network_prefix()), "bash", "-c", command]
        binds = [Bind(str(self.root / d), p, writable=d != "tests")
                 for p, d in zip((self._tmp, self._home, self.logs_dir, self.tests_dir, self.workdir),
                                 ("tmp", "home", "logs", "tests", "repo"))]
        return [*bwrap_argv(binds, self.workdir, self._network), "--info-fd", str(info_fd), "bash", "-c", command]

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        path = PATH if self._isolated else os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": path, "HOME": self._home, "TMPDIR": self._tmp, "LANG": "C.UTF-8", "APP_DIR": self.workdir,
               "TESTS_DIR": self.tests_dir, "LOGS_DIR": self.logs_dir, "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra or {})
        return env

    def run(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult:
        start = time.monotonic()
        info_r, info_w = os.pipe() if self._isolated else (None, None)
        try:
            proc = subprocess.Popen(self._argv(command, info_w), cwd=self.root / "repo", env=self._env(env),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, pass_fds=() if info_w is None else (info_w,),
                                    preexec_fn=functools.partial(_limit_child, self._limits), **self._user)
        except (OSError, subprocess.SubprocessError) as e:  # fork failed, working copy gone
            if info_r is not None:
                os.close(info_r)
            raise InfraError(f"could not start a command in {self.root}: {e}") from e
        finally:
            if info_w is not None:
                os.close(info_w)
        ns_init = None if info_r is None else _open_ns_init(info_r, proc.pid)
        # Called at a timeout and after every command: a background child dies with its command.
        # read_capped leaves bwrap (or bash) unreaped, so its process group id is still ours.
        kill = functools.partial(_kill, proc.pid, ns_init)
        try:
            out, timed_out = read_capped(proc, timeout_s, self._limits.output_cap_bytes, kill)
        finally:
            kill()
            if ns_init is not None:
                os.close(ns_init)
            proc.wait()
        return ExecResult(exit_code=-1 if timed_out else proc.returncode,
                          output=out.decode("utf-8", errors="replace"), timed_out=timed_out,
                          duration_s=time.monotonic() - start)

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

    def read_file(self, sandbox_path: str) -> bytes | None:
        try:
            target = self._host(sandbox_path)
        except InfraError:
            return None
        return target.read_bytes() if target.is_file() else None

    def close(self) -> None:
        # Every command's processes died with it (see run); only the files remain.
        shutil.rmtree(self.root, ignore_errors=True)


class LocalRuntime:
    """Builds nothing; each ``start`` copies ``environment/repo/`` into a fresh temporary directory.

    ``cpu_s=None`` sets RLIMIT_CPU to twice the longer of ``turn_timeout_s`` and the task's verifier
    timeout, so only a runaway (not a slow test suite) meets it before the wall-clock limit.
    ``trusted=True`` permits running without isolation where bwrap cannot run (never otherwise).
    """

    def __init__(self, memory_mb: int | None, max_procs: int, cpu_s: int | None, turn_timeout_s: float,
                 trusted: bool = False, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES):
        self._memory_mb, self._max_procs, self._cpu_s = memory_mb, max_procs, cpu_s
        self._turn_timeout_s, self._trusted, self._output_cap = turn_timeout_s, trusted, output_cap_bytes

    def unavailable(self) -> str | None:
        problem = isolation_problem()
        if problem is None or self._trusted:
            return None
        return (f"task.runtime=local isolates agent commands with bubblewrap, but {problem}: install it "
                f"(`make setup` as root, or `apt-get install bubblewrap`), or set task.trusted=true for tasks "
                f"you wrote yourself")

    def check(self, task: HarborTask) -> str | None:
        if not task.repo_dir.is_dir():
            return (f"task {task.task_id} has no environment/repo/ directory, which the local runtime "
                    f"copies; use task.runtime=docker")
        return None

    def prepare(self, task: HarborTask) -> None:
        problem = self.unavailable() or self.check(task)
        if problem:
            raise ConfigError(problem)

    def start(self, task: HarborTask, network: bool) -> LocalSandbox:
        self.prepare(task)  # never degrade silently: an untrusted task without isolation is refused here too
        problem = isolation_problem()
        if problem is not None:
            _warn_unisolated(problem)
        cpu_s = self._cpu_s or int(2 * max(self._turn_timeout_s, task.verifier_timeout_s)) + 1
        limits = LocalLimits(memory_mb=self._memory_mb or task.memory_mb, max_procs=self._max_procs, cpu_s=cpu_s,
                             output_cap_bytes=self._output_cap)
        return LocalSandbox(task, limits, network, isolated=problem is None)
