"""``rlmix report``: the table and plots for a run, a Hydra multirun, or a folder of either."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rlmix.errors import ConfigError
from rlmix.metrics.status import Status
from rlmix.metrics.written import unwritable
from rlmix.report.plots import PLOTS, write_plots
from rlmix.report.runs import NO_STATUS, NO_SUMMARY, RunRecord, collect_runs
from rlmix.report.sweep import NO_METRICS, NOT_RUN, SweepCheck, check_sweeps
from rlmix.report.table import (ReportWindows, RunRow, job_rows, markdown_table, summarize, write_csv,
                                write_json)
from rlmix.report.where_plot import WHERE_DIRNAME, where_plot_name, write_where_plots

REPORT_DIRNAME = "report"


def write_report(path: str | Path, out_dir: str | Path | None = None, windows: ReportWindows = ReportWindows(),
                 where: bool = False) -> Path:
    """Collect the runs under ``path`` and write, into ``out_dir`` (default ``<path>/report/``):
    ``report.md`` (markdown table + plots), ``report.csv``, ``report.json`` and the PNGs of ``PLOTS``;
    with ``where``, one figure per run of where its gradient came from (``where/<run>.png``). A sweep's
    jobs with nothing to read (``rlmix.report.sweep``) get a row each, after the runs'.

    Returns ``out_dir``. Raises ``ConfigError`` when ``path`` holds no run directory.
    """
    out, _ = build_report(path, out_dir, windows, where)
    return out


def build_report(path: str | Path, out_dir: str | Path | None, windows: ReportWindows,
                 where: bool = False) -> tuple[Path, list[RunRow]]:
    """``write_report`` that also returns the table's rows."""
    runs = collect_runs(path)
    sweeps = check_sweeps(Path(path))
    out = Path(out_dir) if out_dir is not None else Path(path) / REPORT_DIRNAME
    _check_out_dir(out, "--out" if out_dir is not None else "the report's directory")
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(runs, windows) + job_rows(sweeps.missing)
    write_csv(rows, out / "report.csv")
    write_json(rows, out / "report.json")
    write_plots(runs, out)
    if where:
        write_where_plots(runs, out)
    (out / "report.md").write_text(_markdown(path, runs, rows, windows, where, sweeps))
    return out, rows


def _check_out_dir(out: Path, key: str) -> None:
    """``out`` can be created and written (``unwritable``), checked before anything is written into it."""
    if (problem := unwritable(out)) is not None:
        existing, why = problem
        hint = "" if existing.is_dir() else " (give a new or existing one)"
        raise ConfigError(f"report: {key} {out}: {existing} {why}{hint}")


# The order statuses are counted in on the page: finished first, then how the others stopped.
_STATUS_ORDER = (Status.completed.value, Status.collapsed.value, NO_STATUS, Status.interrupted.value,
                 Status.failed.value, NO_SUMMARY, NO_METRICS, NOT_RUN)


def _counts(rows: Sequence[RunRow], sweeps: SweepCheck) -> str:
    """``3 job(s): 1 completed, 1 interrupted, 1 not run``: every row, by how it ended."""
    counts = Counter(r.status for r in rows)
    order = [s for s in _STATUS_ORDER if s in counts] + sorted(set(counts) - set(_STATUS_ORDER))
    what = f"{len(rows)} job(s)" if sweeps.jobs else f"{len(rows)} run(s)"
    return f"{what}: " + ", ".join(f"{counts[s]} {s}" for s in order)


# What each status of a run that did not finish means, for the page.
_UNFINISHED = {
    Status.interrupted.value: "stopped by a signal (summary.json's `signal`)",
    Status.failed.value: "ended by a fault (summary.json's `error`)",
    NO_STATUS: "a summary.json from before runs recorded how they ended, and not every planned step logged",
    NO_SUMMARY: "no summary.json: the run is still going, or its process was killed; its files cannot tell which",
    NO_METRICS: "a job directory without metrics.jsonl: stopped, or still starting, before its first step",
    NOT_RUN: "a job of the sweep's multirun.yaml with no directory: the sweep stopped before it",
}


def _compared(rows: Sequence[RunRow], sweeps: SweepCheck) -> str:
    """What the plots' means compare, and why the other rows are not in them."""
    finished = [r for r in rows if r.finished]
    text = f"{len(finished)} finished run(s) in {len({r.arm for r in finished})} arm(s) are compared."
    order = list(_UNFINISHED)
    others = sorted({r.status for r in rows if not r.finished},
                    key=lambda s: (order.index(s) if s in order else len(order), s))
    if others:
        text += (
            " Finished: completed, or collapsed (every step ran, or the monitor stopped the run: the collapse is "
            "its outcome). The plots' means, bands and collapse marks are over finished runs only. A run that did "
            "not finish is drawn alone, dotted, and its values in the table are as of its last step (steps: "
            "done/planned), not its result. Not finished: "
            + "; ".join(f"*{s}*: {_UNFINISHED.get(s, 'as its summary.json says')}" for s in others) + "."
        )
    return text + "".join(f"\n\n**Warning:** {note}." for note in sweeps.notes)


def _markdown(path: str | Path, runs: Sequence[RunRecord], rows: Sequence[RunRow], w: ReportWindows,
              where: bool = False, sweeps: SweepCheck = SweepCheck(0, (), ())) -> str:
    intro = (
        f"{_counts(rows, sweeps)}. {_compared(rows, sweeps)}\n\nFinal values are means over the last "
        f"{w.final_steps} steps; peak reward is the best such {w.final_steps}-step mean; KL growth is the final "
        f"k3 mean over its mean on rows {w.skip_steps + 1}..{w.skip_steps + w.early_steps} of metrics.jsonl "
        f"(n/a for a run of fewer than {w.skip_steps + w.early_steps + w.final_steps} rows, where the two overlap)."
    )
    images = "\n\n".join(f"![{spec.title}]({spec.filename})" for spec in PLOTS)
    if where:
        images += "\n\n## Where each run's gradient came from\n\n" + "\n\n".join(
            f"![{run.label}]({WHERE_DIRNAME}/{where_plot_name(run)})" for run in runs)
    return f"# rlmix report: {Path(path)}\n\n{intro}\n\n{markdown_table(rows)}\n{images}\n"
