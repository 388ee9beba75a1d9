"""A sweep (`rlmix train -m`) never runs a job on top of an earlier run: its job directories are
checked before Hydra writes anything, a run's `resume=` is not shared by several jobs, and
`resume=<sweep dir>` continues a sweep job by job. These are refused or decided before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli import rlmix_in_process, rlmix_refusing
from tests.test_validation_cli import refused


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def a_sweep(root: Path, job: str, steps: list[int], checkpoint: int | None = None, status: str | None = None) -> Path:
    """A sweep directory whose job ``job`` logged ``steps`` (with a complete checkpoint at step ``checkpoint``)
    and ended with ``status``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("{}\n")
    run = root / job
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))
    if checkpoint is not None:
        (run / "checkpoints" / f"step_{checkpoint}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{checkpoint}" / "complete.json").write_text('{"files": {}}')
    if status is not None:
        (run / "summary.json").write_text(json.dumps({"status": status, "steps": steps[-1] if steps else 0}))
    return root


def test_a_sweep_into_a_directory_whose_job_holds_a_run_is_refused_and_the_run_left_as_it_was(tmp_path):
    # Rerun into its own directory, the same sweep appended to each job's metrics.jsonl and pruned its
    # checkpoints in favour of the earlier run's.
    sweep = a_sweep(tmp_path / "sweep", "1_correction=sc_mis", [1, 2, 3], checkpoint=3, status="completed")
    before = tree(tmp_path)
    out = rlmix_refusing("train", "-m", "+experiment=smoke", "correction=sc,sc_mis", "loop.steps=3",
                         f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    refused(out, f"{sweep / '1_correction=sc_mis'} already holds a run")
    assert f"resume={sweep}" in out.stderr
    assert tree(tmp_path) == before  # not even the sweep's multirun.yaml or a job's .hydra/


def test_a_runs_resume_shared_by_the_jobs_of_a_sweep_is_refused(tmp_path):
    # Every job resumed the one run: the first continued it, the second trained nothing, and both
    # were reported as that run.
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "checkpoints" / "step_2" / "complete.json").write_text('{"files": {}}')
    before = tree(tmp_path)
    out = rlmix_refusing("train", "-m", "+experiment=smoke", "correction=sc_mis,mis", "loop.steps=4",
                         f"resume={run}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    refused(out, f"resume={run}: each of the 2 jobs of this sweep would continue that one run")
    assert tree(tmp_path) == before


def test_continuing_a_sweep_refuses_a_job_that_stopped_before_its_first_checkpoint(tmp_path):
    sweep = a_sweep(tmp_path / "sweep", "1_correction=sc_mis", [1, 2], status="interrupted")
    before = tree(tmp_path)
    out = rlmix_refusing("train", "-m", "+experiment=smoke", "correction=sc,sc_mis", "loop.steps=3",
                         f"resume={sweep}", cwd=tmp_path)
    refused(out, f"{sweep / '1_correction=sc_mis'} holds a run (metrics.jsonl) that stopped before its first")
    assert tree(tmp_path) == before


def test_continuing_a_sweep_keeps_a_job_that_failed_before_its_first_checkpoint_as_it_ended(tmp_path):
    """Nothing is left to train: no Ray, exit 1 (a failed job), the job's rows as they were, and a
    command that trains it again in a directory of its own."""
    sweep = a_sweep(tmp_path / "sweep", "0_smoke_s0", [1, 2], status="failed")
    out = rlmix_in_process("train", "-m", "+experiment=smoke", "logger=disabled", "loop.steps=3",
                           f"resume={sweep}", cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "smoke_s0: kept as it ended (failed at step 2, no checkpoint to continue from); start it again with: " \
           "rlmix train +experiment=smoke logger=disabled loop.steps=3" in out.stderr, out.stderr
    assert [json.loads(line)["step"] for line in (sweep / "0_smoke_s0" / "metrics.jsonl").open()] == [1, 2]
    assert "  smoke_s0  failed     steps 2" in out.stdout, out.stdout


def test_a_sweep_over_experiments_is_one_directory(tmp_path, monkeypatch):
    """``hydra.sweep.dir`` ends in ``${name}``, which each experiment sets: ``+experiment=grpo,sc_mis`` put its
    jobs in ``<time>_grpo`` and ``<time>_sc_mis`` and its record in ``<time>_default``, so ``rlmix report``
    and ``resume=`` saw half a sweep. One directory, named after both, is given to Hydra."""
    from rlmix.commands.compose import plan_jobs, shared_dir_args

    monkeypatch.chdir(tmp_path)
    args = ["-m", "+experiment=grpo,sc_mis", "seed=0,1", "loop.steps=1"]
    jobs = plan_jobs(args)
    [shared] = {job.shared_dir for job in jobs}
    assert shared.name.endswith("_grpo+sc_mis") and shared.parent.parent.name == "multirun", shared
    assert [job.run_dir for job in jobs] == [shared / f"{i}_{job.label}" for i, job in enumerate(jobs)]
    assert shared_dir_args(args, jobs) == [*args, f"hydra.sweep.dir={shared}"]
    # One name, or a directory the command line gives: as Hydra names it.
    for same in (["-m", "+experiment=grpo", "seed=0,1"], [*args, f"hydra.sweep.dir={tmp_path / 's'}"]):
        jobs = plan_jobs(same)
        assert {job.shared_dir for job in jobs} == {None} and shared_dir_args(same, jobs) == same
