"""``rlmix report``: the table and plots for a run, a Hydra multirun, or a folder of either."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlmix.report.plots import PLOTS, write_plots
from rlmix.report.runs import RunRecord, collect_runs
from rlmix.report.table import ReportWindows, RunRow, markdown_table, summarize, write_csv, write_json
from rlmix.report.where_plot import WHERE_DIRNAME, where_plot_name, write_where_plots

REPORT_DIRNAME = "report"


def write_report(path: str | Path, out_dir: str | Path | None = None, windows: ReportWindows = ReportWindows(),
                 where: bool = False) -> Path:
    """Collect the runs under ``path`` and write, into ``out_dir`` (default ``<path>/report/``):
    ``report.md`` (markdown table + plots), ``report.csv``, ``report.json`` and the PNGs of ``PLOTS``;
    with ``where``, one figure per run of where its gradient came from (``where/<run>.png``).

    Returns ``out_dir``. Raises ``ConfigError`` when ``path`` holds no run directory.
    """
    out, _ = build_report(path, out_dir, windows, where)
    return out


def build_report(path: str | Path, out_dir: str | Path | None, windows: ReportWindows,
                 where: bool = False) -> tuple[Path, list[RunRow]]:
    """``write_report`` that also returns the table's rows."""
    runs = collect_runs(path)
    out = Path(out_dir) if out_dir is not None else Path(path) / REPORT_DIRNAME
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(runs, windows)
    write_csv(rows, out / "report.csv")
    write_json(rows, out / "report.json")
    write_plots(runs, out)
    if where:
        write_where_plots(runs, out)
    (out / "report.md").write_text(_markdown(path, runs, rows, windows, where))
    return out, rows


def _markdown(path: str | Path, runs: Sequence[RunRecord], rows: Sequence[RunRow], w: ReportWindows,
              where: bool = False) -> str:
    intro = (
        f"{len(runs)} run(s), {len({r.arm for r in rows})} arm(s). Final values are means over the last "
        f"{w.final_steps} steps; peak reward is the best such {w.final_steps}-step mean; KL growth is the final "
        f"k3 mean over its mean on rows {w.skip_steps}..{w.skip_steps + w.early_steps - 1} of metrics.jsonl."
    )
    images = "\n\n".join(f"![{spec.title}]({spec.filename})" for spec in PLOTS)
    if where:
        images += "\n\n## Where each run's gradient came from\n\n" + "\n\n".join(
            f"![{run.label}]({WHERE_DIRNAME}/{where_plot_name(run)})" for run in runs)
    return f"# rlmix report: {Path(path)}\n\n{intro}\n\n{markdown_table(rows)}\n{images}\n"
