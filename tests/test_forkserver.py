"""Worker processes forked from a server that has imported torch (rlmix.orchestration.forkserver).

The server is driven here as the raylet drives it, by starting ``fork_worker.py`` with a worker
program, so each behaviour is checked without Ray; the last test runs a local Ray instance through it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlmix.orchestration.forkserver import ENV, GONE, SCRIPT, WORKER_ENV, ForkServer, discard_early, prestart
from tests.faults import parent

pytestmark = pytest.mark.slow

# Stands in for Ray's default_worker.py: reports what the process it runs in looks like.
WORKER = """
import json, os, signal, sys, time
report = {"argv": sys.argv, "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
          "marker": os.environ.get("FORK_TEST_MARKER"), "torch_loaded": "torch" in sys.modules,
          "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
          "path0": sys.path[0], "main": __name__}
open(os.environ["FORK_TEST_OUT"], "w").write(json.dumps(report))
if sys.argv[1:] == ["--sleep"]:
    time.sleep(300)
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture
def served(tmp_path):
    """A running server, told that this test process is the raylet, and a launcher for workers."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    saved = {k: os.environ.get(k) for k in (ENV, WORKER_ENV)}
    server = ForkServer.for_run(tmp_path)
    assert server is not None and server.serve_children_of(os.getpid())

    def launch(*args: str, out: Path, cwd: Path = tmp_path, env: dict | None = None) -> subprocess.Popen:
        environ = dict(os.environ) | {WORKER_ENV: str(worker), "FORK_TEST_OUT": str(out),
                                      "FORK_TEST_MARKER": "from-the-launcher"} | (env or {})
        return subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=cwd, env=environ)

    try:
        yield server, launch
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _report(out: Path, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().endswith("}"):
            return json.loads(out.read_text())
        time.sleep(0.05)
    pytest.fail(f"no report in {out}")


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_is_a_copy_of_the_server_with_the_launchers_arguments_environment_and_status(served, tmp_path):
    server, launch = served
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "report.json"
    proc = launch("7", "--flag=x", out=out, cwd=elsewhere)
    assert proc.wait(timeout=120) == 7  # the copy's exit status, through the script the raylet started
    report = _report(out)
    assert report["ppid"] == server.process.pid and report["pid"] != proc.pid  # forked by the server
    assert report["torch_loaded"]  # imported once, by the server
    assert report["argv"][1:] == ["7", "--flag=x"] and report["main"] == "__main__"
    assert report["cwd"] == str(elsewhere) and report["marker"] == "from-the-launcher"
    assert report["path0"] == str(tmp_path)  # the worker program's directory, as a new interpreter has


def test_the_copy_takes_on_the_launchers_signal_mask(served, tmp_path):
    _server, launch = served
    out = tmp_path / "report.json"
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        proc = launch(out=out)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert proc.wait(timeout=120) == 0
    assert int(signal.SIGHUP) in _report(out)["blocked"]


def test_a_killed_launcher_takes_its_copy_with_it_and_a_killed_copy_ends_its_launcher(served, tmp_path):
    _server, launch = served
    out = tmp_path / "a.json"
    proc = launch("--sleep", out=out)
    copy = _report(out)["pid"]
    proc.kill()  # what the raylet (or the session's end) does to the process it started
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(copy) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(copy)

    out = tmp_path / "b.json"
    proc = launch("--sleep", out=out)
    os.kill(_report(out)["pid"], signal.SIGKILL)  # what Ray does to a worker, by the pid it registered
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL


def test_a_killed_server_leaves_later_workers_to_start_on_their_own(served, tmp_path):
    server, launch = served
    out = tmp_path / "a.json"
    proc = launch("--sleep", out=out)
    copy = _report(out)["pid"]
    server.process.kill()  # its socket stays, refusing
    server.process.wait()
    out = tmp_path / "b.json"
    started = time.monotonic()
    late = launch("5", out=out)
    assert late.wait(timeout=120) == 5 and time.monotonic() - started < 30
    assert _report(out)["pid"] == late.pid  # ran the worker program itself
    assert _alive(copy)  # a copy made before runs on
    proc.kill()
    proc.wait()


def test_only_the_raylets_own_children_are_served(served, tmp_path):
    server, _launch = served
    assert server.process.poll() is None
    # This process is not a child of the "raylet" (itself): its connection is closed, nothing forked.
    import socket

    deadline = time.monotonic() + 60
    while not server.path.exists() and time.monotonic() < deadline:  # the server is still importing
        time.sleep(0.05)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(server.path))
    conn.settimeout(30)
    assert conn.recv(64) == b""
    conn.close()
    assert [pid for pid in _children_of(server.process.pid)] == []


def _children_of(pid: int) -> list[int]:
    return [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if parent(int(p)) == pid]


def test_with_no_server_the_script_runs_the_worker_program_itself(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "report.json"
    env = dict(os.environ) | {WORKER_ENV: str(worker), "FORK_TEST_OUT": str(out),
                              ENV: str(tmp_path / "gone" / "fork-server.sock")}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "3"], env=env)
    assert proc.wait(timeout=120) == 3
    report = _report(out)
    assert report["pid"] == proc.pid and not report["torch_loaded"]  # the script became the worker program


def test_a_server_that_cannot_import_tells_the_scripts_to_start_on_their_own(tmp_path):
    """A failed import (or a stopped server) leaves ``<socket>.gone``: a script does not wait out READY_WAIT_S."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "report.json"
    sock = tmp_path / "fork-server.sock"
    Path(f"{sock}{GONE}").touch()
    env = dict(os.environ) | {WORKER_ENV: str(worker), "FORK_TEST_OUT": str(out), ENV: str(sock)}
    started = time.monotonic()
    assert subprocess.run([sys.executable, str(SCRIPT)], env=env, timeout=120).returncode == 0
    assert time.monotonic() - started < 30
    assert _report(out)["ppid"] == os.getpid()  # the script's own process, not a copy


def test_a_local_ray_instance_forks_its_actors_and_restarts_a_killed_one_the_same_way():
    import ray

    from rlmix.orchestration.session import SESSION

    @ray.remote(max_restarts=1)
    class Probe:
        def where(self) -> tuple[int, int, bool]:
            return os.getpid(), os.getppid(), "torch" in sys.modules

    try:
        SESSION.ensure_ray(None, 2, set(), {}, False, fork_workers=True)
        server = SESSION.fork.process.pid
        actor = Probe.remote()
        pid, ppid, torch_loaded = ray.get(actor.where.remote(), timeout=120)
        assert ppid == server and torch_loaded
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                again, ppid, _ = ray.get(actor.where.remote(), timeout=60)
                break
            except ray.exceptions.RayActorError:
                time.sleep(0.5)
        assert again != pid and ppid == server
    finally:
        SESSION.close()
    assert not _alive(server)


def _tagged(tag: str) -> list[int]:
    """Processes whose environment holds ``tag`` (what a command started, wherever it was reparented)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag.encode() in Path(f"/proc/{pid}/environ").read_bytes() and _alive(int(pid)):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_bad_input_ends_the_server_its_command_launched(tmp_path):
    import uuid

    tag = f"FORK_TEST_TAG={uuid.uuid4().hex}"
    env = dict(os.environ) | dict([tag.split("=")])
    rlmix = Path(sys.executable).with_name("rlmix")
    run = subprocess.run([str(rlmix), "train", "+experiment=smoke", "loop.steps=oops"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "loop.steps" in run.stderr
    assert _tagged(tag) == []


def test_an_untaken_server_is_discarded_at_once():
    prestart()
    from rlmix.orchestration import forkserver

    server = forkserver._EARLY[0]
    discard_early()
    assert not forkserver._EARLY and server.process.poll() is not None


def test_a_launched_server_that_has_ended_is_not_named_to_the_workers(tmp_path, monkeypatch):
    """Workers told of a server that will never listen would each wait READY_WAIT_S for it."""
    monkeypatch.delenv(ENV, raising=False)
    prestart()
    from rlmix.orchestration import forkserver

    forkserver._EARLY[0].process.kill()
    forkserver._EARLY[0].process.wait()
    assert ForkServer.for_run(tmp_path) is None
    assert ENV not in os.environ and not forkserver._EARLY
