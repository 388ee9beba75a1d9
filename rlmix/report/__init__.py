"""Sweep reports: one table row per run and per-arm plots (``rlmix report <run or multirun dir>``)."""

from rlmix.report.build import build_report, write_report
from rlmix.report.runs import RunRecord, collect_runs
from rlmix.report.table import ReportWindows, RunRow, format_table, print_table, summarize

__all__ = [
    "ReportWindows",
    "build_report",
    "RunRecord",
    "RunRow",
    "collect_runs",
    "format_table",
    "print_table",
    "summarize",
    "write_report",
]
