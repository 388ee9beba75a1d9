"""``rlmix report``: write the sweep report, print the table and where the files went."""

from __future__ import annotations

from pathlib import Path

from rlmix.report import ReportWindows, build_report, print_table
from rlmix.report.plots import PLOTS


def run_report(path: str | Path, out_dir: str | Path | None = None) -> Path:
    out, rows = build_report(path, out_dir, ReportWindows())
    print_table(rows)
    print(f"\nwrote {out / 'report.md'} (+ report.csv, report.json, {', '.join(s.filename for s in PLOTS)})")
    return out
