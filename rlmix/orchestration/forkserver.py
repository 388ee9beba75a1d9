"""Actor processes forked from one that has imported torch, instead of each importing it anew.

Start-up on a CPU machine is mostly imports: every actor of the default run (six samplers and the
trainer) was a new Python process importing torch and rlmix (~1.1 core-seconds), the trainer
``transformers`` too (~2.3 more), seven processes on two cores (docs/performance.md, Start-up). A
local instance therefore has one *fork server*: a process that makes those imports once and then
forks a copy of itself for every worker process the raylet starts. The copy shares the imported
modules' memory with the server (copy on write) and is ready in milliseconds. ``rlmix train``
launches the server as the command starts (``prestart``), so that its imports run beside the
driver's own and Ray's start; the local instance takes it then (``ForkServer.for_run``), and a
command that starts none (bad input, a cluster, an instance already up) ends it (``discard_early``).

Ray is the one import a copy makes itself: its core reads its settings from the environment as it
loads, the worker's job among them, so a server that had imported it would hand every copy its own.

The raylet still starts each worker itself, with the command Ray would run (``default_worker.py``
and its arguments), but the program it starts is ``fork_worker.py``: a small script importing
nothing heavy that hands its arguments, environment, working directory, signal mask, priority and
standard streams to the server over a Unix socket and waits. The server forks; the copy takes all of
that on and runs Ray's ``default_worker.py`` as its ``__main__``. So a worker is the process that
registers with the raylet (Ray takes its pid from the registration, as it does for a worker started
through a container or a shim) and the process Ray kills, restarts and reports; the script stays
beside it as the process the raylet started and ends with it, with its exit status:

- the copy ends: the server reaps it and sends the script its status, which the script exits with;
- the script ends (the raylet or the session killed it): the copy sees its socket close and exits;
- the server ends: copies already made run on; a script that finds no server (its socket refuses,
  or ``<socket>.gone`` says it serves no more) starts ``default_worker.py`` itself, as Ray would
  have, and so does one that waited ``READY_WAIT_S`` for it.

Only the raylet's own workers are served: the server answers a connection only from a process
whose parent is the raylet it was told of (``SO_PEERCRED``), so nothing else on the machine (a
sandboxed command of the same user included) can have it fork. A cluster's nodes start their
workers as Ray does (``cluster.address``); ``cluster.fork_workers=false`` turns the server off
on a local instance.

What a copy inherits that a fresh process would not, and what is done about it: the server's
random states (reseeded in the copy: Python's ``random`` and NumPy's global generator; torch's
default generator starts from the same fixed seed in every process anyway), its ``sys.path[0]``
(set to the script's directory, as a fresh interpreter does) and its signal handlers (reset). The
server imports nothing that starts a thread, and makes no tensor before it forks: a fork copies only
the calling thread, and CUDA must not be initialised in a process that forks.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

from rlmix.isolation.process import parent_pid
from rlmix.metrics.quiet import WORKER_ENV as RUN_WORKER_ENV

log = logging.getLogger(__name__)

ENV = "RLMIX_FORK_SERVER"  # the server's socket, in the environment the raylet's workers inherit
WORKER_ENV = "RLMIX_RAY_WORKER"  # Ray's own worker program (default_worker.py), which a copy runs
SCRIPT = Path(__file__).with_name("fork_worker.py")
SOCKET_NAME = "fork-server.sock"
GONE = ".gone"  # beside the socket (``<socket>.gone``): the server serves no more; workers start on their own
READY_WAIT_S = 60.0  # how long a worker's script waits for the server before starting on its own
MAX_REQUEST = 1 << 22  # bytes: a worker's arguments and environment
# What a worker imports, made once here: rlmix's actors with torch, and the trainer's model code with
# transformers. Not Ray, whose core reads its settings from the environment as it loads (a worker's
# job among them): each copy imports Ray itself.
PRELOAD = ("rlmix.orchestration.workers", "rlmix.models.io", "rlmix.trainers.torch_trainer")


class ForkServer:
    """The driver's handle on a running server: its process and, once it is given one, its socket."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.path: Path | None = None

    @classmethod
    def launch(cls) -> ForkServer:
        """A server, importing from now on; it serves once given a socket (``for_run``) and a raylet.

        It imports with the environment every worker takes on (rlmix.metrics.quiet.WORKER_ENV), as a
        worker's own imports did: ``transformers`` and ``huggingface_hub`` read their progress bars
        and verbosity from it as they load, so a server without it had the trainer's checkpoint saves
        draw bars into workers.log."""
        process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, close_fds=True, env=os.environ | RUN_WORKER_ENV)
        return cls(process)

    @classmethod
    def for_run(cls, directory: Path) -> ForkServer | None:
        """The server of a local instance starting now, its socket in ``directory`` (the run's scratch
        directory): the one ``prestart`` launched, or a new one. Its workers find it through ``ENV``, set
        here for the processes started from now on (Ray's). None where a Unix socket's path would be too
        long there."""
        server = _EARLY.pop() if _EARLY else cls.launch()
        path = directory / SOCKET_NAME
        if len(os.fsencode(path)) > 100:  # sun_path holds 108 bytes
            log.info("actor processes start on their own: %s is too long a path for a socket", path)
            server.discard()
            return None
        if not server._tell(str(path)):  # it has ended: Ray's workers start as Ray starts them
            server.discard()
            return None
        server.path = path
        os.environ[ENV] = str(path)
        return server

    def serve_children_of(self, raylet_pid: int) -> bool:
        """Tell the server whose workers to serve; False if it has ended (the workers then start on their own)."""
        return self._tell(str(raylet_pid))

    def _tell(self, line: str) -> bool:
        try:
            self.process.stdin.write(f"{line}\n".encode())
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):
            return False

    def stop(self) -> None:
        """End the server (its copies run on) and unset ``ENV``: workers started later start on their own."""
        if self.path is not None and os.environ.get(ENV) == str(self.path):
            del os.environ[ENV]
            os.environ.pop(WORKER_ENV, None)
        with suppress(OSError, ValueError):
            self.process.stdin.close()  # the server's signal to end
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.path is not None:
            with suppress(OSError):
                Path(f"{self.path}{GONE}").touch()

    def discard(self) -> None:
        """End a server that never served: at once, whatever it is importing."""
        with suppress(OSError, ValueError):
            self.process.stdin.close()
        self.process.kill()
        self.process.wait()


_EARLY: list[ForkServer] = []  # the server ``prestart`` launched, until a local instance takes it


def prestart() -> None:
    """Launch the server now, at a command's start, so that its imports (~3.5 core-seconds) run beside the
    driver's own and Ray's start instead of after them; the run's local instance takes it (``for_run``)."""
    if not _EARLY:
        _EARLY.append(ForkServer.launch())
        atexit.register(discard_early)


def discard_early() -> None:
    """A command that ended without starting a local instance (bad input, a cluster, Ray already up)
    ends the server ``prestart`` launched for it."""
    while _EARLY:
        _EARLY.pop().discard()


# --- the server process -------------------------------------------------------------------------

def _peer_parent(conn: socket.socket) -> int | None:
    """The parent pid of the process at the other end of ``conn`` (its ``SO_PEERCRED`` pid's)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return parent_pid(pid)


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a length-prefixed JSON object, sent with the worker's standard streams."""
    fds: list[int] = []
    data = b""
    need = None
    while need is None or len(data) < need:
        chunk, ancdata, _flags, _addr = conn.recvmsg(1 << 16, socket.CMSG_SPACE(3 * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4]))
        if not chunk:
            raise ConnectionError("closed before its request was whole")
        data += chunk
        if need is None and len(data) >= 4:
            need = 4 + struct.unpack("!I", data[:4])[0]
            if need > MAX_REQUEST:
                raise ConnectionError("request too large")
    return json.loads(data[4:need]), fds


def _become_worker(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked copy: take on the worker's streams, environment, directory, mask and priority,
    then run Ray's worker entry point as ``__main__``. Never returns."""
    import random
    import runpy
    import threading

    code = 1
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a new interpreter's; the server ignores it
        signal.pthread_sigmask(signal.SIG_SETMASK, [signal.Signals(s) for s in request["sigmask"]])
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        with suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(script)
        # The script that the raylet started ends (killed): so does this copy, as the worker it stands for.
        threading.Thread(target=_end_with_script, args=(conn,), daemon=True, name="rlmix-fork-script").start()
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _end_with_script(conn: socket.socket) -> None:
    with suppress(OSError):
        while conn.recv(64):
            pass
    os._exit(1)


def _status(code: int) -> int:
    """A waitpid status as a shell would report it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(code):
        return 128 + os.WTERMSIG(code)
    return os.WEXITSTATUS(code) if os.WIFEXITED(code) else 1


def serve() -> None:
    """The server: import what a worker imports, read its socket's path from stdin, then fork one copy
    per request of the raylet's children (whose pid is stdin's next line) until stdin ends."""
    import importlib

    # A signal to the driver's process group is the driver's to handle, as in Ray's own processes
    # (rlmix.orchestration.session.GROUP_SIGNALS; Ray ignores SIGINT in them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    stdin = sys.stdin.fileno()
    failed = None
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        if "ray._raylet" in sys.modules:
            raise ImportError(f"{', '.join(PRELOAD)} imported Ray's core, which a copy must load itself")
    except Exception as err:  # noqa: BLE001 - any failure leaves the workers to start on their own
        failed = err
    line = _line(stdin)
    if line is None:  # discarded before it was needed
        return
    path = Path(line)
    if failed is not None:
        Path(f"{path}{GONE}").touch()  # the workers' scripts start on their own at once
        print(f"rlmix: the fork server could not import what a worker needs ({type(failed).__name__}: {failed}); "
              "actor processes start on their own", file=sys.stderr, flush=True)
        sys.exit(1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with suppress(FileNotFoundError):
        path.unlink()
    old = os.umask(0o077)  # the socket is the user's alone
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(64)
    raylet: int | None = None
    waiting: list[socket.socket] = []  # connections made before the raylet was known
    children: dict[int, socket.socket] = {}
    pending = b""
    while True:
        readable, _, _ = select.select([listener, stdin], [], [], 0.2)
        if stdin in readable:
            chunk = os.read(stdin, 64)
            if not chunk:  # the driver closed it (Session.close) or ended
                break
            pending += chunk
            if b"\n" in pending and raylet is None:
                raylet = int(pending.split(b"\n", 1)[0])
        if listener in readable:
            conn, _ = listener.accept()
            waiting.append(conn)
        if raylet is not None:
            for conn in waiting:
                _answer(conn, raylet, children, listener)
            waiting = []
        _reap(children)
    Path(f"{path}{GONE}").touch()
    listener.close()


def _line(fd: int) -> str | None:
    """One line from ``fd``, read a byte at a time so that nothing after it is taken; None at its end."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            return None
        line += byte
    return line.decode().strip()


def _answer(conn: socket.socket, raylet: int, children: dict[int, socket.socket], listener: socket.socket) -> None:
    if _peer_parent(conn) != raylet:
        conn.close()
        return
    try:
        conn.settimeout(10.0)
        request, fds = _read_request(conn)
    except (OSError, ValueError, KeyError, ConnectionError):
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in children.values():
            other.close()
        conn.settimeout(None)
        _become_worker(conn, request, fds)
    for fd in fds:
        os.close(fd)
    with suppress(OSError):
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    children[pid] = conn


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with suppress(OSError):
                conn.sendall(json.dumps({"exit": _status(code)}).encode() + b"\n")
            conn.close()


if __name__ == "__main__":
    serve()
