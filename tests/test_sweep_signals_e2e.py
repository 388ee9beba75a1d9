"""A signal during a sweep, through the real CLI: the sweep stops at the job it interrupts, its
block lists every job (the ones that never ran too), and the command it prints continues the sweep
in its own directory, where rerunning the sweep itself is refused."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.cli import rlmix
from tests.faults import SMOKE, Run, rows, summary

pytestmark = pytest.mark.slow


def test_a_signal_during_a_sweep_lists_every_job_and_prints_the_command_that_continues_it(tmp_path):
    sweep = tmp_path / "sweep"
    jobs = [sweep / "0_loop.steps=2", sweep / "1_loop.steps=12", sweep / "2_loop.steps=3"]
    run = Run(tmp_path, "-m", *SMOKE, "loop.steps=2,12,3", "hydra.sweep.dir=sweep")
    run.wait_for(lambda: len(rows(jobs[1])) >= 2, "two steps of the second job")
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 143, run.text()
    block = run.out.read_text().split("── sweep sweep ")[-1].splitlines()
    assert [re.match(r"  (\S+) +(\w+(?: run)?) ", line).groups() for line in block[1:4]] == [
        ("loop.steps=2", "completed"), ("loop.steps=12", "interrupted"), ("loop.steps=3", "not run")], block
    again = "rlmix train -m " + " ".join(SMOKE) + " loop.steps=2,12,3"
    assert block[4:] == ["next:", "  rlmix report sweep", f"  {again} resume=sweep"], block
    assert not jobs[2].exists() and summary(jobs[1])["status"] == "interrupted"

    # The sweep rerun as it was would train on top of its runs: refused, nothing written.
    before = sorted(sweep.rglob("*"))
    out = rlmix("train", *again.split()[2:], "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert out.returncode == 2 and "already holds a run" in out.stderr, out.stderr
    assert sorted(sweep.rglob("*")) == before

    # The printed command: the interrupted job continues from its checkpoint, the finished one
    # trains nothing, the one that never ran runs; no job's rows are repeated.
    out = rlmix(*again.split()[1:], "resume=sweep", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [[row["step"] for row in rows(job)] for job in jobs] == [[1, 2], list(range(1, 13)), [1, 2, 3]]
    assert [summary(job)["status"] for job in jobs] == ["completed"] * 3
