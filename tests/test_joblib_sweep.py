"""A sweep whose jobs run in joblib's worker processes (``hydra/launcher=joblib``) ends as one the basic
launcher runs: its job directories named by the swept overrides, one line per job and ``rlmix report``, and
exit status 1 when a job failed, although the jobs' own processes did the work."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmix.commands import naming
from tests.cli import rlmix
from tests.test_sweep_cli import a_sweep

JOBLIB = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "+experiment=smoke", "logger=disabled"]


def test_a_worker_process_names_a_job_by_the_keys_its_parent_swept(monkeypatch):
    monkeypatch.setenv(naming.SWEPT_ENV, "")  # restored after the test
    naming.set_swept_keys(("correction.mode", "seed"))
    monkeypatch.setattr(naming, "_swept", ())  # a worker process: the module's own record is empty
    assert naming.job_label(["+experiment=smoke", "correction.mode=mis", "seed=1"], "smoke", 1) == \
        "correction.mode=mis,seed=1"
    naming.set_swept_keys(())
    assert naming.job_label(["+experiment=smoke", "seed=1"], "smoke", 1) == "smoke_s1"


@pytest.mark.slow
def test_a_joblib_sweep_names_its_jobs_by_the_swept_overrides_and_ends_with_the_sweep_block(tmp_path):
    sweep = tmp_path / "sweep"
    out = rlmix("train", *JOBLIB, "cluster.num_cpus=1", "seed=0,1", "loop.steps=2", f"hydra.sweep.dir={sweep}",
                cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_seed=0", "1_seed=1"]
    block = out.stdout[out.stdout.index("── sweep "):].splitlines()
    assert block[1].startswith("  seed=0  completed  steps 2") and block[1].endswith("0_seed=0"), block
    assert block[2].startswith("  seed=1  completed  steps 2") and block[2].endswith("1_seed=1"), block
    assert block[3:] == ["next:", "  rlmix report sweep"], block


@pytest.mark.slow
def test_a_joblib_sweep_with_a_failed_job_lists_it_and_exits_1(tmp_path):
    """Continued in place, each job had failed before its first checkpoint: each worker keeps it as it ended
    (no Ray), and the command says so as the basic launcher's does."""
    sweep = a_sweep(tmp_path / "sweep", "0_seed=0", [1, 2], status="failed")
    a_sweep(sweep, "1_seed=1", [1], status="failed")
    out = rlmix("train", *JOBLIB, "seed=0,1", "loop.steps=3", "resume=sweep", cwd=tmp_path, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "seed=0: kept as it ended (failed at step 2" in out.stderr, out.stderr
    assert "  seed=0  failed     steps 2" in out.stdout and "  seed=1  failed     steps 1" in out.stdout, out.stdout
    assert f"error: 2 job(s) of the sweep failed: {sweep / '0_seed=0'}, {sweep / '1_seed=1'}" in out.stderr
    assert not Path(sweep / "0_smoke_s0").exists()
