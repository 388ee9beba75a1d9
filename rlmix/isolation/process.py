"""One command under limits: rlimits, a wall-clock timeout, capped output, and (isolated) its own PID namespace.

``run_limited`` is the one way untrusted commands start: the agentic ``local`` runtime runs each
agent and verifier command through it, the ``python_tests`` reward each graded sample. Isolated, the
command runs under ``bwrap`` (``bwrap.py``); when it ends or times out, the namespace's init is
killed, and with it every process the command started.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import select
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlmix.isolation.bwrap import Bind, bwrap_argv, on_system_dirs

NAMESPACE_EXIT_WAIT_S = 30.0  # the kernel kills and reaps a namespace's processes; a bound, never reached
_CHUNK = 1 << 16


@dataclass(frozen=True)
class LocalLimits:
    memory_mb: int  # RLIMIT_AS
    max_procs: int  # RLIMIT_NPROC (the kernel ignores it for root)
    cpu_s: int  # RLIMIT_CPU
    output_cap_bytes: int  # command output kept (first and last halves)
    file_size_mb: int | None = None  # RLIMIT_FSIZE: no file written grows past it (None: no limit)


@dataclass(frozen=True)
class Isolation:
    binds: Sequence[Bind]  # laid over the read-only system, in order
    chdir: str  # the working directory inside
    network: bool
    die_with_parent: bool = True  # bwrap_argv's: killed when the thread that started it ends
    proc: bool = True  # bwrap_argv's: a /proc inside


class SandboxNotStarted(OSError):
    """bwrap ended before it created the sandbox (e.g. it could not fork: the sandbox user is out of
    processes), so the command never ran: an infrastructure failure, not the command's outcome."""


@dataclass(frozen=True)
class Finished:
    exit_code: int  # -1 when the command was killed at its time limit
    output: bytes  # stdout and stderr interleaved, capped
    timed_out: bool
    duration_s: float


def _lowered(which: int, value: int) -> int:
    """``value``, but never above the inherited hard limit: an unprivileged process may not raise it."""
    hard = resource.getrlimit(which)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _rlimits(limits: LocalLimits) -> list[tuple[int, str, int]]:
    """(resource, prlimit option, value) of each limit a command runs under."""
    found = [(resource.RLIMIT_AS, "--as", _lowered(resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024)),
             (resource.RLIMIT_NPROC, "--nproc", _lowered(resource.RLIMIT_NPROC, limits.max_procs)),
             (resource.RLIMIT_CPU, "--cpu", _lowered(resource.RLIMIT_CPU, limits.cpu_s))]
    if limits.file_size_mb is not None:
        found.append((resource.RLIMIT_FSIZE, "--fsize", _lowered(resource.RLIMIT_FSIZE, limits.file_size_mb << 20)))
    return found


def _limit_child(rlimits: list[tuple[int, str, int]]) -> None:
    # Runs in the child between fork and exec: no logging, no locks.
    for which, _, value in rlimits:
        resource.setrlimit(which, (value, value))


@functools.cache
def _exec_chain_tools() -> tuple[str, str] | None:
    """util-linux's ``prlimit`` and ``setpriv``, where both are installed (``_launch``)."""
    tools = shutil.which("prlimit"), shutil.which("setpriv")
    return tools if all(tools) else None


def _inside_the_sandbox(rlimits: list[tuple[int, str, int]]) -> tuple[list[str], list[tuple[int, str, int]]]:
    """(a prefix for the command inside bwrap that sets RLIMIT_NPROC, the limits left to set outside).

    RLIMIT_NPROC counts every process (and thread) of a user, not of one sandbox. Set on bwrap, it
    counted the user's others too: a runner that is not root, with 64 of its own (a run's Ray
    processes hold about 280 threads), could not start one, and sandboxes running at once shared one
    budget. Set inside, by ``prlimit`` run in the sandbox's own user namespace, it counts that
    namespace's processes (Linux 5.14 and later; before, the user's again). Without ``prlimit`` on
    the system directories the sandbox sees, every limit stays outside.
    """
    tools = _exec_chain_tools()
    if tools is None or not on_system_dirs(tools[0]):
        return [], rlimits
    inside = [f"{option}={value}" for which, option, value in rlimits if which == resource.RLIMIT_NPROC]
    return [tools[0], *inside, "--"], [r for r in rlimits if r[0] != resource.RLIMIT_NPROC]


def _launch(argv: Sequence[str], rlimits: list[tuple[int, str, int]], user: Mapping | None) -> tuple[list[str], dict]:
    """``argv`` and the ``Popen`` arguments that start it under ``rlimits`` (``_rlimits``), as ``user``
    (``sandbox_user``).

    With ``prlimit`` and ``setpriv`` the limits and the user switch are set by the commands that exec
    ``argv`` (same process, so its pid and process group stay the ones ``Popen`` returns), and
    ``Popen`` may vfork: forking this process instead copies its page tables while holding the
    interpreter lock, ~10 ms for a sampler process here, during which the thread generating the
    other episodes' turns stands still. Without them, a ``preexec_fn`` and ``Popen``'s own ``user``.
    """
    tools = _exec_chain_tools()
    if tools is None:
        return list(argv), {"preexec_fn": functools.partial(_limit_child, rlimits), **(user or {})}
    prlimit, setpriv = tools
    chain = [prlimit, *(f"{option}={value}" for _, option, value in rlimits), "--"]
    if user:
        chain += [setpriv, f"--reuid={user['user']}", f"--regid={user['group']}", "--clear-groups", "--"]
    return [*chain, *argv], {}


def _open_ns_init(info_fd: int, bwrap_pid: int) -> tuple[bool, int | None]:
    """(started, pidfd): whether bwrap created the sandbox, and a pidfd on the PID namespace's init
    (bwrap's child: the command), from ``--info-fd``; None if it is already gone.

    A pidfd names one process for good, so signalling it later can never hit a recycled pid; the
    parent check makes sure it was opened on bwrap's child and not on a pid recycled before that.
    """
    with os.fdopen(info_fd, "rb") as f:  # bwrap writes it and closes it as soon as the sandbox exists
        data = f.read()
    try:
        pid = int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return False, None  # bwrap failed before it started the sandbox (its output says why)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return True, None  # the command already ended
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    except (OSError, StopIteration, ValueError):
        ppid = -1
    if ppid != bwrap_pid:
        os.close(pidfd)
        return True, None
    return True, pidfd


def end_namespace(pidfd: int) -> None:
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


def kill_namespace(pid: int, ns_init: int | None) -> None:
    """SIGKILL the command: its whole PID namespace, then its process group (bwrap, or unisolated children)."""
    if ns_init is not None:
        end_namespace(os.dup(ns_init))
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):  # the command ended (or closed stdin) early
        pass


def start_limited(argv: Sequence[str], isolation: Isolation | None, cwd: str | Path, env: Mapping[str, str],
                  limits: LocalLimits, user: Mapping | None, stdin: int,
                  stderr: int) -> tuple[subprocess.Popen, int | None]:
    """(process, pidfd on its PID namespace's init or None): ``argv`` started under ``limits``, under
    ``bwrap`` unless ``isolation`` is None, in a process group of its own, stdout a pipe.

    ``stdin`` and ``stderr`` are ``Popen``'s. Raises OSError or SubprocessError when it cannot start,
    and ``SandboxNotStarted`` (with bwrap's message) when bwrap could not create the sandbox.
    """
    info_r, info_w = os.pipe() if isolation is not None else (None, None)
    rlimits = _rlimits(limits)
    if isolation is not None:
        inside, rlimits = _inside_the_sandbox(rlimits)
        argv = [*bwrap_argv(isolation.binds, isolation.chdir, isolation.network, isolation.die_with_parent,
                            isolation.proc),
                "--info-fd", str(info_w), *inside, *argv]
    argv, how = _launch(argv, rlimits, user)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
                                start_new_session=True, pass_fds=() if info_w is None else (info_w,), **how)
    except (OSError, subprocess.SubprocessError):
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    started, ns_init = (True, None) if info_r is None else _open_ns_init(info_r, proc.pid)
    if not started:
        said = proc.stdout if stderr == subprocess.STDOUT else proc.stderr
        message = said.read(_CHUNK).decode("utf-8", errors="replace").strip() if said is not None else ""
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        raise SandboxNotStarted(f"the sandbox did not start: {message or f'bwrap exited {proc.returncode}'}")
    return proc, ns_init


def run_limited(argv: Sequence[str], isolation: Isolation | None, cwd: str | Path, env: Mapping[str, str],
                limits: LocalLimits, timeout_s: float, user: Mapping | None = None,
                stdin: bytes | None = None) -> Finished:
    """Run ``argv`` (under ``bwrap`` unless ``isolation`` is None) to its end or ``timeout_s``.

    ``stdin``, when given, is written from a thread and the pipe closed; otherwise stdin is empty.
    ``user``: ``subprocess.Popen`` arguments (``isolation.bwrap.sandbox_user``). Raises OSError or
    SubprocessError when the command cannot start (``SandboxNotStarted`` when bwrap could not create
    the sandbox); every process it started is gone on return.
    """
    start = time.monotonic()
    proc, ns_init = start_limited(argv, isolation, cwd, env, limits, user,
                                  subprocess.DEVNULL if stdin is None else subprocess.PIPE, subprocess.STDOUT)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    # Called at a timeout and after every command: a background child dies with its command.
    # read_capped leaves bwrap (or bash) unreaped, so its process group id is still ours.
    kill = functools.partial(kill_namespace, proc.pid, ns_init)
    try:
        out, timed_out = read_capped(proc, timeout_s, limits.output_cap_bytes, kill)
    finally:
        kill()
        if ns_init is not None:
            os.close(ns_init)
        proc.wait()
    return Finished(-1 if timed_out else proc.returncode, out, timed_out, time.monotonic() - start)


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid``, from /proc; None once it is gone (or where /proc cannot tell)."""
    try:
        # the command's name, in parentheses, may hold spaces: the fields after it are fixed
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def exited(pid: int) -> bool:
    """Whether the child exited, without reaping it: its pid (and process group) stays ours to signal."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait (unreaped) for the child to exit; True if the deadline came first."""
    while not exited(pid):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


class CappedOutput:
    """Output kept to ``cap_bytes`` (plus one chunk) as it arrives: the first half, then a rolling
    last half, with a marker counting what was dropped between them."""

    def __init__(self, cap_bytes: int):
        self._half = max(cap_bytes // 2, 1)
        self._head, self._tail, self._dropped = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        room = self._half - len(self._head)
        self._head += chunk[:room]
        self._tail += chunk[max(room, 0):]
        if len(self._tail) > self._half:
            self._dropped += len(self._tail) - self._half
            del self._tail[:len(self._tail) - self._half]

    def bytes(self) -> bytes:
        if not self._dropped:
            return bytes(self._head + self._tail)
        marker = f"\n[... {self._dropped} bytes of output dropped ...]\n".encode()
        return bytes(self._head) + marker + bytes(self._tail)


def read_capped(proc: subprocess.Popen, timeout_s: float, cap_bytes: int,
                kill: Callable[[], None]) -> tuple[bytes, bool]:
    """(output, timed out): read ``proc.stdout`` in chunks until EOF, the deadline, or exit and silence.

    Never holds more than ``cap_bytes`` (plus one chunk, ``CappedOutput``), so a command printing
    gigabytes costs the caller nothing but the reading. Stops (without waiting for EOF) once the
    process has exited and the pipe stays quiet, so a detached child holding the pipe cannot stall
    the caller. At the deadline ``kill`` is called and the output so far returned. The process is
    not reaped.
    """
    out = CappedOutput(cap_bytes)
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                kill()
                break
            if not sel.select(min(left, 0.2)):
                # The command may have written its last output and exited after the select gave
                # up (a busy machine makes this common): look once more before calling it quiet.
                if exited(proc.pid) and not sel.select(0):
                    break
                continue
            chunk = os.read(fd, _CHUNK)
            if not chunk:  # EOF; the command may still run with its output elsewhere
                timed_out = _wait_unreaped(proc.pid, deadline)
                if timed_out:
                    kill()
                break
            out.add(chunk)
    proc.stdout.close()
    return out.bytes(), timed_out
