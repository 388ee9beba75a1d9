"""How a run ends, told truthfully: a status in summary.json (rlmix.commands.train turns it into
one line on stderr and an exit code).

| status        | when                                                         | exit       |
|---------------|--------------------------------------------------------------|------------|
| `completed`   | every step ran; no collapse that lasted (recovered episodes and warnings are listed) | 0 |
| `collapsed`   | the monitor flagged the run and it was still down at the end (the run is data) | 0 |
| `interrupted` | SIGINT / SIGTERM / SIGHUP: the step in flight finished, then a checkpoint (a second signal: at once, no checkpoint) | 130 / 143 / 129 |
| `failed`      | a trainer dead more than `trainer.max_restarts` times, no sampler left, the watchdog, non-finite steps, a lost node | 1 |

A signal while Ray and the actors start writes no summary: ``StoppedWhileStarting`` ends the
command at once (rlmix.commands.train says so in one line), since nothing has trained.

docs/reliability.md lists each fault and what the run does about it.
"""

from __future__ import annotations

import logging
import signal
from contextlib import contextmanager

from rlmix.errors import RunFailed
from rlmix.metrics.console import leave_hung_up_terminal
from rlmix.metrics.status import Status

log = logging.getLogger(__name__)


class StoppedWhileStarting(KeyboardInterrupt):
    """A signal before the loop began: nothing trained, so there is no step to finish or to save."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_handlers(handler, signals, ignored_stay=(signal.SIGHUP,)):
    """``handler`` for each of ``signals`` while the block runs, then the handlers from before.

    A SIGHUP is a terminal that closed: the console is let go of first (``leave_hung_up_terminal``),
    so the stop is not undone by a failing print. A signal of ``ignored_stay`` that the command was
    started ignoring stays ignored (`nohup` asks a command to outlive its terminal).
    """

    def handle(signum: int, frame) -> None:
        if signum == signal.SIGHUP:
            leave_hung_up_terminal()
        handler(signum, frame)

    wanted = [s for s in signals if not (s in ignored_stay and signal.getsignal(s) == signal.SIG_IGN)]
    previous = {s: signal.signal(s, handle) for s in wanted}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


class StopRequest:
    """While the run starts, a SIGINT/SIGTERM/SIGHUP stops it at once (``StoppedWhileStarting``). Once
    the loop runs (``training()``), the first asks it to stop after the step in flight; a second
    stops at once (``stop_handlers``: what a SIGHUP does first, and `nohup`)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.started = False
        self.ending = False  # the loop is over: no step is in flight, the run ends anyway

    def __call__(self) -> bool:
        return self.signum is not None

    def training(self) -> None:
        self.started = True

    def loop_over(self) -> bool:
        """The loop has ended: a first signal from here on changes nothing (the run ends as it is
        ending, with no ``signal`` in its summary). Returns whether a signal came before."""
        self.ending = True
        return self.signum is not None

    def _handle(self, signum: int, frame) -> None:
        if self.started and self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum  # (once the loop is over, only so that a second one stops at once)
        if not self.started:
            raise StoppedWhileStarting(signum)
        if self.ending:
            log.warning("%s: the run is ending anyway, no step is in flight (send it again to stop at once)",
                        signal.Signals(signum).name)
            return
        log.warning("%s: finishing the step in flight, then a checkpoint (send it again to stop at once)",
                    signal.Signals(signum).name)

    @contextmanager
    def installed(self):
        # Installed after ray.init, so these handlers replace the ones Ray's core worker sets
        # (its SIGTERM handler dumps a C++ stack and exits 1).
        with stop_handlers(self._handle, self.SIGNALS):
            yield self


def finish(loop, steps, stop: StopRequest, facts: dict) -> dict:
    """Run the loop to its end, then write the checkpoint and summary the outcome calls for.

    A second signal (``KeyboardInterrupt``) stops at once, in the loop or in the final save: the
    summary is written without a new checkpoint, and names the newest one there is. Once the
    outcome is decided and written, a second signal only cuts the sinks' wrap-up (W&B) short.
    """
    decided: list[dict] = []
    try:
        return _finish(loop, steps, stop, facts, decided)
    except KeyboardInterrupt:
        if decided:
            return steps.logger.finish(decided[0], at_once=True)
        return _stopped_at_once(loop, steps, stop, facts)


def _finish(loop, steps, stop: StopRequest, facts: dict, decided: list[dict]) -> dict:
    from rlmix.assembly.checkpoints import latest_checkpoint
    from rlmix.metrics.verdict import CollapseRule

    try:
        loop.run(steps.cfg.loop.steps, steps, stop)
        verdict = steps.monitor.verdict
        failure = f"{verdict.reason}, so the weights no longer change" if verdict.rule is CollapseRule.nonfinite else ""
    except RunFailed as err:
        failure = str(err)
    stopped = stop.loop_over()  # a signal from here on found no step in flight: the run ends as it would
    verdict = steps.monitor.finish()  # the lasting rule over the steps that ran
    status = _status(failure, stopped, verdict.collapse)
    checkpoint = None
    if status is not Status.failed:
        try:
            checkpoint = steps.checkpoint(loop.version)
        except RunFailed as err:  # the final save: no step is left to train again after a restart
            failure, status = str(err), Status.failed
    if status is Status.failed:  # no final save: the newest one written is what resume= takes
        checkpoint = latest_checkpoint(steps.run_dir)
    summary = _summary(status, facts, loop, steps, verdict, checkpoint)
    if failure:
        summary["error"] = failure
        summary["resumable"] = checkpoint is not None
    if stopped:
        summary["signal"] = signal.Signals(stop.signum).name
    decided.append(summary)
    return steps.logger.finish(summary)  # with the accumulated wall time


def _summary(status: Status, facts: dict, loop, steps, verdict, checkpoint) -> dict:
    return {"status": status.value} | facts | {
        "steps": loop.version,
        "final": steps.last,
        "collapse": verdict.as_summary(),
        "checkpoint": str(checkpoint) if checkpoint else None,
        "fault": fault_counts(loop),
    }


def fault_counts(loop) -> dict[str, int]:
    """The loop's fault counters, cumulative over every part of the run (a checkpoint's run state
    carries them to a resumed part, as it does the wall time)."""
    return {"sampler_restarts": loop.sampler_restarts, "requests_reissued": loop.requests_reissued,
            "trainer_restarts": loop.trainer_restarts}


def _stopped_at_once(loop, steps, stop: StopRequest, facts: dict) -> dict:
    from rlmix.assembly.checkpoints import latest_checkpoint

    summary = _summary(Status.interrupted, facts, loop, steps, steps.monitor.finish(), latest_checkpoint(steps.run_dir))
    summary |= {"signal": signal.Signals(stop.signum or signal.SIGINT).name, "stopped_at_once": True}
    return steps.logger.finish(summary, at_once=True)


def _status(failure: str, stopped: bool, collapse: bool) -> Status:
    if failure:
        return Status.failed
    if stopped:
        return Status.interrupted
    return Status.collapsed if collapse else Status.completed
