"""The sandbox interface shared by the ``local`` and ``docker`` runtimes, and git helpers on top of it.

A sandbox holds one copy of a task's repository. Each command runs in a fresh ``bash -c`` with the
repository as its working directory, so state persists only through the file system. Paths the
verifier needs are exposed as environment variables in every command:
``TESTS_DIR`` (the task's tests/ once copied in), ``LOGS_DIR`` (``$LOGS_DIR/verifier/reward.txt``)
and ``APP_DIR`` (the repository).
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlmix.agentic.harbor import HarborTask

GIT_ENV = "GIT_AUTHOR_NAME=rlmix GIT_AUTHOR_EMAIL=rlmix@localhost GIT_COMMITTER_NAME=rlmix " \
          "GIT_COMMITTER_EMAIL=rlmix@localhost"

# Git must never walk up from the repository into an enclosing one (a temporary directory inside a
# checkout, or a policy that deleted .git): stop the search at the repository's parent.
ONLY_OWN_REPO = 'export GIT_CEILING_DIRECTORIES="$(dirname "$PWD")"'
DEFAULT_OUTPUT_CAP_BYTES = 1 << 20  # command output kept per command (first and last halves)
MAX_PATCH_BYTES = 32 << 20  # a larger patch is the policy's failure, not something to grade
_CHUNK = 1 << 16


class InfraError(RuntimeError):
    """The sandbox itself failed (image build, engine, copy): retried, never scored as a failure."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int  # -1 when the command was killed at its time limit
    output: str  # stdout and stderr interleaved
    timed_out: bool
    duration_s: float


class Sandbox(Protocol):
    workdir: str  # the repository, as commands see it
    tests_dir: str  # where put_dir(task.tests_dir, ...) lands, as commands see it
    logs_dir: str

    def run(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult: ...

    def put_dir(self, host_dir: Path, sandbox_dir: str) -> None: ...

    def put_file(self, sandbox_path: str, data: bytes) -> None: ...

    def read_file(self, sandbox_path: str) -> bytes | None: ...

    def close(self) -> None: ...


class Runtime(Protocol):
    def unavailable(self) -> str | None:
        """Why this runtime cannot run on this machine (one line naming the fix), or None; cheap."""

    def check(self, task: HarborTask) -> str | None:
        """A user-fixable reason this runtime cannot run the task (one line), or None; cheap."""

    def prepare(self, task: HarborTask) -> None:
        """Whatever is needed once per task (build or pull the image); raises InfraError."""

    def start(self, task: HarborTask, network: bool) -> Sandbox:
        """A fresh sandbox with a clean copy of the task's repository; raises InfraError."""


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


def read_capped(proc: subprocess.Popen, timeout_s: float, cap_bytes: int,
                kill: Callable[[], None]) -> tuple[bytes, bool]:
    """(output, timed out): read ``proc.stdout`` in chunks until EOF, the deadline, or exit and silence.

    Never holds more than ``cap_bytes`` (plus one chunk): the first half is kept, then a rolling last
    half, with a marker counting what was dropped between them, so a command printing gigabytes
    costs the caller nothing but the reading. Stops (without waiting for EOF) once the process has
    exited and the pipe stays quiet, so a detached child holding the pipe cannot stall the caller.
    At the deadline ``kill`` is called and the output so far returned. The process is not reaped.
    """
    half = max(cap_bytes // 2, 1)
    head, tail, dropped = bytearray(), bytearray(), 0
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
            room = half - len(head)
            head += chunk[:room]
            tail += chunk[max(room, 0):]
            if len(tail) > half:
                dropped += len(tail) - half
                del tail[:len(tail) - half]
    proc.stdout.close()
    if dropped:
        return bytes(head) + f"\n[... {dropped} bytes of output dropped ...]\n".encode() + bytes(tail), timed_out
    return bytes(head + tail), timed_out


def snapshot_baseline(sandbox: Sandbox) -> str:
    """Commit the pristine repository state and return its sha; the agent's patch is diffed against it.

    Always a new commit (even on a clean git checkout) so untracked files present in the image are
    part of the baseline, not of the agent's patch. Run in both the agent and the grading sandbox:
    both come from the same image, so the patch applies.
    """
    cmd = (f"{ONLY_OWN_REPO} && (git rev-parse --git-dir >/dev/null 2>&1 || git init -q) && git add -A && "
           f"env {GIT_ENV} git commit -q --allow-empty --no-verify -m rlmix-baseline && git rev-parse HEAD")
    res = sandbox.run(cmd, timeout_s=300.0)
    sha = res.output.strip().splitlines()[-1] if res.output.strip() else ""
    if res.exit_code != 0 or len(sha) != 40:
        raise InfraError(f"could not snapshot the repository at {sandbox.workdir} (exit {res.exit_code}): "
                         f"{res.output[-500:]}")
    return sha


def capture_patch(sandbox: Sandbox, baseline: str) -> tuple[str, str | None]:
    """(the agent's changes as one git patch: tracked, new and deleted files, binary-safe; error or None).

    A failing capture is the policy's doing (it damaged the repository or its ``.git``), not the
    infrastructure's: the patch is then empty and the sample is graded (and fails) as usual.
    """
    # Written to a file, not read as output: command output is capped, a patch must arrive whole.
    path = f"{sandbox.logs_dir}/agent.patch"
    res = sandbox.run(f'{ONLY_OWN_REPO} && mkdir -p "$LOGS_DIR" && git add -A 2>/dev/null && '
                      f'git diff --cached --binary {baseline} > {path} && wc -c < {path}', timeout_s=300.0)
    if res.exit_code != 0:
        return "", f"could not capture the patch (exit {res.exit_code}): {res.output[-300:]}"
    size = int(res.output.split()[-1]) if res.output.split() and res.output.split()[-1].isdigit() else -1
    if not 0 <= size <= MAX_PATCH_BYTES:
        return "", f"the patch has {size} bytes, more than the {MAX_PATCH_BYTES} allowed"
    data = sandbox.read_file(path)
    if data is None:
        return "", "could not read the captured patch"
    return data.decode("utf-8", errors="replace"), None
