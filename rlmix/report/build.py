"""``rlmix report``: the table and plots for a run, a Hydra multirun, or a folder of either."""

from __future__ import annotations

from pathlib import Path

from rlmix.report.plots import PLOTS, write_plots
from rlmix.report.runs import collect_runs
from rlmix.report.table import ReportWindows, markdown_table, summarize, write_csv, write_json

REPORT_DIRNAME = "report"


def write_report(path: str | Path, out_dir: str | Path | None = None, windows: ReportWindows = ReportWindows()) -> Path:
    """Collect the runs under ``path`` and write, into ``out_dir`` (default ``<path>/report/``):
    ``report.md`` (markdown table + plots), ``report.csv``, ``report.json`` and the PNGs of ``PLOTS``.

    Returns ``out_dir``. Raises ``ConfigError`` when ``path`` holds no run directory.
    """
    runs = collect_runs(path)
    out = Path(out_dir) if out_dir is not None else Path(path) / REPORT_DIRNAME
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(runs, windows)
    write_csv(rows, out / "report.csv")
    write_json(rows, out / "report.json")
    write_plots(runs, out)
    header = [
        f"# rlmix report: {Path(path)}",
        "",
        f"{len(runs)} run(s), {len({r.arm for r in rows})} arm(s). Final values are means over the last "
        f"{windows.final_steps} steps; peak reward is the best such {windows.final_steps}-step mean; KL growth "
        f"is the final k3 mean over its mean on steps {windows.skip_steps}..{windows.skip_steps + windows.early_steps - 1} "
        "(row indices).",
        "",
    ]
    images = [f"![{spec.title}]({spec.filename})" for spec in PLOTS]
    (out / "report.md").write_text("\n".join(header) + "\n" + markdown_table(rows) + "\n" + "\n\n".join(images) + "\n")
    return out
