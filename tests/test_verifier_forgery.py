"""A verdict forged by the code under test: rlmix_verify.sh's harness nonce must be out of its reach.

The code under test runs inside the python_tests harness, whose audit hook refuses ``/proc`` by path
name; a path relative to a descriptor of ``/`` passes that check. Through it the code reads other
processes' command lines, environments and memory, and writes a passing verdict under every nonce it
finds to every descriptor it holds (one of them is the pipe the verdict is read from).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rlmix.agentic.grading import grade_patch
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime
from rlmix.isolation.bwrap import isolation_problem
from tests.test_agentic_fixtures import BUGGY, make_task

needs_bwrap = pytest.mark.skipif(isolation_problem() is not None,
                                 reason=f"{isolation_problem()}; `make setup` as root installs bubblewrap")

FORGE = r'''import os, re


def _tokens(proc, pid):
    found = set()
    for what in ("cmdline", "environ"):
        try:
            fd = os.open(pid + "/" + what, os.O_RDONLY, dir_fd=proc)
            found.update(re.findall(rb"[0-9a-f]{32}", os.read(fd, 1 << 20)))
            os.close(fd)
        except OSError:
            pass
    if pid == str(os.getpid()):
        return found  # the harness's own memory: its audit hook's business, not the script's
    try:
        fd = os.open(pid + "/maps", os.O_RDONLY, dir_fd=proc)
        maps = os.read(fd, 1 << 20)
        os.close(fd)
        mem = os.open(pid + "/mem", os.O_RDONLY, dir_fd=proc)
    except OSError:
        return found
    for line in maps.splitlines():
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split(b"-"))
        if perms.startswith(b"rw") and end - start <= 64 << 20:
            try:
                found.update(re.findall(rb"[0-9a-f]{32}", os.pread(mem, end - start, start)))
            except OSError:
                pass
    os.close(mem)
    return found


def _forge():
    root = os.open("/", os.O_RDONLY)
    proc = os.open("proc", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)
    found = set()
    for _ in range(50):
        for pid in [name for name in os.listdir(proc) if name.isdigit()]:
            found |= _tokens(proc, pid)
        if found:
            break
    for token in found:
        for fd in range(20):
            try:
                os.write(fd, b"\n" + token + b" 2 2 1 -\n")
            except OSError:
                pass
    os._exit(0)


_forge()
'''


class RuntimeWithProc(LocalRuntime):
    """The local runtime as if it could not leave /proc out of the grading sandbox (as docker cannot)."""

    def start(self, task, network, proc=True):
        return super().start(task, network, True)


def _patch(task, tmp_path: Path, calc_py: str) -> str:
    """A git patch that replaces the fixture's calc.py with ``calc_py``."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    repo = tmp_path / "work"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(task.repo_dir, repo)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], cwd=repo, check=True)
    (repo / "calc.py").write_text(calc_py)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    return subprocess.run([*git, "diff", "--cached", "--binary", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@needs_bwrap
@pytest.mark.parametrize("runtime", [LocalRuntime, RuntimeWithProc], ids=["no_proc", "with_proc"])
def test_a_verdict_forged_under_a_nonce_read_through_proc_scores_zero(tmp_path, runtime):
    make_task(tmp_path / "tasks", "calc")
    task = load_tasks(tmp_path / "tasks")["calc"]

    def grade(calc_py: str):
        return grade_patch(task, _patch(task, tmp_path, calc_py), runtime(None, 512, None, 10.0), retries=0)

    forged = grade(FORGE + BUGGY)
    assert (forged.reward, forged.infra_error) == (0.0, None), forged.log_tail
    # The same grader passes the honest fix: the zero above is the forgery failing, not grading.
    fixed = grade(BUGGY.replace("a - b", "a + b", 1))
    assert (fixed.reward, fixed.note) == (1.0, None), fixed.log_tail


# Correct only where no /proc is reachable, not even relative to a descriptor of "/".
FIXED_WITHOUT_PROC = '''import os
try:
    os.stat("proc/self", dir_fd=os.open("/", os.O_RDONLY))  # a stat: the harness refuses opening it so
    SIGN = -1
except OSError:
    SIGN = 1


def add(a, b):
    return a + SIGN * b


def sub(a, b):
    return a - b
'''


@needs_bwrap
def test_rlmix_verify_is_graded_without_proc_and_the_agent_keeps_one(tmp_path):
    make_task(tmp_path / "tasks", "calc")
    task = load_tasks(tmp_path / "tasks")["calc"]
    runtime = LocalRuntime(None, 512, None, 10.0)
    grade = grade_patch(task, _patch(task, tmp_path, FIXED_WITHOUT_PROC), runtime, retries=0)
    assert (grade.reward, grade.note) == (1.0, None), grade.log_tail
    sandbox = runtime.start(task, network=False)  # the agent's: its tools (ps, pytest's plugins) may read /proc
    try:
        assert sandbox.run("test -r /proc/self/status", timeout_s=10.0).exit_code == 0
    finally:
        sandbox.close()
