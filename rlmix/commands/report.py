"""``rlmix report``: write the sweep report, print the table and where the files went."""

from __future__ import annotations

from pathlib import Path

from rlmix.report import ReportWindows, build_report, print_table
from rlmix.report.plots import PLOTS
from rlmix.report.where_plot import WHERE_DIRNAME


def run_report(path: str | Path, out_dir: str | Path | None = None, where: bool = False) -> Path:
    out, rows = build_report(path, out_dir, ReportWindows(), where)
    print_table(rows)
    extra = f", {len(rows)} figure(s) in {WHERE_DIRNAME}/" if where else ""
    print(f"\nwrote {out / 'report.md'} (+ report.csv, report.json, {', '.join(s.filename for s in PLOTS)}{extra})")
    return out
