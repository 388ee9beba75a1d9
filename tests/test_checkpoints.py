"""Checkpoint files on disk: staged, sealed, renamed into place; incomplete ones are never chosen."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmix.errors import ConfigError
from rlmix.assembly import checkpoints as ck
from rlmix.assembly.checkpoints import RunState


def save(run_dir: Path, step: int, keep: int = 10) -> Path:
    tmp = ck.staging_dir(run_dir, step)
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(bytes(range(200)) * step)  # stands in for the trainer's files
    (tmp / "deepspeed").mkdir()
    (tmp / "deepspeed" / "rank0.pt").write_bytes(b"x" * 50)
    return ck.seal(tmp, RunState(step=step, next_request=3 * step, wall_time_s=1.5 * step, wandb_id="abc"), keep)


def test_a_sealed_checkpoint_is_complete_and_carries_the_run_state(tmp_path):
    path = save(tmp_path, 4)
    assert path == tmp_path / "checkpoints" / "step_4" and ck.problem(path) == ""
    assert ck.read_run_state(path) == RunState(step=4, next_request=12, wall_time_s=6.0, wandb_id="abc")
    assert not list((tmp_path / "checkpoints").glob(".*"))  # nothing staged is left behind


@pytest.mark.parametrize("damage", ["truncate", "delete", "no_manifest"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
    save(tmp_path, 2)
    newest = save(tmp_path, 4)
    if damage == "truncate":
        (newest / "deepspeed" / "rank0.pt").write_bytes(b"x" * 10)
    elif damage == "delete":
        (newest / "model.safetensors").unlink()
    else:
        (newest / ck.MANIFEST).unlink()
    chosen, skipped = ck.newest_complete(tmp_path)
    assert chosen == tmp_path / "checkpoints" / "step_2"
    assert [p.name for p, _ in skipped] == ["step_4"]


def test_an_unsealed_staging_dir_is_not_a_checkpoint(tmp_path):
    save(tmp_path, 2)
    ck.staging_dir(tmp_path, 6).mkdir()  # a save interrupted before its rename
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_2"


def test_the_next_sealed_save_clears_what_an_unfinished_one_staged(tmp_path):
    # A trainer that died (or a second Ctrl-C) during a save left a full-size model in .step_6.tmp,
    # which only a save of step 6 itself used to remove.
    save(tmp_path, 2)
    staged = ck.staging_dir(tmp_path, 6)
    staged.mkdir()
    (staged / "model.safetensors").write_bytes(b"x" * 100)
    save(tmp_path, 8)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_8"]


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in (2, 4, 6, 8):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_6", "step_8"]


def test_saving_a_step_again_replaces_it(tmp_path):
    save(tmp_path, 2)
    path = save(tmp_path, 2)
    assert ck.problem(path) == "" and ck.latest_checkpoint(tmp_path) == path


def test_resume_needs_a_complete_checkpoint(tmp_path):
    (tmp_path / "checkpoints" / "step_5").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"resume=.*no complete checkpoint.*step_5"):
        ck.check_resume(str(tmp_path))
    save(tmp_path, 3)
    ck.check_resume(str(tmp_path))


def test_only_a_run_that_ended_at_its_checkpoint_resumes_to_nothing(tmp_path):
    """``ended_run``: the summary of a run whose newest complete checkpoint is its last step, when
    no step is left to train; anything else (a failed or interrupted run, a summary of another step,
    more steps asked for) trains, and starts Ray to do it."""
    import json

    from rlmix.orchestration.runner import ended_run

    def summary(status: str, steps: int) -> None:
        (tmp_path / "summary.json").write_text(json.dumps({"status": status, "steps": steps}))

    assert ended_run(tmp_path, 4) is None  # no summary
    save(tmp_path, 4)
    summary("completed", 4)
    assert ended_run(tmp_path, 4) == {"status": "completed", "steps": 4}
    assert ended_run(tmp_path, 3) is not None and ended_run(tmp_path, 6) is None
    summary("collapsed", 4)
    assert ended_run(tmp_path, 4)["status"] == "collapsed"
    for status in ("failed", "interrupted"):
        summary(status, 4)
        assert ended_run(tmp_path, 4) is None
    summary("completed", 6)  # the summary is of a step whose checkpoint is not there
    assert ended_run(tmp_path, 6) is None
    (tmp_path / "summary.json").write_text("{")
    assert ended_run(tmp_path, 4) is None
