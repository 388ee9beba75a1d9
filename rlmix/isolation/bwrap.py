"""Isolation of the local runtime's commands with bubblewrap (``bwrap``): mounts, namespaces, availability.

Each command runs as ``bwrap ... bash -c <command>`` with

* a root file system built from scratch: the host's ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin``
  links or directories beside it) read-only, a short list of harmless files from ``/etc`` read-only,
  a fresh ``/proc`` (unless the caller needs none) and a minimal, read-only ``/dev`` whose ``/dev/shm``
  is a tmpfs of ``SHM_BYTES`` (both were writable tmpfs of half the machine's RAM: a sample wrote 1.9 GiB
  there in 2 s), and the sandbox's own directories (only those writable that the caller binds
  writable; the root itself is read-only). Nothing else of the host exists
  inside: not its home directories, not the project, not the task's source directory, not
  ``/etc/shadow``;
* new user, PID, IPC, UTS, cgroup and network namespaces (``--unshare-all``): host processes are
  invisible and cannot be signalled, and only a loopback interface exists unless the network is
  asked for (``--share-net``);
* an unprivileged user (``nobody`` when the runner is root, see ``SANDBOX_UID``), no capabilities
  (``--cap-drop ALL``), ``--new-session`` (no ioctl on the caller's terminal) and
  ``--die-with-parent``.

The command itself is PID 1 of the new PID namespace (``--as-pid-1``). When PID 1 dies, the kernel
kills every process left in the namespace (``setsid``/``nohup`` children too) before its death is
reported; the runtime kills it after every command and at a timeout (``process.py``), and
``--die-with-parent`` kills it if the runner dies. So no process a command starts outlives that
command. A sandbox kept up across commands (``resident.py``) has an init as PID 1 instead, which
clears the namespace after each command and ends with its input.

Without ``--as-pid-1`` bwrap puts an init of its own there, and bwrap returns the command's status
as soon as the command exits, before that init has exited: the init is left to the machine's init to
reap. A container whose PID 1 never reaps, or a machine whose init reaps late, collected one zombie
of the sandbox user per command, and once they reached the user's RLIMIT_NPROC every command failed
to start ("bwrap: Can't fork"): a correct solution scored 0. With the command as PID 1, bwrap's one
child is the command, which bwrap reaps itself. bash reaps whatever its children orphan inside.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BWRAP = "bwrap"
# Top-level system directories shared read-only (merged-/usr systems have links for all but /usr).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc programs need to start (the dynamic loader's cache, users, alternatives, TLS roots);
# credentials (shadow, ssh keys, machine-id) stay out.
ETC_ENTRIES = ("passwd", "group", "hosts", "nsswitch.conf", "resolv.conf", "host.conf", "ld.so.cache",
               "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone", "ssl", "ca-certificates",
               "gitconfig", "os-release", "debian_version", "mime.types", "bash.bashrc", "profile", "inputrc")
# Top-level names a task's WORKDIR may not take inside the sandbox: they are the system's or the sandbox's own.
RESERVED_TOP = frozenset({"", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys",
                          "run", "tmp", "tests", "logs", "home"})
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Who sandboxed commands run as when the runner is root: ``nobody``. Started as root, bwrap would map
# the sandbox's uid 0 to the host's root, which even without capabilities may write the kernel's
# global settings in /proc/sys and /proc/sysrq-trigger. An unprivileged user may not.
SANDBOX_UID = SANDBOX_GID = 65534
# /dev/shm's size: Docker's default, which test suites that use shared memory (multiprocessing) expect.
SHM_BYTES = 64 << 20


@dataclass(frozen=True)
class Bind:
    host: str
    inside: str
    writable: bool


@functools.cache
def _system_args(proc: bool = True) -> tuple[str, ...]:
    """The read-only system. bwrap 0.8 has no ``noexec``: what is writable stays executable."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    if proc:
        args += ["--proc", "/proc"]
    # --dev's tmpfs is the sandbox user's and unbounded: made read-only (its devices still work), with a
    # bounded tmpfs on /dev/shm.
    return tuple(args + ["--dev", "/dev", "--remount-ro", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"])


def bwrap_argv(binds: Sequence[Bind], chdir: str, network: bool, die_with_parent: bool = True,
               proc: bool = True) -> list[str]:
    """The bwrap prefix for one command; ``binds`` are laid over the system mounts in order.

    ``proc``: mount a ``/proc``; without it no path (``dir_fd``-relative ones included) reaches the
    sandbox's own processes' memory or maps.

    ``die_with_parent``: the sandbox is killed when the thread that started it ends (the kernel's
    parent-death signal follows the thread); a sandbox that outlives its starting thread (``resident.py``)
    ends when its input does instead.
    """
    # --cap-drop ALL: run as root, bwrap keeps every capability inside its user namespace, and
    # CAP_SYS_ADMIN there can remount the read-only binds writable (host /usr included).
    # --as-pid-1: the command is the namespace's init, so nothing is left for the host's init to reap (above).
    argv = [BWRAP, "--unshare-all", "--as-pid-1", "--cap-drop", "ALL", "--new-session", *_system_args(proc)]
    if die_with_parent:
        argv.append("--die-with-parent")
    if network:
        argv.append("--share-net")
    for b in binds:
        argv += ["--bind" if b.writable else "--ro-bind", b.host, b.inside]
    # The root bwrap builds is a tmpfs: read-only too, so nothing but the binds can be written.
    return [*argv, "--remount-ro", "/", "--chdir", chdir]


def sandbox_workdir(task_workdir: str, default: str) -> str:
    """The task's WORKDIR inside the sandbox, unless it would sit on a system or sandbox directory."""
    parts = [p for p in task_workdir.split("/") if p and p != "."]
    if not task_workdir.startswith("/") or ".." in parts or not parts or parts[0] in RESERVED_TOP:
        return default
    return "/" + "/".join(parts)


def searchable_by_others(path: str | Path) -> bool:
    """Whether every directory down to ``path`` lets others through: bwrap run as ``nobody`` must reach it."""
    p = Path(path).resolve()
    return all(os.stat(q).st_mode & stat.S_IXOTH for q in (p, *p.parents))


def sandbox_user() -> dict:
    """``subprocess.Popen`` arguments that run a command as ``SANDBOX_UID`` when we are root; else none."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_GID, "extra_groups": []}


def on_system_dirs(path: str) -> bool:
    """Whether ``path`` lies on the read-only system directories every sandbox sees."""
    return any(path.startswith(d + "/") for d in SYSTEM_DIRS)


@functools.cache
def system_python() -> str | None:
    """The ``python3`` on the read-only system directories every sandbox sees (its real path), or None."""
    found = shutil.which("python3", path=PATH)
    real = os.path.realpath(found) if found else ""
    return real if on_system_dirs(real) else None


NOT_INSTALLED = "bubblewrap (bwrap) is not installed"
BUSY = "bwrap could not create a sandbox just now"  # out of processes or memory: a moment's problem
_TRANSIENT = (errno.EAGAIN, errno.ENOMEM)


class _NotIsolated(Exception):
    pass


@functools.cache
def _isolation_holds() -> bool:
    """True once bwrap has isolated a command in this process; raises ``_NotIsolated`` (one line)
    otherwise. ``functools.cache`` keeps no exception, so only the success is remembered: a failure,
    such as bwrap refused for want of processes while many sandboxes start, is probed again at the
    next call instead of turning isolation off for the rest of the process."""
    if shutil.which(BWRAP) is None:
        raise _NotIsolated(NOT_INSTALLED)
    try:
        res = subprocess.run(bwrap_argv((), "/", network=False) + ["true"], capture_output=True, timeout=30,
                             **sandbox_user())
    except (OSError, subprocess.SubprocessError) as e:
        if getattr(e, "errno", None) in _TRANSIENT:
            raise _NotIsolated(f"{BUSY} ({e})") from e
        raise _NotIsolated(f"bwrap does not start: {e}") from e
    if res.returncode != 0:
        line = (res.stderr.decode(errors="replace").strip().splitlines() or [f"exit {res.returncode}"])[-1]
        if any(os.strerror(code) in line for code in _TRANSIENT):
            raise _NotIsolated(f"{BUSY} ({line})")
        raise _NotIsolated(f"the kernel refuses bwrap's namespaces to an unprivileged user here ({line})")
    return True


def isolation_problem() -> str | None:
    """Why commands cannot be isolated on this machine (one line), or None (``_isolation_holds``)."""
    try:
        _isolation_holds()
    except _NotIsolated as e:
        return str(e)
    return None


def isolation_fix(problem: str) -> str:
    """What to do about ``isolation_problem()``'s ``problem``, as the end of a sentence."""
    if problem == NOT_INSTALLED:
        return "install it (`make setup` as root, or `apt-get install bubblewrap`)"
    if problem.startswith(BUSY):
        return "the machine is out of processes or memory for it; try again once it has room"
    return "let unprivileged users create user namespaces here (a kernel or AppArmor setting)"


def forget_isolation() -> None:
    """Probe again at the next ``isolation_problem()`` (for tests that hide bwrap)."""
    _isolation_holds.cache_clear()
