"""The local runtime's resident sandbox (``rlmix/isolation/resident.py``): one namespace for all of a
working copy's commands, each of which must see what a sandbox of its own would have shown it.

Real bwrap and the real init; the attacks a command could make on the init that outlives it are
tried from inside.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from rlmix.agentic.local import LocalRuntime
from rlmix.isolation import resident
from rlmix.isolation.bwrap import isolation_problem, system_python
from tests.test_agentic_sandbox import host_pids_running, sandbox, task  # noqa: F401 (the fixtures)

pytestmark = [
    pytest.mark.skipif(isolation_problem() is not None, reason=f"{isolation_problem()}"),
    pytest.mark.skipif(system_python() is None, reason="no python3 on the sandbox's system directories"),
]

# Commands whose output and status are the same in any fresh sandbox, run in this order.
SAME_EITHER_WAY = (
    "echo out; echo err >&2; exit 3",
    "pwd; echo $HOME $TMPDIR $APP_DIR; id -u",
    "export LEFT=1; cd /tmp; echo x > note",
    "echo [$LEFT]; pwd; cat /tmp/note",
    "sh -c 'kill -TERM $$'; echo $?",
    "cat /no/such/file",
    "read line; echo [$line]",
    "printf 'no newline'",
    "echo closing; exec >/dev/null 2>&1; sleep 0.2; exit 4",
    "yes | head -c 3",
)
STARTED_AT = "cut -d' ' -f22 /proc/1/stat"  # the namespace's init, by its start time


def test_a_command_sees_what_a_sandbox_of_its_own_would_show(task):
    seen = {}
    for resident_ in (True, False):
        sb = LocalRuntime(None, 512, None, 10.0, resident=resident_).start(task, network=False)
        try:
            seen[resident_] = [(r.exit_code, r.output, r.timed_out)
                               for r in (sb.run(command, timeout_s=10.0) for command in SAME_EITHER_WAY)]
        finally:
            sb.close()
    assert seen[True] == seen[False]
    assert seen[True][0] == (3, "out\nerr\n", False) and seen[True][4][1].endswith("143\n")


def test_nothing_a_command_starts_is_left_for_the_next(sandbox):
    started = sandbox.run("sleep 300 & setsid nohup sleep 300 >/dev/null 2>&1 & disown; (sleep 301 &); echo started",
                          timeout_s=10.0)
    assert (started.exit_code, started.output) == (0, "started\n")
    # Every process of the namespace, by command line: the init and this command's own.
    left = sandbox.run("for p in /proc/[0-9]*; do echo ${p#/proc/} $(tr '\\0' ' ' < $p/cmdline | cut -c1-40); done",
                       timeout_s=10.0)
    assert "sleep" not in left.output
    assert [line.split()[0] for line in left.output.splitlines()][0] == "1", left.output
    assert len(left.output.splitlines()) <= 3, left.output  # init, bash, and at most the last `tr` or `cut`


def test_a_command_can_neither_kill_nor_read_nor_trace_the_init(sandbox):
    before = sandbox.run(STARTED_AT, timeout_s=10.0).output
    res = sandbox.run("for s in INT TERM HUP QUIT USR1 KILL; do kill -$s 1; done; ls /proc/1/fd; cat /proc/1/environ; "
                      "cat /proc/1/mem; echo done", timeout_s=10.0)
    assert res.output.count("Permission denied") == 3 and res.output.endswith("done\n"), res.output
    assert sandbox.run(STARTED_AT, timeout_s=10.0).output == before  # the same init, not a new one


def test_a_command_at_its_time_limit_takes_the_sandbox_with_it(sandbox):
    before = sandbox.run(STARTED_AT, timeout_s=10.0).output
    hung = sandbox.run("echo before; sleep 30", timeout_s=1.0)
    assert (hung.exit_code, hung.output, hung.timed_out) == (-1, "before\n", True)
    after = sandbox.run(f"{STARTED_AT}; ls /proc | grep -c '^[0-9]'", timeout_s=10.0)
    started_at, processes = after.output.split()
    assert after.exit_code == 0 and started_at != before.strip() and int(processes) <= 4


def test_a_sandbox_outlives_the_thread_that_started_it(sandbox):
    # Episodes run on pool threads; the sandbox is the working copy's, not the thread's.
    started = []
    thread = threading.Thread(target=lambda: started.append(sandbox.run(STARTED_AT, timeout_s=10.0).output))
    thread.start()
    thread.join()
    time.sleep(0.2)
    assert [sandbox.run(STARTED_AT, timeout_s=10.0).output for _ in range(2)] == started * 2


@pytest.mark.slow  # a runner process killed, then its sandbox awaited
def test_a_sandbox_ends_when_its_runner_dies_mid_command(task):
    token = f"{uuid.uuid4().int % 10**6 + 10**6}.5"  # a unique `sleep` argument to find it by
    runner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from pathlib import Path
        from rlmix.agentic.harbor import load_tasks
        from rlmix.agentic.local import LocalRuntime
        sb = LocalRuntime(None, 512, None, 600.0).start(load_tasks(Path(sys.argv[1]))["calc"], network=False)
        sb.run(f"exec >/dev/null 2>&1; sleep {sys.argv[2]} & sleep {sys.argv[2]}", timeout_s=600.0)
    """), str(task.path.parent), token], cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 30
        while len(host_pids_running(token)) < 2:
            assert time.monotonic() < deadline and runner.poll() is None, "the command never started"
            time.sleep(0.05)
    finally:
        runner.kill()
        runner.wait()
    deadline = time.monotonic() + 10
    while host_pids_running(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_pids_running(token) == []


def test_a_command_is_not_the_namespaces_init(sandbox):
    # As PID 1 a command would be immune to its own signals; here it is an ordinary process.
    assert sandbox.run("kill -TERM $$; echo survived", timeout_s=10.0).exit_code == 143


@pytest.mark.parametrize("missing, replacement, warning", [
    ("system_python", lambda: None, "no python3 on the sandbox's system directories"),
    # As an init would that failed under a low RLIMIT_AS, or could not make itself untraceable.
    ("_init_source", lambda: "raise SystemExit('the init refused')",
     "the sandbox's init did not start: the init refused"),
], ids=["no python3", "init refused"])
def test_without_an_init_each_command_gets_a_sandbox_of_its_own(task, monkeypatch, caplog, missing, replacement,
                                                                warning):
    monkeypatch.setattr(resident, missing, replacement)
    sb = LocalRuntime(None, 512, None, 10.0).start(task, network=False)
    try:
        with caplog.at_level(logging.WARNING):
            runs = [sb.run("echo hi; tr '\\0' ' ' </proc/1/cmdline", timeout_s=10.0) for _ in range(2)]
    finally:
        sb.close()
    assert [r.exit_code for r in runs] == [0, 0] and all(r.output.startswith("hi\n") for r in runs)
    assert not any("python3" in r.output for r in runs)  # the command is its namespace's PID 1: no init of ours
    assert warning in caplog.text
