"""Sandbox runtimes: the local runtime's limits, and the docker runtime where an engine exists."""

from __future__ import annotations

import pytest

from rlmix.config.swebench import RuntimeKind, SwebenchProConfig
from rlmix.agentic.docker import DockerRuntime, docker_available
from rlmix.agentic.grading import grade_patch
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime, no_network_prefix
from rlmix.agentic.run import RUNTIMES, run_sample, run_swebench_eval
from rlmix.agentic.sandbox import capture_patch, snapshot_baseline
from rlmix.errors import ConfigError
from tests.test_agentic_fixtures import FIX, SUBMIT, TRUSTED, ScriptedPolicy, make_task


@pytest.fixture
def task(tmp_path):
    make_task(tmp_path / "tasks", "calc")
    return load_tasks(tmp_path / "tasks")["calc"]


def test_every_runtime_kind_has_a_factory():
    assert set(RUNTIMES) == set(RuntimeKind)


@pytest.fixture(params=["exec_chain", "preexec_fn"])
def launch(request, monkeypatch):
    """Commands start through prlimit/setpriv where util-linux has them, else by a preexec_fn (process.py)."""
    from rlmix.isolation import process

    if request.param == "exec_chain" and process._exec_chain_tools() is None:
        pytest.skip("prlimit or setpriv is not installed")
    if request.param == "preexec_fn":
        monkeypatch.setattr(process, "_exec_chain_tools", lambda: None)
    return request.param


def test_local_memory_limit_and_working_copy(task, launch):
    sb = LocalRuntime(memory_mb=256, max_procs=512, cpu_s=None, turn_timeout_s=10.0, trusted=TRUSTED).start(task, network=False)
    try:
        big = sb.run("python3 -c 'x = bytearray(512 * 1024 * 1024)'", timeout_s=20.0)
        assert big.exit_code != 0 and "MemoryError" in big.output
        small = sb.run("python3 -c 'x = bytearray(16 * 1024 * 1024); print(len(x))'", timeout_s=20.0)
        assert small.exit_code == 0 and small.output.strip() == str(16 * 1024 * 1024)
        base = snapshot_baseline(sb)
        sb.run("echo new > added.txt && rm test_calc.py", timeout_s=10.0)
        patch, error = capture_patch(sb, base)
        assert error is None
        assert "+new" in patch and "deleted file mode" in patch
    finally:
        sb.close()
    assert (task.repo_dir / "test_calc.py").is_file()  # the task's own copy is never touched


def test_a_command_runs_under_every_limit_and_as_the_sandbox_user(task, launch):
    import os

    from rlmix.isolation.bwrap import SANDBOX_UID, sandbox_user

    # Unisolated (trusted), RLIMIT_NPROC counts every process of the user on the machine (other
    # tests' sandboxes, other runs): far above what they reach, so the value can be read back.
    sb = LocalRuntime(memory_mb=300, max_procs=3001, cpu_s=9, turn_timeout_s=10.0, trusted=TRUSTED).start(task, network=False)
    try:
        out = sb.run("ulimit -Hv; ulimit -Hu; ulimit -Ht; ulimit -v; ulimit -u; ulimit -t; id -u; id -G", timeout_s=10.0)
    finally:
        sb.close()
    lines = out.output.split()
    assert lines[:6] == [str(300 * 1024), "3001", "9"] * 2  # soft = hard: the command cannot raise them
    if sandbox_user():  # root runs commands as nobody, with no supplementary groups of ours
        assert lines[6] == str(SANDBOX_UID) and "0" not in lines[7:]
    else:
        assert lines[6] == str(os.getuid())


@pytest.mark.slow  # burns CPU until its limit: a second
def test_local_cpu_limit(task, launch):
    sb = LocalRuntime(memory_mb=None, max_procs=512, cpu_s=1, turn_timeout_s=10.0, trusted=TRUSTED).start(task, network=False)
    try:
        res = sb.run("python3 -c 'while True: pass'", timeout_s=20.0)
        assert not res.timed_out and res.exit_code != 0 and res.duration_s < 10.0  # SIGXCPU, not the wall clock
    finally:
        sb.close()


@pytest.mark.skipif(TRUSTED and not no_network_prefix(), reason="neither bwrap nor unshare -n can run here")
def test_local_agent_phase_has_no_network(task):
    probe = ("python3 -c \"import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=3)\n"
             "except OSError as e:\n    print(type(e).__name__, e.errno)\"")
    sb = LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED).start(task, network=False)
    try:
        out = sb.run(probe, timeout_s=10.0).output
        assert "OSError 101" in out  # ENETUNREACH: no interface but loopback
    finally:
        sb.close()


def test_local_runtime_needs_the_repo_directory(tmp_path):
    d = make_task(tmp_path / "tasks", "norepo")
    import shutil

    shutil.rmtree(d / "environment" / "repo")
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all")
    with pytest.raises(ConfigError, match="^1 task.s. cannot run with task.runtime=local: task norepo has no"):
        run_swebench_eval(cfg, ScriptedPolicy([SUBMIT]), ks=[1], samples=1, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.skipif(not docker_available(), reason="no Docker engine answers `docker info`")
@pytest.mark.slow
def test_docker_runtime_end_to_end(task, tmp_path):
    """Builds the fixture image (FROM python:3.11, which has git), runs a fixing episode, grades it."""
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all", runtime=RuntimeKind.docker,
                            turn_timeout_s=30.0)
    runtime = DockerRuntime(cfg.docker_image_prefix)
    sb = runtime.start(task, network=False)
    try:
        assert sb.run("pwd", timeout_s=30.0).output.strip() == "/work/repo"
        assert sb.run("sleep 100", timeout_s=1.0).timed_out
        assert sb.run("python3 -c \"import socket; socket.create_connection(('192.0.2.1', 80), timeout=3)\"",
                      timeout_s=30.0).exit_code != 0
    finally:
        sb.close()
    good = run_sample(task, 0, ScriptedPolicy([FIX, SUBMIT]), runtime, cfg)
    assert (good.outcome.reward, good.outcome.infra_error) == (1.0, None)
    assert grade_patch(task, "", runtime, retries=0).reward == 0.0


def test_git_never_touches_an_enclosing_repository(task, tmp_path, monkeypatch):
    import subprocess
    import tempfile

    outer = tmp_path / "outer"
    outer.mkdir()
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    monkeypatch.setattr(tempfile, "tempdir", str(outer))  # sandboxes now live inside another repository
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all", turn_timeout_s=10.0)
    runtime = LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED)
    assert run_sample(task, 0, ScriptedPolicy([FIX, SUBMIT]), runtime, cfg).outcome.reward == 1.0
    wreck = run_sample(task, 1, ScriptedPolicy([FIX, "<bash>rm -rf .git</bash>", SUBMIT]), runtime, cfg)
    assert wreck.outcome.patch_error and wreck.patch == ""
    assert subprocess.run(["git", "-C", str(outer), "rev-parse", "HEAD"], capture_output=True).returncode != 0


FAKE_DOCKER = '''#!/usr/bin/env python3
"""Outside the unit: a docker CLI that logs its argv; exec runs the command locally, the rest succeeds."""
import json, os, subprocess, sys
with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_DOCKER_DOWN"):
    sys.exit(sys.stderr.write("Cannot connect to the Docker daemon at unix:///var/run/docker.sock\\n") and 1)
if sys.argv[1] == "exec":
    args, i = sys.argv[2:], 0
    while args[i].startswith("-"):
        i += 2
    sys.exit(subprocess.run(args[i + 1:]).returncode)
sys.exit(1 if sys.argv[1:3] == ["image", "inspect"] else 0)
'''


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    import json
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    return lambda: [json.loads(x) for x in log.read_text().splitlines()]


@pytest.mark.slow  # a fake docker script run per command: ~25 s
def test_docker_commands_limits_and_engine_failures(task, fake_docker, monkeypatch):
    runtime = DockerRuntime("pfx")
    sb = runtime.start(task, network=False)
    res = sb.run("echo hi; exit 3", timeout_s=5.0)
    assert (res.exit_code, res.output, res.timed_out) == (3, "hi\n", False)
    hung = sb.run("sleep 30", timeout_s=1.0)
    assert hung.timed_out and hung.exit_code == -1 and hung.duration_s < 10.0
    sb.close()
    grader = runtime.start(task, network=True)
    calls = fake_docker()
    assert calls[0] == ["build", "-t", "pfx/calc:latest", str(task.path / "environment")]
    run = calls[1]
    assert run[:2] == ["run", "-d"] and run[-2:] == ["pfx/calc:latest", "infinity"]
    assert run[run.index("--cpus") + 1] == "1" and run[run.index("--memory") + 1] == "1024m"
    assert run[run.index("--network") + 1] == "none" and "-w" in run
    assert "--network" not in [c for c in calls if c[0] == "run"][1]  # the grader asked for the network
    assert calls[2][:3] == ["exec", "-w", "/work/repo"] and calls[2][-4:] == ["5", "bash", "-c", "echo hi; exit 3"]
    assert sum(c[0] == "build" for c in calls) == 1  # the image is built once per task
    grader.close()
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    g = grade_patch(task, "", runtime, retries=1)
    assert g.infra_error and "Cannot connect to the Docker daemon" in g.infra_error and g.attempts == 2
