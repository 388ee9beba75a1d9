"""What a person reads: the step lines of a run and the block that ends it.

On a terminal the step lines scroll above a progress bar (``rich``); anywhere else (CI, a log
file, a pipe) they are plain lines, one per ``logger.console_every`` steps.
"""

from __future__ import annotations

import atexit
import errno
import math
import os
import re
import shlex
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from rlmix.metrics.jsonl import METRICS_FILE
from rlmix.metrics.quiet import DRIVER_LOG, WORKERS_LOG, worker_warnings
from rlmix.metrics.status import Status


class StepDisplay:
    """Step lines, above a live progress bar when ``stream`` is a terminal."""

    def __init__(self, total: int, every: int = 1, stream: TextIO | None = None, live: bool | None = None):
        # sys.stdout as it is now, not as it was at import (a caller may have redirected it since)
        self.total, self.every, self.stream = total, max(every, 1), stream or sys.stdout
        live = self.stream.isatty() if live is None else live
        self._bar = self._task = None
        if live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

            console = Console(file=self.stream)
            self._bar = Progress(
                "train", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), "eta", TimeRemainingColumn(),
                console=console, transient=True,
            )
            self._task = self._bar.add_task("train", total=total)
            self._bar.start()
            atexit.register(self.close)  # a run that dies mid-way still gives the terminal its cursor back

    def update(self, step: int, line: str) -> None:
        if step % self.every == 0 or step == self.total:
            if self._bar is not None:
                self._bar.console.print(line, markup=False, highlight=False)
            else:
                self.stream.write(line + "\n")
                self.stream.flush()
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def leave_hung_up_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal that hung up (its window or
    ssh connection closed: every write to it fails with EIO). The run goes on to save its step,
    and what it would still print is in ``train.log``; output to a live terminal, a file or a pipe
    is left as it is."""
    for fd in (1, 2):
        try:
            os.write(fd, b"")
        except OSError as err:
            if err.errno == errno.EIO:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, fd)
                os.close(devnull)


class _OutlivesReader:
    """A console stream whose reader may go before the command ends (``rlmix train | head``): once a
    write finds the pipe closed (EPIPE), its descriptor points at /dev/null, as a hung-up terminal's
    does, and the command goes on; what it would still print is in its log files."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._let_go()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._let_go()

    def _let_go(self) -> None:
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError):  # a stream without a descriptor (a test's capture)
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        try:
            self._stream.flush()  # what the pipe refused goes to /dev/null now
        except OSError:
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def console_outlives_reader():
    """stdout and stderr as ``_OutlivesReader``s while the block runs (the streams a run's logging
    and step lines pick up when it starts)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _OutlivesReader(sys.stdout), _OutlivesReader(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


class CountedLines:
    """The ``progress`` callback of ``rlmix eval`` and ``rlmix probe``.

    Their per-item lines read ``[i/n] ...``. On a terminal those drive a progress bar (the item
    shown beside it) and every other line prints above it; elsewhere every line prints as is.
    Use as a context manager so the bar always goes away.
    """

    _COUNTED = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")

    def __init__(self, label: str, stream: TextIO | None = None, live: bool | None = None):
        self.label, self.stream = label, stream or sys.stdout  # sys.stdout now, as StepDisplay's
        self.live = self.stream.isatty() if live is None else live
        self._bar = self._task = None

    def __enter__(self) -> CountedLines:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(self.label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.description}"), console=Console(file=self.stream), transient=True)
            self._task = self._bar.add_task("", total=None)
            self._bar.start()
        return self

    def __call__(self, line: str) -> None:
        counted = self._COUNTED.match(line)
        if self._bar is not None and counted:
            done, total, item = counted.groups()
            self._bar.update(self._task, completed=int(done), total=int(total), description=item)
        elif self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def shown(path: str | Path) -> str:
    """A path as a user would type it from here: relative under the working directory."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _number(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def collapse_text(collapse: dict | None, short: bool = False) -> str:
    """The verdict in words: ``at step N: reason``, ``none``, or ``not judged`` for a run that ended
    before the monitor armed (``judged`` false in ``summary.json``; a summary without the field, from
    before it, was judged). ``short``: ``not judged`` alone (the sweep block's column)."""
    if collapse and collapse.get("verdict"):
        return f"at step {collapse.get('step')}: {collapse.get('reason') or 'collapse'}"
    if collapse and collapse.get("judged", True) is False:
        if short:
            return "not judged"
        updates, start = collapse.get("updates"), collapse.get("judged_from")
        seen = f"{updates} step" + ("s" if updates != 1 else "") if isinstance(updates, int) else "too few steps"
        where = f"from step {start}" if isinstance(start, int) else "once armed"
        return (f"not judged ({seen}; the monitor judges {where}: after monitor.warmup_steps + "
                "monitor.baseline_steps)")
    return "none"


def episodes_text(collapse: dict | None) -> str:
    """The monitor's episodes: when, how long, how deep; '' when there were none."""
    parts = []
    for e in (collapse or {}).get("episodes") or []:
        state = "recovered" if e.get("recovered") else "open at the end"
        parts.append(f"steps {e.get('start')}-{e.get('end')} ({e.get('steps')} steps, reward EMA fell "
                     f"{_number(e.get('reward_fall'), '.3f')}, {state}): {e.get('reason')}")
    return "; ".join(parts)


def warnings_text(collapse: dict | None) -> str:
    """Rules that fired alone where they do not flag a run; '' when there were none."""
    return "; ".join(f"at step {w.get('step')}: {w.get('reason')}" for w in (collapse or {}).get("warnings") or [])


_LOOP_STEPS = ("loop.steps=", "+loop.steps=", "++loop.steps=")


def next_commands(run_dir: Path, overrides: list[str], eval_args: tuple[str, ...] = (),
                  checkpoint: bool = True, rows: bool = True, config_args: Sequence[str] = (),
                  ended_at: int | None = None) -> list[str]:
    """The commands that can work on ``run_dir`` now: evaluate and resume it when it has a
    ``checkpoint``, report it when it logged ``rows``, else start it again. Resuming or starting
    again repeats the run's own overrides, after ``config_args`` (``--config-dir``, ``--config-name``
    and ``hydra.searchpath``: where its configs came from).

    ``ended_at``: the run ran every step it was asked for (completed, or collapsed), ``ended_at`` of
    them. Resumed as it was, it would train nothing, so its resume command asks for as many steps
    again (``loop.steps=2*ended_at``, in place of the run's own), under a comment line that says so
    (a line of its own: a trailing comment is arguments to an interactive zsh); ``0``: no resume line.

    ``rlmix eval`` takes the run's task from ``run_dir`` (its search path too); ``eval_args`` pick
    what differs (the split of a task without held-out rows)."""
    keep = [o for o in overrides if not o.startswith(("resume=", "hydra.", "+hydra."))]
    where = shlex.quote(shown(run_dir))
    commands = [" ".join(["rlmix eval", f"checkpoint={where}", *eval_args])] if checkpoint else []
    commands += [f"rlmix report {where}"] if rows else []
    if not checkpoint:
        return commands + [" ".join(["rlmix train", *map(shlex.quote, [*config_args, *keep])])]
    if ended_at is None:
        return commands + [" ".join(["rlmix train", *map(shlex.quote, [*config_args, *keep]), f"resume={where}"])]
    if ended_at < 1:
        return commands
    more = [o for o in keep if not o.startswith(_LOOP_STEPS)] + [f"loop.steps={2 * ended_at}"]
    train = " ".join(["rlmix train", *map(shlex.quote, [*config_args, *more]), f"resume={where}"])
    steps = f"{ended_at} step" + ("s" if ended_at != 1 else "")
    return commands + [f"# the run ran all {steps} it was asked for; to train {steps} more:", train]


def run_block(
    summary: dict, run_dir: Path, checkpoint: Path | None, total_steps: int, overrides: list[str], log_dir: Path,
    eval_args: tuple[str, ...] = (), config_args: Sequence[str] = (),
) -> str:
    """The lines that end ``rlmix train``: outcome, where everything went, and what to run next.

    ``total_steps`` is this command's ``loop.steps``. A completed or collapsed run that reached it ran
    every step it was asked for, so its own steps are its total: a run that had ended, resumed with a lower
    ``loop.steps``, trains nothing and is shown as it ended (3/3, not 3/2). Its resume command asks
    for more steps (``next_commands``'s ``ended_at``); an interrupted or failed run's continues it."""
    final = summary.get("final") or {}
    status, steps = str(summary.get("status", "completed")), summary.get("steps", 0)
    # (A collapsed run the monitor stopped early, action=stop, is short of its steps: not ended.)
    ended = status in (Status.completed.value, Status.collapsed.value) and int(steps or 0) >= total_steps
    total = steps if ended else total_steps
    rows = [
        ("status", status),
        ("steps", f"{steps}/{total} in {_number(summary.get('wall_time_s'), ',.0f')} s"),
        ("last step", f"reward {_number(final.get('reward/mean'), '.3f')}  kl_k3 {_number(final.get('mismatch/kl_k3'), '.2e')}"
                  f"  format errors {_number(final.get('format/error_rate'), '.3f')}"),
        ("collapse", collapse_text(summary.get("collapse"))),
        *[(key, text) for key, text in (("reward errors", reward_errors_text(run_dir)),
                                        ("episodes", episodes_text(summary.get("collapse"))),
                                        ("warnings", warnings_text(summary.get("collapse")))) if text],
        ("run dir", shown(run_dir)),
        ("checkpoint", shown(checkpoint) if checkpoint else "none"),
        ("logs", logs_text(log_dir, run_dir)),
    ]
    wandb_dirs = sorted((run_dir / "wandb").glob("offline-run-*"))
    if wandb_dirs:
        rows.append(("W&B", f"offline; upload with: wandb sync {shlex.quote(shown(wandb_dirs[-1]))}"))
    width = max(len(key) for key, _ in rows)
    lines = [f"── run {summary.get('name', '')} ".ljust(60, "─")]
    lines += [f"  {key:<{width}}  {value}" for key, value in rows]
    logged = (run_dir / METRICS_FILE).is_file() and (run_dir / METRICS_FILE).stat().st_size > 0
    commands = next_commands(run_dir, overrides, eval_args, checkpoint=checkpoint is not None, rows=logged,
                             config_args=config_args, ended_at=int(steps or 0) if ended else None)
    lines += ["next:"] + [f"  {command}" for command in commands]
    return "\n".join(lines)


def reward_errors_text(run_dir: Path) -> str:
    """The samples the reward function failed on over the run ("" for none): each scored 0 and left its
    group, so a run whose reward always fails trains on nothing and would otherwise read as completed."""
    from rlmix.errors import ConfigError
    from rlmix.metrics.jsonl import read_metrics
    from rlmix.metrics.names import REWARD_ERRORS

    try:
        failed = [row.get(REWARD_ERRORS, 0.0) for row in read_metrics(run_dir / METRICS_FILE)]
    except (OSError, ConfigError):
        return ""
    if not sum(failed):
        return ""
    steps = sum(1 for f in failed if f)
    return (f"{sum(failed):,.0f} samples in {steps} of {len(failed)} steps scored 0: the reward raised or gave no "
            "number (workers.log: 'reward failed on')")


def logs_text(log_dir: Path, run_dir: Path) -> str:
    """The run's log files (named alone when they sit in the run directory) and the warning count."""
    name = (lambda f: f) if log_dir.resolve() == run_dir.resolve() else (lambda f: shown(log_dir / f))
    text = name(DRIVER_LOG)
    if (log_dir / WORKERS_LOG).is_file():
        count, kinds = worker_warnings(log_dir)
        text += f", {name(WORKERS_LOG)}"
        if count:
            text += f" ({count} warnings of {kinds} kinds from the samplers and trainer)"
    return text


def sweep_block(jobs: list[tuple[str, dict, Path]], sweep_dir: Path, not_run: Sequence[tuple[str, Path]] = (),
                next_lines: Sequence[str] | None = None) -> str:
    """One line per job of a sweep, and per job a signal kept from starting (``not_run``: label, the
    directory it would have had), then what comes next (default: the command that compares them)."""
    width = max((len(label) for label in [*(job[0] for job in jobs), *(label for label, _ in not_run)]), default=0)
    lines = [f"── sweep {shown(sweep_dir)} ".ljust(60, "─")]
    for label, summary, run_dir in jobs:
        final, collapse = summary.get("final") or {}, collapse_text(summary.get("collapse"), short=True)
        lines.append(
            f"  {label:<{width}}  {summary.get('status', 'completed'):<9}  steps {summary.get('steps', 0)}"
            f"  reward {_number(final.get('reward/mean'), '.3f')}"
            f"  kl_k3 {_number(final.get('mismatch/kl_k3'), '.2e')}"
            f"  fmt_err {_number(final.get('format/error_rate'), '.3f')}  collapse {collapse}"
            f"  {shown(run_dir)}"
        )
    lines += [f"  {label:<{width}}  {'not run':<9}  {shown(run_dir)}" for label, run_dir in not_run]
    lines += ["next:", *(next_lines if next_lines is not None else [f"  rlmix report {shlex.quote(shown(sweep_dir))}"])]
    return "\n".join(lines)
