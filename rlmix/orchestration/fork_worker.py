"""The program a local Ray instance's raylet starts for each worker: the worker is forked from rlmix's
fork server (rlmix.orchestration.forkserver), which has already imported what it needs.

    python fork_worker.py [RAY'S WORKER ARGUMENTS ...]

Ray's own worker program (``default_worker.py``) is named in ``RLMIX_RAY_WORKER``. Hands its
arguments, environment, directory, signal mask, priority and standard streams to the server named
in ``RLMIX_FORK_SERVER``, then waits for the copy's end and exits with its status; it forwards
SIGTERM, SIGINT and SIGHUP to the copy. Where no server answers (none named, none ready within
``READY_WAIT_S``, or it serves no more), it runs ``default_worker.py`` itself, as Ray would have.

Run as a script by a new interpreter for every worker, so it imports only the standard library
modules the interpreter has already loaded, and nothing of rlmix.
"""

import json
import os
import signal
import socket
import struct
import sys
import time

ENV = "RLMIX_FORK_SERVER"  # rlmix.orchestration.forkserver.ENV
WORKER_ENV = "RLMIX_RAY_WORKER"  # rlmix.orchestration.forkserver.WORKER_ENV
READY_WAIT_S = 60.0  # rlmix.orchestration.forkserver.READY_WAIT_S
GONE = ".gone"  # rlmix.orchestration.forkserver.GONE
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def on_its_own(argv):
    os.execv(sys.executable, [sys.executable, *argv])


def connect(path):
    """A connection to the server, or None where it serves no more (``<socket>.gone``: stopped, or its
    imports failed), has died (its socket refuses), or is not ready within ``READY_WAIT_S``."""
    deadline = time.monotonic() + READY_WAIT_S
    refused = 0
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except (FileNotFoundError, ConnectionRefusedError) as err:
            conn.close()
            # Refused: a socket no process listens on, or one in the instant between its bind and listen.
            refused = refused + 1 if isinstance(err, ConnectionRefusedError) else 0
            if refused > 10 or time.monotonic() > deadline or os.path.exists(path + GONE) \
                    or not os.path.isdir(os.path.dirname(path)):
                return None
            time.sleep(0.02)


def main(args):
    argv = [os.environ[WORKER_ENV], *args]
    path = os.environ.get(ENV)
    conn = connect(path) if path else None
    if conn is None:
        on_its_own(argv)
    request = {
        "argv": argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    body = json.dumps(request).encode()
    streams = struct.pack("3i", 0, 1, 2)
    try:
        conn.sendmsg([struct.pack("!I", len(body)) + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
    except OSError:  # the server ended meanwhile
        on_its_own(argv)
    reader = conn.makefile("rb")
    child = None
    for line in reader:
        message = json.loads(line)
        if "pid" in message:
            child = message["pid"]
            for signum in FORWARDED:
                signal.signal(signum, lambda s, _f: os.kill(child, s))
        elif "exit" in message:
            sys.exit(message["exit"])
    if child is None:  # the server ended before it forked
        on_its_own(argv)
    # The server ended before the copy: the copy's end closes the connection, with no status to tell.
    sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
