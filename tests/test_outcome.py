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
