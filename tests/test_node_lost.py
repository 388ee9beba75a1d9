"""A lost Ray node (the raylet of the run's own local instance killed) ends the run at once as failed and
resumable, told in one line; and a signal once the loop is over says the run is ending anyway.

docs/reliability.md lists both. The end-to-end test kills the raylet of a real ``rlmix train`` by pid.
A kill that lands while the driver is itself reading or writing the object store (a few milliseconds a
step) lets Ray's core end the driver first, as docs/reliability.md says: then no line and no summary,
Ray's own log says so, and the run resumes all the same.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import types
from pathlib import Path

import pytest

from rlmix.orchestration.loop import AsyncLoop, NodeLost, SamplerSlot
from rlmix.orchestration.outcome import StopRequest, finish
from rlmix.orchestration.session import Session
from tests.faults import SMOKE, Run, complete, rows, session_pids, summary, title
from tests.test_outcome import Loop, Steps


def test_a_session_tells_a_lost_node_only_once_its_own_raylet_has_exited():
    assert Session().node_lost() is None  # no instance of its own (none started, or a cluster's)
    raylet = subprocess.Popen(["sleep", "60"])
    session = Session(raylet=raylet)
    try:
        assert session.node_lost() is None and session.node_lost(0.1) is None  # alive: nothing, whatever the grace
    finally:
        raylet.kill()
    assert session.node_lost(5.0) == "the Ray node ended (its raylet exited, SIGKILL)"
    session.raylet = None  # what close() leaves: its own shutdown is no loss
    assert session.node_lost() is None


def test_an_actor_failure_on_a_lost_node_is_the_nodes_not_a_sampler_death(caplog):
    loop = AsyncLoop.__new__(AsyncLoop)  # only what _died reads
    loop.cfg = types.SimpleNamespace(sampler_max_restarts=3)
    slot = SamplerSlot(name="h100_fp8/0", pool="h100_fp8", actor=None)
    loop.samplers = [slot]
    loop.node_lost = lambda grace_s=0.0: "the Ray node ended (its raylet exited, SIGKILL)"
    with pytest.raises(NodeLost, match="the Ray node ended"):
        loop._died(slot, RuntimeError("the actor died"))
    assert slot.deaths == 0 and "died" not in caplog.text  # no restart counted, no "died (1 of 3 restarts)"


def test_a_signal_once_the_loop_is_over_leaves_the_completed_run_as_it_is(caplog):
    stop = StopRequest()
    stop.training()
    steps = Steps(stop, signal_in_save=False, signal_in_finish=False)
    steps.checkpoint = lambda step: stop._handle(signal.SIGTERM, None) or f"/nowhere/checkpoints/step_{step}"
    result = finish(Loop(), steps, stop, {})  # the signal comes during the final save: no step in flight
    assert result["status"] == "completed" and "signal" not in result
    assert "the run is ending anyway" in caplog.text and "finishing the step in flight" not in caplog.text


@pytest.mark.slow
def test_a_killed_raylet_fails_the_run_at_once_in_one_line_and_it_resumes(tmp_path):
    run_dir = tmp_path / "run"
    common = [*SMOKE, "loop.checkpoint_every=2"]
    run = Run(tmp_path, *common, "loop.steps=300", f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: complete(run_dir) and len(rows(run_dir)) >= 3, "a checkpoint and three steps")
    raylets = [pid for pid in session_pids(run.proc.pid) if title(pid).endswith("/raylet")]
    assert len(raylets) == 1, [(pid, title(pid)) for pid in session_pids(run.proc.pid)]
    os.kill(raylets[0], signal.SIGKILL)
    assert run.finish() == 1, run.text()
    text = run.out.read_text() + run.err.read_text()
    assert " died " not in text and "dropped" not in text and "Traceback" not in text, text
    errors = [line for line in run.err.read_text().splitlines() if line.startswith("error:")]
    if (run_dir / "summary.json").exists():
        result = summary(run_dir)
        assert result["status"] == "failed" and result["resumable"], result
        assert result["error"] == "the Ray node ended (its raylet exited, SIGKILL)", result
        step = result["steps"]
        command = f"rlmix train {' '.join([*common, 'loop.steps=300'])} resume={run_dir}"
        assert errors == [f"error: run failed at step {step}: the Ray node ended (its raylet exited, SIGKILL); "
                          f"continue with: {command}"], errors
    else:  # the kill landed inside one of the driver's own reads of the store: Ray's core ended it there
        assert errors == [] and ended_by_ray(run.proc.pid), text
        step = rows(run_dir)[-1]["step"]

    again = Run(tmp_path, *common, f"loop.steps={step + 2}", f"resume={run_dir}")
    assert again.finish() == 0, again.text()
    assert summary(run_dir)["status"] in ("completed", "collapsed")  # the smoke toy may collapse: not a fault
    assert [r["step"] for r in rows(run_dir)] == list(range(1, step + 3))


def ended_by_ray(pid: int) -> bool:
    """Whether Ray's core worker in driver ``pid`` ended it on finding its object store gone."""
    logs = glob.glob(f"/tmp/ray/session_*/logs/python-core-driver-*_{pid}.log")
    return any("The connection to the plasma store is failed" in Path(log).read_text() for log in logs)
