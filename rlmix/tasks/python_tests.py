"""``task.reward=python_tests``: a completion's code and the row's asserts, graded in a bubblewrap sandbox.

Each sample runs once, alone, in the isolation of the agentic ``local`` runtime (``rlmix/isolation``):
a fresh temporary directory (the only thing writable but a 64 MiB ``/dev/shm``), a read-only system,
no ``/proc``, no network, its own PID namespace (host processes are invisible), an unprivileged user,
RLIMIT_AS / RLIMIT_NPROC / RLIMIT_CPU / RLIMIT_FSIZE, a wall-clock timeout and capped output. Inside,
``harness.py`` runs the solution, then the tests, and writes its verdict under a per-sample random
nonce that only this process and the harness know; the exit code means nothing. No verdict (the
process ended early, was killed, timed out) is reward 0.

Where bwrap cannot run, ``PythonTests`` refuses to be built: one line naming ``task.reward`` and
the fix, never a run on the host.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmix.errors import ConfigError
from rlmix.isolation.bwrap import (PATH, SYSTEM_DIRS, Bind, isolation_fix, isolation_problem, on_system_dirs,
                                  sandbox_user, searchable_by_others, system_python)
from rlmix.isolation.process import Isolation, LocalLimits, run_limited
from rlmix.isolation.scratch import scratch_dir

HARNESS = Path(__file__).with_name("harness.py")
INSIDE = "/sandbox"  # the sample's directory inside: cwd, HOME and TMPDIR
MEMORY_MB = 1024
MAX_PROCS = 64
OUTPUT_CAP_BYTES = 1 << 16  # the solution's own output goes to /dev/null; this bounds the rest
# Per file written: tests write scratch files of kilobytes; a sample wrote 244 MiB in 2 s. Python
# ignores SIGXFSZ, so a write past it fails with EFBIG instead of killing the harness.
FILE_SIZE_MB = 64
EXPLOIT_FLAGS = frozenset({"nonbuiltin", "early_exit", "exit_hook", "tamper", "refused"})


@dataclass(frozen=True)
class Verdict:
    """What the harness said about one sample (or that it said nothing)."""

    verdict: bool  # the harness wrote its line: the tests ran to their end or stopped at a failure
    passed: int  # assert statements that ran and held every time
    total: int  # assert statements in the tests
    complete: bool  # the tests ran to the end and every assert ran and held
    flags: frozenset[str]  # what the harness caught (harness.py's docstring)
    timed_out: bool

    def reward(self, partial_credit: bool) -> float:
        if not self.verdict or self.flags & EXPLOIT_FLAGS:
            return 0.0
        if partial_credit and self.total:
            return self.passed / self.total
        return float(self.complete)

    @property
    def exploit_suspected(self) -> bool:
        """Caught at a known hack, or ended before the harness's verdict without running out of time."""
        return bool(self.flags & EXPLOIT_FLAGS) or (not self.verdict and not self.timed_out)


@functools.cache
def sandbox_python() -> tuple[str, tuple[Bind, ...]] | str:
    """(the interpreter to run inside, what to bind for it) or why there is none (one line).

    The running interpreter's standard library, without its virtual environment (``-I -S``); when it
    lives outside the system directories it is bound read-only, unless the sandbox user could not
    reach it (root's home), and then the system's ``python3``.
    """
    exe = os.path.realpath(sys.executable)
    if on_system_dirs(exe):
        return exe, ()
    prefix = os.path.realpath(sys.base_prefix)
    if exe.startswith(prefix + "/") and (not sandbox_user() or searchable_by_others(prefix)):
        return exe, (Bind(prefix, prefix, writable=False),)
    system = system_python()
    if system is None:
        return f"{exe} is not reachable from the sandbox and there is no python3 in {', '.join(SYSTEM_DIRS)}"
    return system, ()


def _work_dir() -> Path:
    user = sandbox_user()
    path = Path(tempfile.mkdtemp(prefix="rlmix-py-", dir=scratch_dir()))
    if user:
        os.chown(path, user["user"], user["group"])
    return path


def run_python_tests(code: str, tests: str, timeout_s: float) -> Verdict:
    """Run ``code`` then ``tests`` in a fresh sandbox (see the module docstring).

    Raises ``SandboxNotStarted`` when the sandbox could not be created: the sample was not graded,
    which a reward of 0 would misreport (the task counts it as a reward error instead)."""
    found = sandbox_python()
    if isinstance(found, str):
        raise ConfigError(f"task.reward=python_tests: {found}")
    python, binds = found
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "solution": code, "tests": tests}).encode()
    limits = LocalLimits(memory_mb=MEMORY_MB, max_procs=MAX_PROCS, cpu_s=int(timeout_s) + 1,
                         output_cap_bytes=OUTPUT_CAP_BYTES, file_size_mb=FILE_SIZE_MB)
    work = _work_dir()
    try:
        # No /proc: nothing here needs one, and a path relative to a descriptor (dir_fd) escapes the
        # harness's check of path names.
        isolation = Isolation((*binds, Bind(str(work), INSIDE, writable=True)), INSIDE, network=False, proc=False)
        env = {"PATH": PATH, "HOME": INSIDE, "TMPDIR": INSIDE, "LANG": "C.UTF-8"}
        done = run_limited([python, "-I", "-S", "-B", "-c", HARNESS.read_text()], isolation, work, env, limits,
                           timeout_s, sandbox_user(), stdin=job)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return parse_verdict(done.output, nonce, done.timed_out)


def parse_verdict(output: bytes, nonce: str, timed_out: bool) -> Verdict:
    """The harness's line for ``nonce`` in ``output`` (anything without the nonce is the solution's)."""
    found = re.findall(rf"{nonce} (\d+) (\d+) ([01]) (\S+)\n".encode(), output)
    if timed_out or not found:
        return Verdict(False, 0, 0, False, frozenset(), timed_out)
    passed, total, complete, flags = found[-1]
    names = frozenset() if flags == b"-" else frozenset(flags.decode().split(","))
    return Verdict(True, int(passed), int(total), complete == b"1", names, False)


class _CannotGrade(Exception):
    pass


@functools.cache
def _sandbox_grades() -> bool:
    """True once a correct solution has passed in the sandbox here; raises ``_CannotGrade`` (one line
    naming the fix) otherwise. Only the success is kept, as ``isolation.bwrap`` keeps its own: a
    grading refused for want of processes is probed again at the next call."""
    problem = isolation_problem()
    if problem is not None:
        raise _CannotGrade(f"task.reward=python_tests grades every sample in a bubblewrap sandbox, but {problem}: "
                           f"{isolation_fix(problem)}, or grade with your own task.reward=module:function")
    found = sandbox_python()
    if isinstance(found, str):
        raise _CannotGrade(f"task.reward=python_tests: {found}; install python3 in /usr/bin")
    try:
        run = run_python_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2\n", timeout_s=30.0)
    except OSError as err:  # SandboxNotStarted among them: bwrap is there, this sandbox was refused
        raise _CannotGrade(f"task.reward=python_tests: bubblewrap runs here, but a test grading could not "
                           f"start: {err}") from err
    if run.reward(partial_credit=False) != 1.0:
        raise _CannotGrade(f"task.reward=python_tests: a correct solution does not pass in the sandbox, so "
                           f"{found[0]} or the harness is broken here; grade with your own "
                           f"task.reward=module:function")
    return True


def sandbox_problem() -> str | None:
    """Why python_tests cannot grade on this machine (one line naming the fix), or None (``_sandbox_grades``)."""
    try:
        _sandbox_grades()
    except _CannotGrade as e:
        return str(e)
    return None


def forget_sandbox_probe() -> None:
    """Probe again at the next ``sandbox_problem()`` (for tests that change what it finds)."""
    _sandbox_grades.cache_clear()


class PythonTests:
    """The built-in ``python_tests`` reward: ``grade`` for the task, ``__call__`` as a plain reward function."""

    def __init__(self, timeout_s: float, partial_credit: bool):
        problem = sandbox_problem()
        if problem is not None:
            raise ConfigError(problem)
        self.timeout_s, self.partial_credit = timeout_s, partial_credit

    def run(self, completion: str, answer: Any) -> Verdict:
        return run_python_tests(strip_fence(completion), str(answer), self.timeout_s)

    def __call__(self, completion: str, answer: Any, row: Mapping[str, Any]) -> float:
        return self.run(completion, answer).reward(self.partial_credit)


_FENCED = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)  # (language, code), in order
_PYTHON = {"python", "python3", "py"}


def strip_fence(text: str) -> str:
    """The code of the first fence labelled Python (any case, ``python3``, ``py``), else of the first
    unlabelled one, else the text itself. Fences pair up in order, so a ```bash block's closing fence
    never opens the next one."""
    blocks = [(language.lower(), code) for language, code in _FENCED.findall(text)]
    chosen = next((code for language, code in blocks if language in _PYTHON), None)
    if chosen is None:
        chosen = next((code for language, code in blocks if not language), None)
    return text if chosen is None else chosen
