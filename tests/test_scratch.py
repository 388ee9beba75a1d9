"""A run's scratch directory (rlmix.isolation.scratch): what a run makes goes, however it ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlmix.isolation import scratch
from rlmix.isolation.scratch import ENV, PREFIX, kill_processes_under, reap_stale, run_scratch, scratch_dir
from tests.agentic_models import BRIEF_AGENT

RLMIX = str(Path(sys.executable).with_name("rlmix"))


@pytest.fixture
def no_open_scratch(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def test_a_block_gets_a_scratch_dir_named_for_its_process_and_it_goes_with_what_is_in_it(no_open_scratch):
    with run_scratch() as path:
        assert path.name.startswith(f"{PREFIX}{os.getpid()}-") and os.environ[ENV] == str(path)
        assert scratch_dir() == path
        inner = Path(tempfile.mkdtemp(dir=scratch_dir()))
        (inner / "ro").mkdir()
        (inner / "ro" / "f").write_text("x")
        (inner / "ro").chmod(0o500)  # a sandbox's read-only directory
    assert not path.exists() and ENV not in os.environ
    assert scratch_dir() == scratch.scratch_parent()


def test_the_scratch_dir_goes_when_the_block_raises(no_open_scratch):
    with pytest.raises(RuntimeError), run_scratch() as path:
        (path / "x").write_text("x")
        raise RuntimeError("a failed run")
    assert not path.exists() and ENV not in os.environ


def test_an_inner_block_uses_the_open_scratch_dir_and_leaves_it_to_its_owner(no_open_scratch):
    with run_scratch() as outer:
        with run_scratch() as inner:
            assert inner == outer
        assert outer.is_dir()
    assert not outer.exists()


def test_processes_running_from_the_scratch_dir_are_killed_with_it(no_open_scratch):
    with run_scratch() as path:
        (path / "box").mkdir()
        (path / "box" / "log").touch()
        by_arg = subprocess.Popen(["tail", "-f", str(path / "box" / "log")])  # as bwrap names its binds
        by_cwd = subprocess.Popen(["sleep", "301"], cwd=path / "box")
        elsewhere = subprocess.Popen(["sleep", "302"])
    try:
        assert by_arg.wait(timeout=10) == -signal.SIGKILL and by_cwd.wait(timeout=10) == -signal.SIGKILL
        assert elsewhere.poll() is None
        assert kill_processes_under(path) == 0
    finally:
        elsewhere.kill()
        elsewhere.wait()


def test_stale_scratch_dirs_of_dead_drivers_are_reaped_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f"{PREFIX}{dead.pid}-abc"
    (gone / "sandbox").mkdir(parents=True)
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "rlmix-py-unrelated"
    other.mkdir()
    assert reap_stale(tmp_path) == [gone]
    assert not gone.exists() and live.is_dir() and other.is_dir()



def test_two_drivers_reaping_the_same_stale_dir_at_once_both_finish(tmp_path):
    """Two commands started together both reap a dead driver's scratch directory: entries the other
    removed first are already gone, which is not an error (it used to end one command with a
    traceback from the removal's error handler)."""
    from concurrent.futures import ThreadPoolExecutor

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{PREFIX}{dead.pid}-abc"
    for i in range(150):
        (stale / f"task{i}" / "tests").mkdir(parents=True)
        for name in ("a", "b", "c"):
            (stale / f"task{i}" / "tests" / name).write_text(name)
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(scratch._rmtree, stale) for _ in range(4)]:
            future.result()
    assert not stale.exists()

# -- a training run, through the CLI ------------------------------------------------------------

AGENT_RUN = ["+experiment=sc_mis", "task=minicode_agent", "task.levels=[1]", "fleet=smoke",
             "loop.groups_per_step=4", "loop.group_size=4", "loop.groups_per_request=2", "logger.wandb.mode=disabled"]


def own_temp_dir() -> Path:
    """A fresh system temp directory for one run (TMPDIR), which sandboxes run as nobody can reach."""
    path = Path(tempfile.mkdtemp(prefix="rlmix-test-tmp-", dir="/tmp"))
    path.chmod(0o755)
    return path


def left_behind(temp: Path) -> list[str]:
    """What a run left in its temp directory, and the processes still running from it."""
    entries = [p.name for p in temp.iterdir() if p.name.startswith("rlmix-")]
    procs = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(temp).encode() in (entry / "cmdline").read_bytes():
                procs.append(f"pid {entry.name}: {(entry / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return entries + procs


@pytest.mark.slow
def test_an_agentic_run_interrupted_with_ctrl_c_leaves_no_sandbox_directory_or_process(tmp_path):
    temp = own_temp_dir()
    run = tmp_path / "run"
    env = os.environ | {"TMPDIR": str(temp)}
    proc = subprocess.Popen([RLMIX, "train", *AGENT_RUN, *BRIEF_AGENT, "loop.steps=50", f"hydra.run.dir={run}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900
        while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no step in 900 s"
            time.sleep(1)
        assert any(p.name.startswith(PREFIX) for p in temp.iterdir())  # the run's sandboxes live there
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert left_behind(temp) == []
    shutil.rmtree(temp)  # what else used TMPDIR: Ray, torch's compile cache
