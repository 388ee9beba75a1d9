"""A sandbox kept up across commands: one bwrap namespace whose init runs each command the runner
sends and, after each, kills whatever it left behind (``resident_init.py``).

Creating the namespaces and mounts is most of what a short command costs: a ``true`` took 16-21 ms
through a sandbox of its own and 4.4-5.2 ms through a resident one, the minicode agent's ``./mc``
35 ms and 25 ms (docs/performance.md, "A resident sandbox per episode"). An agent episode runs
about ten commands in one working copy, each started while the sampler generates the other
episodes' turns on the same cores.

What a command sees is what it saw in a sandbox of its own (``process.run_limited``): the same
mounts, user, limits and environment, empty stdin, a fresh ``bash``, and no process of an earlier
command (the init has killed and reaped them all before it reports the end). Its output is read as
it is written and capped here, and at its time limit the whole namespace is killed, so the next
command starts a new one. What differs: the namespace's PID 1 is the init, not the command, and
RLIMIT_NPROC counts the init too.

The init runs on the ``python3`` the sandbox sees. Where there is none, or it cannot start under
the limits, ``ResidentUnavailable`` says so and the caller goes back to a sandbox per command.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import selectors
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlmix.isolation.bwrap import PATH, SYSTEM_DIRS, system_python
from rlmix.isolation.process import (CappedOutput, Finished, Isolation, LocalLimits, end_namespace, exited,
                                     kill_namespace, start_limited)

INIT = Path(__file__).with_name("resident_init.py")
READY_TIMEOUT_S = 30.0  # the init's Python start, on a loaded machine; never reached on an idle one
EXIT_WAIT_S = 5.0  # for bwrap to exit once its init has: milliseconds, unless something is wrong
_CHUNK = 1 << 16
_HEADER = 5  # kind byte + 4-byte length


class ResidentUnavailable(OSError):
    """The init did not start in the sandbox (no python3 there, or it failed under the limits)."""


class SandboxLost(OSError):
    """The sandbox ended during a command without being asked to (killed from outside)."""


@functools.cache
def _init_source() -> str:
    return INIT.read_text()


def _request(cwd: str, argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """One command for the init (``resident_init.py``, its module docstring has the format)."""
    fields = [cwd, str(len(argv)), *argv, *(f"{name}={value}" for name, value in env.items())]
    if any("\0" in field for field in fields):
        raise ValueError("a command, its working directory or its environment holds a NUL byte")
    body = b"\0".join(os.fsencode(field) for field in fields)
    return len(body).to_bytes(4, "big") + body


class ResidentShell:
    """Commands run one at a time in one sandbox (``isolation``), started at the first command and
    again after a timeout. ``host_cwd`` and ``user`` are ``process.run_limited``'s."""

    def __init__(self, isolation: Isolation, host_cwd: str | Path, limits: LocalLimits, user: Mapping | None):
        # Not tied to the thread that happens to start it: it ends when its input does (closed, or the runner died).
        self._isolation = dataclasses.replace(isolation, die_with_parent=False)
        self._host_cwd, self._limits, self._user = host_cwd, limits, user
        self._proc: subprocess.Popen | None = None
        self._ns_init: int | None = None
        self._pending = bytearray()

    def run(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> Finished:
        """Run ``argv`` to its end or ``timeout_s``; raises what ``process.start_limited`` raises,
        ``ResidentUnavailable`` or ``SandboxLost``."""
        start = time.monotonic()
        request = _request(self._isolation.chdir, argv, env)
        if not self._send(request):  # it ended since the last command (killed from outside): a new one
            self.close()
            if not self._send(request):
                raise SandboxLost("the sandbox ended as the command was sent")
        out = CappedOutput(self._limits.output_cap_bytes)
        try:
            status = self._read_until(b"X", start + timeout_s, out)
        except SandboxLost:
            self.close(kill=True)
            raise
        if status is None:  # the time limit: the namespace goes, and everything in it
            self.close(kill=True)
            return Finished(-1, out.bytes(), True, time.monotonic() - start)
        return Finished(int(status), out.bytes(), False, time.monotonic() - start)

    def _send(self, request: bytes) -> bool:
        if self._proc is not None and exited(self._proc.pid):
            self.close()
        if self._proc is None:
            self._start()
        try:
            self._proc.stdin.write(request)
            self._proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):
            return False

    def _start(self) -> None:
        python = system_python()
        if python is None:
            raise ResidentUnavailable(f"no python3 on the sandbox's system directories ({', '.join(SYSTEM_DIRS)})")
        self._pending.clear()
        self._proc, self._ns_init = start_limited(
            [python, "-I", "-S", "-c", _init_source()], self._isolation, self._host_cwd, {"PATH": PATH},
            self._limits, self._user, subprocess.PIPE, subprocess.PIPE)
        os.set_blocking(self._proc.stdout.fileno(), False)
        try:
            ready = self._read_until(b"R", time.monotonic() + READY_TIMEOUT_S, None)
        except SandboxLost:
            ready = None
        if ready is None:
            try:  # an init that failed has exited, and bwrap follows it: then its last words are all there
                self._proc.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            said = self._proc.stderr.read(_CHUNK) if self._proc.poll() is not None else b""
            self.close(kill=True)
            reason = said.decode("utf-8", errors="replace").strip().splitlines() or ["no answer"]
            raise ResidentUnavailable(f"the sandbox's init did not start: {reason[-1]}")

    def _read_until(self, kind: bytes, deadline: float, out: CappedOutput | None) -> bytes | None:
        """The payload of the next ``kind`` frame, passing output frames to ``out``; None at the deadline."""
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                while len(self._pending) >= _HEADER:
                    size = int.from_bytes(self._pending[1:_HEADER], "big")
                    if len(self._pending) < _HEADER + size:
                        break
                    got, payload = self._pending[:1], bytes(self._pending[_HEADER:_HEADER + size])
                    del self._pending[:_HEADER + size]
                    if got == kind:
                        return payload
                    if got == b"O" and out is not None:
                        out.add(payload)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if sel.select(left):
                    chunk = os.read(fd, _CHUNK)
                    if not chunk:
                        raise SandboxLost("the sandbox ended during the command")
                    self._pending += chunk

    def close(self, kill: bool = False) -> None:
        """End the sandbox and everything in it (a no-op when none is running); ``kill`` when its init
        is busy (a command at its time limit), rather than waiting for it to see its input end."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # an idle init's loop ends, and with PID 1 the namespace
        except BrokenPipeError:
            pass
        if kill and self._ns_init is not None:
            end_namespace(os.dup(self._ns_init))
        try:
            # bwrap reaps the init and exits: killed before that, it would leave the init to the machine's init.
            proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            kill_namespace(proc.pid, self._ns_init)
            proc.wait()
        if self._ns_init is not None:
            os.close(self._ns_init)
            self._ns_init = None
        proc.stdout.close()
        proc.stderr.close()
