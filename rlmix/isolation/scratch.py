"""A run's scratch directory: every sandbox, working copy and task directory a run makes goes in it,
and it goes, with every process still running from it, when the run ends.

The driver opens one (``open_scratch``) when it starts Ray and removes it (``remove_scratch``) when
it shuts Ray down (rlmix.orchestration.session), so a sweep's warm processes share it across jobs;
``rlmix eval`` holds one for the command (``run_scratch``). Its path travels to every process of
the run in ``RLMIX_SCRATCH``; ``scratch_dir`` is where a sandbox makes its directory (the system
temp directory when no run is open: a library call, a unit test).

Removing it first SIGKILLs every process whose command line names a path inside it: a sandbox's
``bwrap`` binds its directories by path, and a ``bwrap`` whose parent was killed can outlive it
(bubblewrap issue 633). Files a sandbox made as ``nobody`` are removed as the driver's user.

A driver killed with SIGKILL removes nothing; the next run reaps the directories of drivers that
are gone (``reap_stale``): they are named ``rlmix-run-<driver pid>-*``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rlmix.isolation.bwrap import sandbox_user, searchable_by_others

log = logging.getLogger(__name__)

ENV = "RLMIX_SCRATCH"
PREFIX = "rlmix-run-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
KILL_WAIT_S = 10.0  # for processes SIGKILLed at the end of a run to be gone


def scratch_parent() -> Path:
    """The system temp directory, or /tmp where sandboxes run as ``nobody`` and cannot reach it."""
    parent = tempfile.gettempdir()
    if sandbox_user() and not searchable_by_others(parent):
        parent = "/tmp"
    return Path(parent)


def scratch_dir() -> Path:
    """Where a sandbox or task directory is made: the open run's scratch directory, else ``scratch_parent``."""
    path = os.environ.get(ENV)
    if path and os.path.isdir(path):
        return Path(path)
    return scratch_parent()


def open_scratch() -> Path:
    """A new scratch directory for this process's run, named in ``RLMIX_SCRATCH`` (inherited by every
    process started from here on); stale ones of dead drivers are reaped first."""
    reap_stale()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=scratch_parent()))
    path.chmod(0o755)  # sandboxes run as nobody make and mount their directories inside it
    os.environ[ENV] = str(path)
    return path


def remove_scratch(path: Path) -> None:
    """End every process running from ``path``, then remove it; ``RLMIX_SCRATCH`` is unset if it named it."""
    if os.environ.get(ENV) == str(path):
        del os.environ[ENV]
    killed = kill_processes_under(path)
    if killed:
        log.info("ended %d process(es) still running from %s", killed, path)
    _rmtree(path)


@contextlib.contextmanager
def run_scratch() -> Iterator[Path]:
    """A scratch directory for the block, removed however the block ends; the one already open
    in this process (an outer run's) is used as it is and left to its owner."""
    held = os.environ.get(ENV)
    if held and os.path.isdir(held):
        yield Path(held)
        return
    path = open_scratch()
    try:
        yield path
    finally:
        remove_scratch(path)


def kill_processes_under(path: Path, wait_s: float = KILL_WAIT_S) -> int:
    """SIGKILL every process (not this one) whose command line or working directory is inside
    ``path`` and wait, up to ``wait_s``, until each is gone; returns how many were signalled.

    Each is signalled through a pidfd opened before its arguments are read again, so a pid freed
    and taken by another process since the scan is never signalled. The scan repeats until it
    finds none: a namespace's init is seen dying while the kernel still ends its namespace.
    """
    root = str(Path(path).resolve())
    killed, deadline = 0, time.monotonic() + wait_s
    while True:
        pidfds = []
        for pid in _users(root):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # gone since the scan
                continue
            try:
                if _uses(pid, root):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    pidfds.append(pidfd)
                    killed += 1
                    continue
            except OSError:  # gone, or another user's process: not ours to end
                pass
            os.close(pidfd)
        if not pidfds:
            return killed
        _wait_exited(pidfds, deadline)
        if time.monotonic() >= deadline:
            log.warning("processes running from %s did not end within %.0f s", root, wait_s)
            return killed


def _users(root: str) -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and int(e.name) != os.getpid() and _uses(int(e.name), root)]


def _uses(pid: int, root: str) -> bool:
    """Whether process ``pid`` names a path inside ``root`` in its arguments or works inside it."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone, or not ours to look at
        return False
    return (root + "/").encode() in argv or root.encode() in argv.split(b"\0") or (cwd + "/").startswith(root + "/")


def _wait_exited(pidfds: list[int], deadline: float) -> None:
    """Until each pidfd reads as exited, or the deadline; closes them."""
    poll = select.poll()
    for fd in pidfds:
        poll.register(fd, select.POLLIN)
    pending = set(pidfds)
    try:
        while pending and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poll.poll(left * 1000):
                poll.unregister(fd)
                pending.discard(fd)
    finally:
        for fd in pidfds:
            os.close(fd)


def reap_stale(parent: Path | None = None) -> list[Path]:
    """Remove the scratch directories in ``parent`` (default: every place one is made) whose driver
    process no longer exists; returns them."""
    parents = {Path(parent)} if parent is not None else {scratch_parent(), Path(tempfile.gettempdir())}
    reaped = []
    for folder in parents:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            match = _NAME.match(path.name)
            if match is None or not path.is_dir() or _alive(int(match.group(1))):
                continue
            kill_processes_under(path)
            _rmtree(path)
            reaped.append(path)
    if reaped:
        log.info("removed %d scratch director%s of runs that were killed", len(reaped), "y" if len(reaped) == 1 else "ies")
    return reaped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _rmtree(path: Path) -> None:
    """``shutil.rmtree`` that also takes directories a sandbox made read-only, and entries another
    process removes meanwhile (two commands started together both reap a dead driver's directory)."""
    retried: set[str] = set()

    def retry(func, name, exc_info) -> None:
        if isinstance(exc_info[1], FileNotFoundError) or name in retried:
            return  # already gone, or still refused after making it writable: left behind
        retried.add(name)
        with contextlib.suppress(OSError):
            parent = os.path.dirname(name)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, os.stat(name).st_mode | stat.S_IRWXU)
                shutil.rmtree(name, onerror=retry)  # opening, listing or removing it failed: once more
            else:
                os.unlink(name)

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=retry)
