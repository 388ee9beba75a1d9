"""The session's own teardown is no signal to report: Ray's raylet sends every actor SIGTERM once the driver
leaves, and an actor logs only a SIGTERM or SIGHUP that someone else sent (docs/reliability.md)."""

from __future__ import annotations

import signal

import pytest

from rlmix.isolation.scratch import ENV as SCRATCH_ENV
from tests.cli import rlmix


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_an_actor_reports_a_signal_unless_its_session_is_ending(tmp_path, monkeypatch, capsys, signum):
    from rlmix.orchestration import session, workers

    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path))
    workers._left_to_the_driver(signum, None)  # from outside: left to the driver, and said so
    assert f"{signum.name} to actor process" in capsys.readouterr().err
    (tmp_path / session.ENDING).touch()  # what Session.close leaves before it shuts Ray down
    workers._left_to_the_driver(signum, None)
    assert capsys.readouterr().err == ""


def test_the_session_marks_its_teardown_before_ray_signals_the_actors(tmp_path, monkeypatch):
    """``ray.shutdown`` is where the raylet sends the actors SIGTERM: by then the marker is there."""
    import ray

    from rlmix.orchestration import session

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(session, "_stop_without_grace", lambda: None)
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append((scratch / session.ENDING).exists()))
    session.Session(scratch=scratch).close()
    assert seen == [True]
    assert not scratch.exists()  # removed with the marker


@pytest.mark.slow
def test_a_completed_run_logs_no_signal_in_workers_log(tmp_path):
    run_dir = tmp_path / "run"
    out = rlmix("train", "+experiment=smoke", "loop.steps=1", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    log = (run_dir / "workers.log").read_text()
    assert "SIGTERM" not in log and "SIGHUP" not in log, log


@pytest.mark.slow
def test_checkpoint_saves_draw_no_progress_bars_in_workers_log(tmp_path):
    """Workers import transformers with the run's worker environment (no progress bars), the fork
    server's copies included: the server imports it for them (rlmix.orchestration.forkserver)."""
    run_dir = tmp_path / "run"
    out = rlmix("train", "+experiment=smoke", "loop.steps=2", "loop.checkpoint_every=1", f"hydra.run.dir={run_dir}",
                cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (run_dir / "checkpoints" / "step_2").is_dir()
    log = (run_dir / "workers.log").read_text()
    assert "Writing model shards" not in log and "it/s]" not in log, log
