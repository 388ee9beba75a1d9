"""Driving ``rlmix train`` for the end-to-end fault and signal tests (test_faults_e2e.py,
test_signals_e2e.py): a run in a session of its own, or typed into a shell on a terminal of its
own, and what to read of its processes and of what it left on disk."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

RLMIX = str(Path(sys.executable).with_name("rlmix"))
DEADLINE_S = 600  # generous: a loaded 2-core machine starts Ray and the actors slowly
SMOKE = ["+experiment=smoke", "logger=disabled"]


class Run:
    """One ``rlmix train`` process in its own session; every process it starts is cleaned up."""

    def __init__(self, tmp_path: Path, *args: str):
        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([RLMIX, "train", *args], cwd=tmp_path, stdout=out, stderr=err,
                                         start_new_session=True)

    def wait_for(self, condition, what: str, running: bool = True) -> None:
        """Wait until ``condition()``; fails once the deadline passes, or (``running``) if the run ends first."""
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert not running or self.alive(), f"exited {self.proc.poll()} before {what}:\n{self.text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.text()}"
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def hold_inside(self, run_dir: Path, method: str, after_steps: int, what: str) -> int:
        """Once ``after_steps`` steps are logged, stop (SIGSTOP) a process of this run that is running
        ``method`` (``"<Actor>.<method>"``) and is seen still inside it once stopped; returns its pid.
        Held there it can neither finish that call nor start another, so a fault lands where it is meant."""
        held: list[int] = []

        def inside() -> bool:
            if len(rows(run_dir)) < after_steps:
                return False
            for pid in actor_pids(self.proc.pid, method):
                os.kill(pid, signal.SIGSTOP)
                if title(pid) == f"ray::{method}":  # not a call that just ended
                    held.append(pid)
                    return True
                os.kill(pid, signal.SIGCONT)
            return False

        self.wait_for(inside, what)
        return held[0]

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=DEADLINE_S)
        finally:
            self.kill_session()

    def kill_session(self) -> None:
        """SIGKILL whatever is left of this run's session (Ray's processes after a driver kill)."""
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def text(self) -> str:
        return self.out.read_text()[-3000:] + self.err.read_text()[-3000:]


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def actor_pids(sid: int, actor: str) -> list[int]:
    """Processes of this session whose title is Ray's ``ray::<actor>...``."""
    return [pid for pid in session_pids(sid) if title(pid).startswith(f"ray::{actor}")]


def title(pid: int) -> str:
    """A process's title (Ray's ``ray::<Actor>[.<method>]``); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def complete(run_dir: Path) -> list[int]:
    from rlmix.assembly.checkpoints import CHECKPOINTS, problem, step_of

    dirs = (run_dir / CHECKPOINTS).glob("step_*")
    return sorted(step_of(p) for p in dirs if not problem(p))


class TerminalRun(Run):
    """``rlmix train`` (under ``nohup``: ``nohup=True``) typed into an interactive shell on a terminal
    of its own (a pseudo-terminal); ``hang_up`` closes the terminal as a closed window or ssh
    connection does. ``proc`` is the
    shell, whose session holds the run's processes; ``finish`` waits for the run to end."""

    def __init__(self, tmp_path: Path, *args: str, nohup: bool = False):
        self.log, self.output, self.driver = tmp_path / "run" / "train.log", bytearray(), 0
        self.master, terminal = os.openpty()
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], cwd=tmp_path, stdin=terminal,
                                     stdout=terminal, stderr=terminal, env=os.environ | {"PS1": "$ "},
                                     start_new_session=True, preexec_fn=_a_terminal_s_shell)
        os.close(terminal)
        os.write(self.master, shlex.join(["nohup"] * nohup + [RLMIX, "train", *args]).encode() + b"\n")
        self.reading = True
        self.reader = threading.Thread(target=self._read, daemon=True)  # a full terminal would block the run
        self.reader.start()

    def _read(self) -> None:
        while self.reading:
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    return

    def alive(self) -> bool:
        if not self.driver:  # the shell's child: the job it started
            self.driver = next((pid for pid in session_pids(self.proc.pid) if parent(pid) == self.proc.pid), 0)
        return bool(title(self.driver)) if self.driver else self.proc.poll() is None

    def hang_up(self) -> None:
        assert self.alive()
        self.reading = False
        self.reader.join()
        os.close(self.master)

    def finish(self) -> None:
        try:
            self.wait_for(lambda: not self.alive(), "the run to end", running=False)
        finally:
            self.kill_session()

    def text(self) -> str:
        log = self.log.read_text()[-3000:] if self.log.exists() else ""
        return self.output.decode(errors="replace")[-3000:] + log


def _a_terminal_s_shell() -> None:
    """In the shell's process before it starts: the pseudo-terminal becomes its controlling terminal,
    and SIGHUP and SIGINT do what they do in a terminal's shell. A test run that was itself started
    with them ignored (under `nohup`, or as a background job) would pass that on: a shell keeps a
    signal ignored that it started with ignored, and so would the run, as `nohup` asks."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def pending(pid: int, signum: int) -> bool:
    """Whether signal ``signum`` waits, blocked, on process ``pid``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone
        return False
    shared = int(status.split("ShdPnd:")[1].split()[0], 16)
    return bool(shared & (1 << (signum - 1)))
