"""Sweep reports: one table row per run and per-arm plots (``rlmix report <run or multirun dir>``)."""

from rlmix.report.build import run_report, write_report
from rlmix.report.runs import RunRecord, collect_runs
from rlmix.report.table import ReportWindows, RunRow, format_table, print_table, summarize

__all__ = [
    "ReportWindows",
    "RunRecord",
    "RunRow",
    "collect_runs",
    "format_table",
    "print_table",
    "run_report",
    "summarize",
    "write_report",
]
