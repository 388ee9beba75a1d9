"""One row per run: the numbers a sweep is judged by, and their markdown / CSV / JSON / console forms.

Definitions (over the rows of ``metrics.jsonl`` that carry the metric, in step order):

- final reward = mean of ``reward/mean`` over the last ``final_steps`` rows (one step is too noisy);
- peak reward = max over the trailing means of ``final_steps`` consecutive rows (so final ≤ peak);
- KL growth = mean ``mismatch/kl_k3`` over the last ``final_steps`` rows / its mean over the early
  window: rows ``[skip_steps, skip_steps + early_steps)`` (the defaults mirror the collapse monitor's
  ``warmup_steps`` and ``baseline_steps``); n/a when the last ``final_steps`` rows reach into the early
  window (fewer than ``skip_steps + early_steps + final_steps`` rows: 20 by default) or its mean is 0;
- final format-error rate = mean of ``format/error_rate`` over the last ``final_steps`` rows; peak
  format-error rate = max over its trailing means, as for the reward (a run that went to 90% format
  errors and recovered shows it here, not in the final rate or the lasting verdict);
- collapse verdict, step and reason = the lasting rule (``RunRecord.collapse``): flagged by
  ``summary.json``'s ``collapse`` (or, without a summary, a row with ``monitor/collapse`` or
  ``monitor/episode`` = 1) and still down over the last 10 steps;
- wall time = ``summary.json``'s ``wall_time_s``, else the last row's ``time``;
- status = how the run ended (``RunRecord.status``); steps = rows of ``metrics.jsonl`` / ``loop.steps``.
  The values of a run that did not finish are as of its last row, not its result: the status says so.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rlmix.metrics.names import FORMAT_KEY, KL_KEY, REWARD_KEY
from rlmix.report.runs import RunRecord
from rlmix.report.sweep import NOT_RUN, SweepJob


@dataclass(frozen=True)
class ReportWindows:
    final_steps: int = 5
    skip_steps: int = 5
    early_steps: int = 10


@dataclass(frozen=True)
class RunRow:
    arm: str
    seed: int | None
    status: str  # RunRecord.status, or a sweep job's SweepJob.state
    finished: bool  # RunRecord.finished: whether its numbers compare with other finished runs'
    steps: int  # rows in metrics.jsonl
    planned_steps: int | None  # loop.steps (None: unknown)
    final_reward: float | None
    peak_reward: float | None
    kl_growth: float | None
    final_format_error: float | None
    peak_format_error: float | None
    collapse: bool | None  # None: no steps to judge
    collapse_step: int | None
    collapse_reason: str
    wall_time_s: float | None
    run: str  # the run's path relative to the collected directory
    judged: bool = True  # False: the run ended before its monitor armed (RunRecord.judged): ``collapse`` is no verdict

    @property
    def verdict(self) -> str:
        """The collapse column: ``yes``, ``no``, ``not judged`` (too few steps for the monitor), ``no steps``."""
        if self.collapse is None:
            return "no steps"
        return "yes" if self.collapse else "no" if self.judged else "not judged"

    @property
    def steps_done(self) -> str:
        """``done/planned``: a run cut short shows it beside the runs it is compared with."""
        if self.status == NOT_RUN:
            return "-"
        return f"{self.steps}/{'?' if self.planned_steps is None else self.planned_steps}"


def summarize(runs: Sequence[RunRecord], windows: ReportWindows = ReportWindows()) -> list[RunRow]:
    """Rows sorted by (arm, seed, run)."""
    rows = [_row(run, windows) for run in runs]
    return sorted(rows, key=lambda r: (r.arm, r.seed if r.seed is not None else -1, r.run))


def _row(run: RunRecord, w: ReportWindows) -> RunRow:
    _, reward = run.series(REWARD_KEY)
    _, kl = run.series(KL_KEY)
    _, fmt = run.series(FORMAT_KEY)
    collapse, step, reason = run.collapse() if run.metrics else (None, None, "")
    return RunRow(
        arm=run.arm,
        seed=run.seed,
        status=run.status,
        finished=run.finished,
        steps=len(run.metrics),
        planned_steps=run.planned_steps,
        final_reward=_tail_mean(reward, w.final_steps),
        peak_reward=max(trailing_means(reward, w.final_steps), default=None),
        kl_growth=_kl_growth(kl, w),
        final_format_error=_tail_mean(fmt, w.final_steps),
        peak_format_error=max(trailing_means(fmt, w.final_steps), default=None),
        collapse=collapse,
        collapse_step=step,
        collapse_reason=reason,
        wall_time_s=_wall_time(run),
        run=run.label,
        judged=run.judged,
    )


def job_rows(jobs: Sequence[SweepJob]) -> list[RunRow]:
    """A row for each sweep job with nothing to read, so the table has the whole sweep. Its arm is not
    known (``name`` comes from a config that was never written): ``-``."""
    return [RunRow(arm="-", seed=job.seed, status=job.state, finished=False, steps=0, planned_steps=None,
                   final_reward=None, peak_reward=None, kl_growth=None, final_format_error=None,
                   peak_format_error=None, collapse=None, collapse_step=None, collapse_reason="", wall_time_s=None,
                   run=job.label)
            for job in jobs]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _tail_mean(values: Sequence[float], n: int) -> float | None:
    return _mean(values[-n:])


def trailing_means(values: Sequence[float], n: int) -> list[float]:
    """Means of every window of ``n`` consecutive values (one mean of all when fewer than ``n``)."""
    if len(values) <= n:
        return [statistics.fmean(values)] if values else []
    return [statistics.fmean(values[i - n : i]) for i in range(n, len(values) + 1)]


def _kl_growth(kl: Sequence[float], w: ReportWindows) -> float | None:
    """The last ``final_steps`` values' mean over the mean of ``[skip_steps, skip_steps + early_steps)``; None
    where the two windows share a row (a run of fewer than ``skip_steps + early_steps + final_steps`` rows): the
    ratio would compare the run with itself (a 10-row run: the same 5 rows twice, 1.00x)."""
    if len(kl) - w.final_steps < w.skip_steps + w.early_steps:
        return None
    return _ratio(_tail_mean(kl, w.final_steps), _mean(kl[w.skip_steps : w.skip_steps + w.early_steps]))


def _ratio(late: float | None, early: float | None) -> float | None:
    return late / early if late is not None and early else None


def _wall_time(run: RunRecord) -> float | None:
    if run.summary is not None and isinstance(run.summary.get("wall_time_s"), (int, float)):
        return float(run.summary["wall_time_s"])
    times = [row["time"] for row in run.metrics if isinstance(row.get("time"), (int, float))]
    return float(times[-1]) if times else None


def _num(fmt: str) -> Callable[[float | None], str]:
    return lambda v: "n/a" if v is None else format(v, fmt)


# (header, field, formatter) for the human-readable tables; CSV/JSON keep full precision.
_COLUMNS: tuple[tuple[str, str, Callable], ...] = (
    ("arm", "arm", str),
    ("seed", "seed", lambda v: "-" if v is None else str(v)),
    ("status", "status", str),
    ("steps", "steps_done", str),
    ("final reward", "final_reward", _num(".3f")),
    ("peak reward", "peak_reward", _num(".3f")),
    ("KL growth", "kl_growth", lambda v: "n/a" if v is None else f"{v:.2f}x"),
    ("final fmt err", "final_format_error", _num(".3f")),
    ("peak fmt err", "peak_format_error", _num(".3f")),
    ("collapse", "verdict", str),
    ("collapse step", "collapse_step", lambda v: "-" if v is None else str(v)),
    ("wall time (s)", "wall_time_s", _num(".1f")),
    ("run", "run", str),
)


def _cells(rows: Sequence[RunRow]) -> tuple[list[str], list[list[str]]]:
    headers = [h for h, _, _ in _COLUMNS]
    return headers, [[fmt(getattr(row, name)) for _, name, fmt in _COLUMNS] for row in rows]


# Column separators only: a header rule of "-", no borders, plain ASCII (logs and terminals alike).
_PLAIN_BOX = "    \n    \n -  \n    \n    \n    \n    \n    \n"


def render_table(headers: Sequence[str], body: Sequence[Sequence[str]], right_from: int | None = None) -> str:
    """Aligned plain text, drawn by ``rich``: a header, a rule, one line per row.

    Columns from index ``right_from`` on are right-aligned (numbers); the rest left-aligned.
    """
    import io

    from rich.box import Box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=Box(_PLAIN_BOX, ascii=True), show_edge=False, pad_edge=False, padding=(0, 1))
    for i, name in enumerate(headers):
        table.add_column(name, justify="right" if right_from is not None and i >= right_from else "left")
    for row in body:
        table.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=100_000, color_system=None, highlight=False, emoji=False, markup=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


# Under a table with rows of runs that did not finish: what their numbers are, and are not.
UNFINISHED_NOTE = ("A status other than completed or collapsed: the run did not finish. Its values are as of "
                   "its last step (steps: done/planned), not its result; the plots leave it out of the means.")


def format_table(rows: Sequence[RunRow]) -> str:
    """Plain-text table with aligned columns, for the console; the note when a run did not finish."""
    headers, body = _cells(rows)
    note = f"\n\n{UNFINISHED_NOTE}" if any(not r.finished for r in rows) else ""
    return render_table(headers, body) + note


def print_table(rows: Sequence[RunRow]) -> None:
    print(format_table(rows))


def markdown_table(rows: Sequence[RunRow]) -> str:
    """GitHub-flavoured markdown; collapse reasons follow as a list (too long for a cell)."""
    headers, body = _cells(rows)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in body]
    reasons = [f"- `{r.run}` ({r.arm}, seed {r.seed}{'' if r.finished else ', ' + r.status}): step {r.collapse_step}: "
               f"{r.collapse_reason}" for r in rows if r.collapse]
    if reasons:
        lines += ["", "Collapse reasons:", "", *reasons]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[RunRow], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f.name for f in fields(RunRow)])
        for row in rows:
            writer.writerow(["" if v is None else v for v in asdict(row).values()])


def write_json(rows: Sequence[RunRow], path: Path) -> None:
    path.write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
