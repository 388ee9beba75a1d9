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
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlmix.isolation.bwrap import sandbox_user, searchable_by_others

log = logging.getLogger(__name__)

ENV = "RLMIX_SCRATCH"
PREFIX = "rlmix-run-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


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


def kill_processes_under(path: Path) -> int:
    """SIGKILL every process (not this one) whose command line or working directory is inside
    ``path``; returns how many were signalled."""
    root = str(Path(path).resolve())
    inside = (root + "/").encode()
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone, or not ours to look at
            continue
        if inside in argv or root.encode() in argv.split(b"\0") or (cwd + "/").startswith(root + "/"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                count += 1
            except OSError:
                pass
    return count


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
    """``shutil.rmtree`` that also takes directories a sandbox made read-only."""
    def retry(func, name, _exc) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(name)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, os.stat(name).st_mode | stat.S_IRWXU)
            func(name)

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=retry)
