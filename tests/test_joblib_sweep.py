"""A sweep whose jobs run in joblib's worker processes (``hydra/launcher=joblib``) ends as one the basic
launcher runs: its job directories named by the swept overrides, one line per job and ``rlmix report``, and
exit status 1 when a job failed, although the jobs' own processes did the work."""

from __future__ import annotations

import json
import types
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


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SweepStopped"])
def test_a_signal_to_a_joblib_sweep_says_what_each_job_left_and_how_to_continue(tmp_path, monkeypatch, capsys, raised):
    """joblib's parent takes the Ctrl-C (or a worker's job that saved its step ends the sweep, ``SweepStopped``
    pickled back), and it kills its workers at once: the line is not "nothing trained" (nor a traceback) but,
    job by job, what is on disk (a checkpoint, none, not started), and the continuation that works: a job
    that logged steps but has no checkpoint must first be moved out (resume= refuses it)."""
    import pickle

    from hydra._internal.callbacks import Callbacks
    from omegaconf import OmegaConf

    from rlmix.commands import train
    from rlmix.commands.compose import Job

    sweep = a_sweep(tmp_path / "sweep", "0_seed=0", list(range(1, 14)), checkpoint=10)
    (sweep / "0_seed=0" / "checkpoints" / "step_10" / "run_state.json").write_text(
        json.dumps({"step": 10, "next_request": 80, "wall_time_s": 3.0}))
    a_sweep(sweep, "1_seed=1", list(range(1, 10)))
    (sweep / "1_seed=1" / "checkpoints" / ".step_9.tmp").mkdir(parents=True)  # the save the kill cut short
    plan = types.SimpleNamespace(cfg=types.SimpleNamespace(resume=None))
    jobs = [Job((), plan, f"seed={i}", sweep / f"{i}_seed={i}") for i in range(3)]
    raised = KeyboardInterrupt() if raised == "KeyboardInterrupt" else \
        pickle.loads(pickle.dumps(train.SweepStopped(130, "SIGINT")))  # as loky returns it from the worker

    def joblib_parent():  # Hydra resolves the sweep dir for the launcher; the Ctrl-C arrives while workers train
        Callbacks().on_multirun_start(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
        raise raised

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "plan_jobs", lambda args: jobs)
    monkeypatch.setattr(train, "repeated_source", lambda args: [])
    monkeypatch.setattr(train, "_hydra_train", joblib_parent)
    args = ["-m", "hydra/launcher=joblib", "+experiment=smoke", "seed=0,1,2", f"hydra.sweep.dir={sweep}"]
    with pytest.raises(SystemExit) as stopped:
        train.run_train(args)
    assert stopped.value.code == 130
    out = capsys.readouterr()
    (line,) = out.err.splitlines()
    assert "nothing trained" not in line
    assert line.startswith("interrupted (SIGINT) while joblib's workers ran the sweep's jobs, which joblib ends at "
                           "once (a step in flight is lost): seed=0 checkpoint step_10; seed=1 no checkpoint; seed=2 "
                           "not started; first move sweep/1_seed=1 out of the sweep directory")
    assert line.endswith("continue with: rlmix train -m hydra/launcher=joblib +experiment=smoke seed=0,1,2 "
                         "resume=sweep")
    block = out.out[out.out.index("── sweep "):].splitlines()
    assert block[1].startswith("  seed=0  interrupted  steps 10") and block[2].startswith("  seed=1  interrupted")
    assert block[3].startswith("  seed=2  not run")
    assert "  (first move sweep/1_seed=1 out of the sweep directory: it stopped before its first checkpoint)" in block
