"""How a run's end is told (rlmix/orchestration/outcome.py), driven with stand-ins for the loop, the
step handler and the logger: which status a run gets when signals arrive at its last moments."""

from __future__ import annotations

import signal
import types

from rlmix.metrics.verdict import MonitorVerdict
from rlmix.orchestration.outcome import StopRequest, finish


class Loop:
    version, sampler_restarts, requests_reissued, trainer_restarts = 0, 0, 0, 0

    def run(self, steps, on_step, stop):
        self.version = steps  # every step trained


class Monitor:
    verdict = MonitorVerdict(False, None, "", None)

    def finish(self):
        return self.verdict


class Steps:
    """The step handler: its final save and the logger that writes summary.json."""

    def __init__(self, stop: StopRequest, signal_in_save: bool, signal_in_finish: bool):
        self.cfg = types.SimpleNamespace(loop=types.SimpleNamespace(steps=10))
        self.monitor, self.last, self.run_dir, self.written = Monitor(), {}, "/nowhere", []
        self.stop, self.signal_in_save = stop, signal_in_save
        self.logger = types.SimpleNamespace(finish=self._logger_finish)
        self.signal_in_finish = signal_in_finish

    def checkpoint(self, step):
        if self.signal_in_save:
            self.stop._handle(signal.SIGINT, None)
        return f"/nowhere/checkpoints/step_{step}"

    def _logger_finish(self, summary, at_once=False):
        self.written.append(dict(summary))  # summary.json, written first
        if self.signal_in_finish and len(self.written) == 1:
            self.stop._handle(signal.SIGINT, None)  # while W&B wraps up
        return summary


def test_a_second_signal_while_the_sinks_wrap_up_keeps_the_outcome_already_written():
    stop = StopRequest()
    stop.training()
    steps = Steps(stop, signal_in_save=True, signal_in_finish=True)
    summary = finish(Loop(), steps, stop, {})
    assert [s["status"] for s in steps.written] == ["completed", "completed"]
    assert summary["status"] == "completed" and "stopped_at_once" not in summary


def test_a_second_signal_during_the_final_save_stops_at_once(monkeypatch):
    stop = StopRequest()
    stop.training()
    stop._handle(signal.SIGINT, None)  # the first, during the last step

    def save(step):
        stop._handle(signal.SIGINT, None)  # the second: raises KeyboardInterrupt

    steps = Steps(stop, signal_in_save=False, signal_in_finish=False)
    steps.checkpoint = save
    monkeypatch.setattr("rlmix.assembly.checkpoints.latest_checkpoint", lambda run_dir: None)
    summary = finish(Loop(), steps, stop, {})
    assert summary["status"] == "interrupted" and summary["stopped_at_once"] is True


def test_a_trainer_restart_reports_the_step_it_went_back_to(tmp_path):
    """A run that ends (fails, is stopped) after its trainer went back to a checkpoint, before any
    step is trained again, reports that step's metrics as its last, not the step thrown away."""
    import io

    from rlmix.config.schema import RunConfig, WandbConfig, WandbMode
    from rlmix.metrics.logger import RunLogger
    from rlmix.metrics.monitor import CollapseMonitor
    from rlmix.orchestration.runner import StepHandler

    cfg = RunConfig()
    logger = RunLogger(tmp_path, WandbConfig(mode=WandbMode.disabled), "run", {}, None, 3, stream=io.StringIO())
    steps = StepHandler(cfg, None, CollapseMonitor(cfg.monitor), logger, tmp_path, saved_step=0, last={})
    for step in (1, 2, 3):
        steps.last = {"reward/mean": step / 10}
        logger.log(step, steps.last)
    steps.go_back("new trainer", 2)
    assert steps.last == {"reward/mean": 0.2} and steps.trainer == "new trainer"
    steps.go_back("newer trainer", 0)
    assert steps.last == {}


def test_a_resumed_run_continues_its_fault_counters_from_the_checkpoints_run_state(tmp_path, monkeypatch):
    """A checkpoint records the loop's fault counters (run_state.json); the loop of a run resumed from
    it starts from them, so summary.json's ``fault`` and the ``fault/*`` rows keep counting, as the
    wall time does, instead of starting at 0 again."""
    import io
    from pathlib import Path

    import ray

    from rlmix.assembly import checkpoints
    from rlmix.config.schema import LoopConfig, RunConfig, WandbConfig, WandbMode
    from rlmix.metrics.logger import RunLogger
    from rlmix.metrics.monitor import CollapseMonitor
    from rlmix.orchestration.loop import AsyncLoop
    from rlmix.orchestration.runner import StepHandler

    class Trainer:
        def remote(self, path):  # save_checkpoint.remote: the trainer's files
            Path(path).mkdir()
            (Path(path) / "model.safetensors").write_bytes(b"w")

    def new_loop(state=None):
        return AsyncLoop(LoopConfig(), trainer=None, samplers=[], task=None, seed=0, pad_id=0, start_faults=state)

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    cfg = RunConfig()
    logger = RunLogger(tmp_path, WandbConfig(mode=WandbMode.disabled), "run", {}, None, 10, stream=io.StringIO())
    steps = StepHandler(cfg, types.SimpleNamespace(save_checkpoint=Trainer()), CollapseMonitor(cfg.monitor), logger,
                        tmp_path, saved_step=0, last={})
    steps.loop = first = new_loop()
    first.sampler_restarts, first.requests_reissued, first.trainer_restarts = 2, 3, 1
    state = checkpoints.read_run_state(steps.checkpoint(5))
    assert (state.sampler_restarts, state.requests_reissued, state.trainer_restarts) == (2, 3, 1)

    resumed = new_loop(state)
    resumed.run = lambda total, on_step, stop: None
    stop = StopRequest()
    stop.training()
    finished = Steps(stop, signal_in_save=False, signal_in_finish=False)
    summary = finish(resumed, finished, stop, {})
    assert summary["fault"] == {"sampler_restarts": 2, "requests_reissued": 3, "trainer_restarts": 1}
    assert new_loop().trainer_restarts == 0  # a run that starts afresh


def test_a_checkpoint_from_before_the_fault_counters_reads_them_as_0(tmp_path):
    import json

    from rlmix.assembly import checkpoints
    from rlmix.config.schema import LoopConfig
    from rlmix.orchestration.loop import AsyncLoop

    (tmp_path / checkpoints.RUN_STATE).write_text(json.dumps({"step": 4, "next_request": 9, "wall_time_s": 2.0}))
    state = checkpoints.read_run_state(tmp_path)
    assert (state.sampler_restarts, state.requests_reissued, state.trainer_restarts) == (0, 0, 0)
    loop = AsyncLoop(LoopConfig(), trainer=None, samplers=[], task=None, seed=0, pad_id=0, start_faults=state)
    assert (loop.sampler_restarts, loop.requests_reissued, loop.trainer_restarts) == (0, 0, 0)


class Unwritable:
    """metrics.jsonl on a full disk (or made read-only): every write and the close raise."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def close(self):
        raise OSError(28, "No space left on device")


def _failing_rows_run(tmp_path):
    """A StepHandler whose logger cannot write metrics.jsonl, and a loop whose first step hits it."""
    import io

    from rlmix.config.schema import RunConfig, WandbConfig, WandbMode
    from rlmix.metrics.logger import RunLogger
    from rlmix.metrics.monitor import CollapseMonitor
    from rlmix.orchestration.loop import StepReport
    from rlmix.orchestration.runner import StepHandler

    class OneStep(Loop):
        def run(self, steps, on_step, stop):
            self.version = 1
            on_step(StepReport(step=1, metrics={"reward/mean": 0.1}, version=1))
            self.version = steps  # not reached: the row's write failed

    cfg = RunConfig()
    logger = RunLogger(tmp_path, WandbConfig(mode=WandbMode.disabled), "run", {}, None, 10, stream=io.StringIO())
    logger._jsonl = Unwritable()
    steps = StepHandler(cfg, None, CollapseMonitor(cfg.monitor), logger, tmp_path, saved_step=0, last={})
    stop = StopRequest()
    stop.training()
    return OneStep(), steps, stop


def test_a_metrics_row_that_cannot_be_written_fails_the_run_with_its_summary_and_the_resume_line(tmp_path, capsys):
    """As a checkpoint save on a full disk: status failed, summary.json naming the newest checkpoint, and
    one line with the command that continues the run; no traceback."""
    import json

    from rlmix.assembly import checkpoints
    from rlmix.assembly.checkpoints import RunState
    from rlmix.commands.train import say

    staged = checkpoints.staging_dir(tmp_path, 0)
    staged.mkdir()
    (staged / "model.safetensors").write_bytes(b"w")
    checkpoints.seal(staged, RunState(0, 0, 0.0), keep=2)
    loop, steps, stop = _failing_rows_run(tmp_path)
    summary = finish(loop, steps, stop, {"run_dir": str(tmp_path)})
    assert summary["status"] == "failed" and summary["steps"] == 1 and summary["resumable"] is True
    assert summary["error"] == "writing step 1 to metrics.jsonl failed: [Errno 28] No space left on device"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"
    say(summary, ["+experiment=smoke"])
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: run failed at step 1: writing step 1 to metrics.jsonl failed: ")
    assert f"; continue with: rlmix train +experiment=smoke resume={tmp_path}" in line


def test_a_summary_that_cannot_be_written_either_is_one_line(tmp_path, monkeypatch, caplog):
    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rlmix.metrics.logger.write_atomically", full)
    loop, steps, stop = _failing_rows_run(tmp_path)
    summary = finish(loop, steps, stop, {"run_dir": str(tmp_path)})
    assert summary["status"] == "failed" and summary["resumable"] is False
    assert not (tmp_path / "summary.json").exists()
    (record,) = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert record.getMessage() == ("summary.json was not written ([Errno 28] No space left on device): the lines "
                                   "below are the only record of how the run ended")
