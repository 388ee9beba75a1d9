"""PID 1 of a resident sandbox (``resident.py``): runs the runner's commands one at a time, and after
each one kills everything it left behind.

Standalone on purpose (standard library only, Python 3.6 and later): the runner passes this file's
text to the sandbox's own ``python3 -I -S -c``, where nothing of rlmix exists.

Protocol, on the init's stdin and stdout (pipes to the runner, never seen by a command):

- in: one request per command, a 4-byte big-endian length and that many bytes: NUL-separated
  fields, the working directory, the number of arguments, the arguments, then ``NAME=value`` for
  each environment variable (no ``json``: its import would be a third of the init's start-up);
- out: frames of one kind byte, a 4-byte big-endian length and that many bytes: ``R`` (ready, once),
  ``O`` (a chunk of the command's stdout and stderr, interleaved as written) and ``X`` (the command
  ended: its exit status as ASCII digits, 128 + N for a command killed by signal N, as bwrap reports it).

A command runs with empty stdin, in a session of its own. It has ended when its output reaches end of
file, or when it has exited and its output stays quiet (a detached child may hold the pipe). Then
every other process in the PID namespace is killed (``kill(-1)`` from a namespace's init reaches
exactly the namespace) and reaped before the ``X`` frame goes out, so each command starts in a
namespace holding the init alone, as a fresh sandbox would. When its input ends (the runner closed it,
or died), the init kills the rest and exits, during a command too, and the namespace is gone.

The init is not dumpable, so a command (the same user) can neither trace it nor open its file
descriptors under /proc, and it handles no signal: the kernel delivers a namespace's init only the
signals it handles, from inside the namespace, so a command cannot kill it.
"""

import os
import select
import signal

QUIET_S = 0.05  # after the command exited: how long its output must stay quiet to count as ended
CHUNK = 1 << 16
PR_SET_DUMPABLE = 4
MAX_FD = 1 << 16


def send(kind, data=b""):
    frame = kind + len(data).to_bytes(4, "big") + data
    while frame:
        frame = frame[os.write(1, frame):]


def not_dumpable():
    """Or exit before the ready frame: the runner then gives each command a sandbox of its own."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_DUMPABLE, 0) failed: errno %d" % ctypes.get_errno())


def end_the_rest():
    """Kill every process of the namespace but this one, and reap them (and any orphan already dead)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nothing else was left
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def spawn(cwd, argv, env, out):
    """Start ``argv`` in ``cwd`` with environment ``env``, empty stdin and ``out`` as stdout and stderr; its pid.

    Forked by hand rather than through ``subprocess``, whose import is half the init's start-up.
    """
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        for which in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; a command must not
            signal.signal(which, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, MAX_FD)
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    except BaseException as e:  # noqa: BLE001 (the child must end here, whatever went wrong)
        os.write(2, ("rlmix sandbox: cannot run %s: %s\n" % (argv[0], e)).encode())
    finally:
        os._exit(127)


def read_exactly(n):
    """``n`` bytes of input, or None at its end."""
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def next_request():
    """(cwd, argv, env) of the next command, or None when the input has ended."""
    header = read_exactly(4)
    body = read_exactly(int.from_bytes(header, "big")) if header else None
    if body is None:
        return None
    fields = body.split(b"\0")
    count = int(fields[1])
    env = dict(item.split(b"=", 1) for item in fields[2 + count:])
    return fields[0], fields[2:2 + count], env


def run(cwd, argv, env):
    read, write = os.pipe()
    pid = spawn(cwd, argv, env, write)
    os.close(write)
    watched, quiet, status = [read, 0], QUIET_S, None
    while status is None:
        ready = select.select(watched, [], [], quiet)[0]
        if 0 in ready and not os.read(0, 1):  # the runner is gone: so is the sandbox
            end_the_rest()
            os._exit(1)
        if read in ready:
            chunk = os.read(read, CHUNK)
            if chunk:
                send(b"O", chunk)
                continue
            # End of file: the output is complete; the command exits now (or, having closed its
            # output, later), and the runner is watched meanwhile.
            watched, quiet = [0], 0.001
        done, status = os.waitpid(pid, os.WNOHANG)
        status = status if done else None  # at end of file, or exited with its output quiet
        quiet = min(2 * quiet, QUIET_S) if read not in watched else QUIET_S
    end_the_rest()
    os.set_blocking(read, False)
    while True:  # what was written before the rest was killed
        try:
            chunk = os.read(read, CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        send(b"O", chunk)
    os.close(read)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main():
    not_dumpable()
    # Python's own SIGINT handler would let a command interrupt the init; the default (for a
    # namespace's init: ignored from inside) is what every command inherits, too.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    send(b"R")
    request = next_request()
    while request is not None:
        send(b"X", str(run(*request)).encode())
        request = next_request()
    os._exit(0)  # input ended: nothing to flush or finalise, and the runner waits on this exit


if __name__ == "__main__":
    main()
