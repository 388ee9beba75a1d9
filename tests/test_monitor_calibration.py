"""The default monitor on the stored labelled runs (docs/monitor_and_report.md, "Calibration").

``docs/monitor_calibration/runs.json`` holds real runs' per-step series; replaying them through the
monitor is offline and deterministic, so these are failable checks on recorded data: no healthy run is
judged collapsed or stopped, every lasting collapse with full series is judged collapsed, and the
table in the docs is the one ``scripts/calibrate_monitor.py`` prints for the stored set.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlmix.config.monitor import MonitorConfig

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("calibrate_monitor", ROOT / "scripts" / "calibrate_monitor.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations through it
    spec.loader.exec_module(module)
    return module


C = load_script()
RECORDS = C.load()
HEALTHY = [r for r in RECORDS if r["label"] == "healthy"]
COLLAPSES = [r for r in RECORDS if r["label"] == "collapse" and r["format"] is not None]


def test_the_stored_set_is_labelled_as_the_docs_say():
    defaults = [r for r in HEALTHY if r["source"].startswith("default_s")]
    assert defaults and all(len(r["reward"]) == 150 and r["format"] is not None for r in defaults)  # make train
    assert COLLAPSES and all(C.record_ended_down(r, MonitorConfig()) for r in COLLAPSES)
    assert not any(C.record_ended_down(r, MonitorConfig()) for r in HEALTHY)


@pytest.mark.parametrize("record", HEALTHY, ids=[r["source"] for r in HEALTHY])
def test_no_healthy_run_is_judged_collapsed_or_stopped(record):
    result = C.replay(record, MonitorConfig())
    assert not result.collapsed and result.stopped is None


@pytest.mark.parametrize("record", COLLAPSES, ids=[r["source"] for r in COLLAPSES])
def test_every_lasting_collapse_is_judged_collapsed(record):
    assert C.replay(record, MonitorConfig()).collapsed


def test_the_docs_show_the_table_of_the_stored_set():
    assert C.table(RECORDS) in (ROOT / "docs" / "monitor_and_report.md").read_text()
