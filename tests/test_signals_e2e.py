"""How a signal ends a run, through the real CLI: Ctrl-C, SIGTERM to the driver, its group or every
process, a terminal that closes, `nohup`, a second signal, a signal while the run starts.

Each test starts ``rlmix train`` in its own session, or types it into a shell on a terminal of its
own (tests/faults.py), waits for a condition on disk or on its processes (never a fixed sleep),
sends the signal and checks what the run left behind. docs/reliability.md maps each case to its
test here.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults import SMOKE, Run, TerminalRun, complete, pending, rows, session_pids, summary, title

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],  # Ctrl-C reaches Ray's processes too
    ids=["ctrl_c", "sigterm"],
)
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_exits_128_plus_n(tmp_path, signum, to_group, code):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: len(rows(run_dir)) >= 2, "two steps")
    (os.killpg if to_group else os.kill)(run.proc.pid, signum)
    assert run.finish() == code, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == signum.name
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"]
    assert f"resume={run_dir}" in run.err.read_text()
    assert "Traceback" not in run.text()


def test_a_sigterm_to_the_whole_group_still_lets_a_long_step_finish_and_be_saved(tmp_path):
    """``timeout``, ``kill -- -PGID`` and schedulers signal every process of the group, Ray's own
    processes (its raylet, which would end every actor) included. These hold the signal blocked, so
    a step that takes long (the trainer is held inside one) still finishes and is saved."""
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    held = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    raylet = next(pid for pid in session_pids(run.proc.pid) if title(pid).endswith("/raylet"))
    os.killpg(run.proc.pid, signal.SIGTERM)
    # Either the raylet acted on the signal (it is gone, and the actors with it) or it holds it pending.
    run.wait_for(lambda: not title(raylet) or pending(raylet, signal.SIGTERM), "the raylet to get the SIGTERM")
    assert title(raylet), "the raylet ended on the group's SIGTERM"
    os.kill(held, signal.SIGCONT)
    assert run.finish() == 143, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == "SIGTERM"
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"] >= 3
    assert "died" not in run.text() and "Traceback" not in run.text()


def test_a_sigterm_to_every_process_of_the_run_still_lets_the_step_finish_and_be_saved(tmp_path):
    """systemd's default stop and Slurm's ``scancel`` signal every process of the job one by one,
    the actors too. The actors leave it to the driver: the step in flight (the trainer is held inside
    one) finishes and is saved, and the driver ends them."""
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    held = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    for pid in session_pids(run.proc.pid):
        os.kill(pid, signal.SIGTERM)
    time.sleep(1)  # an actor that would end on it has by now
    os.kill(held, signal.SIGCONT)
    assert run.finish() == 143, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == "SIGTERM"
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"] >= 3
    assert result["fault"] == {"sampler_restarts": 0, "requests_reissued": 0, "trainer_restarts": 0}, result["fault"]
    assert "died" not in run.text() and "Traceback" not in run.text()
    assert "SIGTERM to actor process" in (run_dir / "workers.log").read_text()


def test_a_terminal_that_closes_lets_the_step_finish_and_be_saved(tmp_path):
    """A closed terminal window or ssh connection: the shell gets SIGHUP and sends it on to its
    jobs, here the run's whole process group, Ray's processes included; every write to the terminal
    fails from then on. The run stops as on SIGTERM: the step in flight (the trainer is held inside
    one) finishes and is saved, and the closing line goes to train.log (its exit status, 129, has
    no one left to read it)."""
    run_dir = tmp_path / "run"
    run = TerminalRun(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    held = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    raylet = next(pid for pid in session_pids(run.proc.pid) if title(pid).endswith("/raylet"))
    run.hang_up()
    run.wait_for(lambda: not title(raylet) or pending(raylet, signal.SIGHUP), "the raylet to get the SIGHUP")
    assert title(raylet), "the raylet ended on the terminal's SIGHUP"
    os.kill(held, signal.SIGCONT)
    run.finish()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == "SIGHUP"
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"] >= 3
    log = (run_dir / "train.log").read_text()
    assert f"interrupted at step {result['steps']} (SIGHUP), checkpoint step_{result['steps']}" in log, log
    assert "died" not in run.text() and "Traceback" not in run.text()


def test_a_terminal_that_closes_while_the_run_starts_leaves_its_line_in_train_log(tmp_path):
    run_dir = tmp_path / "run"
    run = TerminalRun(tmp_path, *SMOKE, "loop.steps=5", f"hydra.run.dir={run_dir}")
    # Held inside its __init__, the trainer keeps the run in its start-up.
    run.hold_inside(run_dir, "TrainerWorker.__init__", 0, "the trainer stopped while it starts")
    run.hang_up()
    run.finish()
    log = (run_dir / "train.log").read_text()
    assert "interrupted while the run was starting (SIGHUP: stopped at once), nothing trained" in log, log
    assert "Traceback" not in run.text() and not (run_dir / "summary.json").exists()


def test_a_run_started_with_nohup_outlives_its_terminal(tmp_path):
    run_dir = tmp_path / "run"
    run = TerminalRun(tmp_path, *SMOKE, "loop.steps=12", f"hydra.run.dir={run_dir}", nohup=True)
    run.wait_for(lambda: len(rows(run_dir)) >= 2, "two steps")
    run.hang_up()
    run.finish()
    result = summary(run_dir)
    assert result["status"] in ("completed", "collapsed") and result["steps"] == 12, result["status"]
    assert "SIGHUP" not in run.text()


def test_a_second_ctrl_c_stops_at_once_quietly_and_names_the_newest_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # W&B on (offline), as a user runs it: its service process gets the Ctrl-C too.
    run = Run(tmp_path, "+experiment=smoke", "loop.steps=500", "loop.checkpoint_every=2", f"hydra.run.dir={run_dir}")
    # The step in flight cannot finish while the trainer is held, so the second Ctrl-C lands inside it.
    run.hold_inside(run_dir, "TrainerWorker.train_step", 3, "the trainer stopped inside step 4 or later")
    saved = complete(run_dir)[-1]
    os.killpg(run.proc.pid, signal.SIGINT)
    run.wait_for(lambda: "send it again to stop at once" in run.text(), "the first Ctrl-C's line")
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish() == 130, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["stopped_at_once"] and result["signal"] == "SIGINT"
    assert result["steps"] == rows(run_dir)[-1]["step"] and result["checkpoint"] == str(run_dir / "checkpoints" / f"step_{saved}")
    err = run.err.read_text()
    assert "stopped at once" in err and f"resume={run_dir}" in err, err
    assert "Traceback" not in run.text() and "Connection lost" not in run.text()


@pytest.mark.parametrize(
    ("signum", "to_group", "code"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)], ids=["ctrl_c", "sigterm"],
)
def test_a_signal_while_the_run_starts_stops_it_at_once_with_one_line(tmp_path, signum, to_group, code):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=5", f"hydra.run.dir={run_dir}")
    # Held inside its __init__, the trainer keeps the run in its start-up: waiting for it would never end.
    run.hold_inside(run_dir, "TrainerWorker.__init__", 0, "the trainer stopped while it starts")
    (os.killpg if to_group else os.kill)(run.proc.pid, signum)
    assert run.finish() == code, run.text()
    err = run.err.read_text()
    assert f"interrupted while the run was starting ({signum.name}: stopped at once), nothing trained" in err, err
    assert "start again with: rlmix train" in err and "step in flight" not in err, err
    assert "Traceback" not in run.text() and not (run_dir / "summary.json").exists()
