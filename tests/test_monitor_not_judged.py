"""A run the collapse monitor never judged says so (docs/monitor_and_report.md, "Not judged").

The rules are checked from the ``warmup_steps + baseline_steps + 1``-th update (16 by default). A run
shorter than that ends with ``collapse.verdict`` false, which must not read as "no collapse":
``summary.json`` gets ``judged: false``, the run block ``collapse not judged (...)``, the sweep block
``collapse not judged`` and W&B ``collapse/judged``. A run that armed and raised nothing still says
``collapse none``; a resumed run is judged on its whole history.
"""

from __future__ import annotations

from types import SimpleNamespace

from rlmix.config.monitor import MonitorConfig
from rlmix.metrics.console import collapse_text, run_block, sweep_block
from rlmix.metrics.monitor import CollapseMonitor
from rlmix.metrics.wandb_tables import summary_fields

CFG = MonitorConfig()
ARMS_AT = CFG.warmup_steps + CFG.baseline_steps + 1  # the first update the rules are checked on: 16

COLLAPSED_ROW = {"reward/mean": 0.0, "format/error_rate": 1.0, "mismatch/kl_k3": 5.0, "train/grad_norm": 1.0}
HEALTHY_ROW = {"reward/mean": 0.5, "format/error_rate": 0.02, "mismatch/kl_k3": 1e-3, "train/grad_norm": 1.0}


def fed(rows: list[dict], cfg: MonitorConfig = CFG) -> CollapseMonitor:
    monitor = CollapseMonitor(cfg)
    for step, row in enumerate(rows, 1):
        monitor.update(step, row)
    return monitor


def block_lines(summary: dict, tmp_path) -> dict[str, str]:
    block = run_block(summary, tmp_path, None, summary["steps"], [], log_dir=tmp_path)
    return {line.split()[0]: line.split(None, 1)[1] for line in block.splitlines()[1:] if line.startswith("  ")}


def test_a_run_shorter_than_the_warm_up_is_not_judged() -> None:
    end = fed([COLLAPSED_ROW] * 8).finish()
    assert not end.collapse and not end.judged
    summary = end.as_summary()
    assert summary["verdict"] is False  # kept for readers that know only the verdict
    assert (summary["judged"], summary["updates"], summary["judged_from"]) == (False, 8, ARMS_AT)


def test_the_monitor_judges_from_its_first_armed_update() -> None:
    assert not fed([HEALTHY_ROW] * (ARMS_AT - 1)).finish().judged
    end = fed([HEALTHY_ROW] * ARMS_AT).finish()
    assert end.judged and not end.collapse
    assert end.as_summary()["judged"] is True and end.as_summary()["updates"] == ARMS_AT
    custom = MonitorConfig(warmup_steps=2, baseline_steps=3)
    assert fed([HEALTHY_ROW] * 6, custom).finish().as_summary()["judged_from"] == 6
    assert fed([HEALTHY_ROW] * 6, custom).finish().judged and not fed([HEALTHY_ROW] * 5, custom).finish().judged


def test_non_finite_steps_are_judged_from_the_first_update() -> None:
    rows = [dict(HEALTHY_ROW, **{"train/skipped_steps": float(step)}) for step in range(1, 6)]
    end = fed(rows).finish()
    assert end.collapse and end.judged and end.rule.value == "nonfinite"


def test_a_resumed_run_is_judged_on_its_whole_history() -> None:
    from rlmix.orchestration.runner import feed_monitor

    monitor = CollapseMonitor(CFG)
    feed_monitor(monitor, [{"step": step, **HEALTHY_ROW} for step in range(1, 11)])  # the earlier part's rows
    assert not monitor.finish().judged
    for step in range(11, 21):  # this part's steps: 20 in all
        monitor.update(step, HEALTHY_ROW)
    end = monitor.finish()
    assert end.judged and end.as_summary()["updates"] == 20


def test_the_closing_blocks_say_not_judged_not_none(tmp_path) -> None:
    collapse = fed([COLLAPSED_ROW] * 8).finish().as_summary()
    summary = {"status": "completed", "name": "sc_mis", "steps": 8, "final": {"reward/mean": 0.0}, "collapse": collapse}
    line = block_lines(summary, tmp_path)["collapse"]
    assert line.startswith("not judged (8 steps; the monitor judges from step 16")
    assert "monitor.warmup_steps + monitor.baseline_steps" in line
    sweep = sweep_block([("lr=1.0", summary, tmp_path)], tmp_path)
    assert "collapse not judged" in sweep and "collapse none" not in sweep
    assert collapse_text(collapse) != "none"


def test_a_run_that_armed_and_raised_nothing_still_says_none(tmp_path) -> None:
    collapse = fed([HEALTHY_ROW] * 40).finish().as_summary()
    summary = {"status": "completed", "name": "sc_mis", "steps": 40, "final": {}, "collapse": collapse}
    assert block_lines(summary, tmp_path)["collapse"] == "none"
    assert "collapse none" in sweep_block([("a", summary, tmp_path)], tmp_path)
    # summary.json files from before the field have no ``judged``: they were judged
    assert collapse_text({"verdict": False, "step": None, "reason": "", "episodes": [], "warnings": []}) == "none"


def test_summary_json_and_wandb_carry_judged() -> None:
    from rlmix.orchestration.outcome import _summary
    from rlmix.metrics.status import Status

    monitor = fed([COLLAPSED_ROW] * 8)
    loop = SimpleNamespace(version=8, sampler_restarts=0, requests_reissued=0, trainer_restarts=0)
    steps = SimpleNamespace(last={"reward/mean": 0.0}, monitor=monitor)
    summary = _summary(Status.completed, {"name": "x"}, loop, steps, monitor.finish(), None)
    assert summary["collapse"]["judged"] is False and summary["collapse"]["verdict"] is False
    fields = summary_fields(summary)
    assert fields["collapse/judged"] is False and fields["collapse/verdict"] is False
    assert fields["collapse/updates"] == 8 and fields["collapse/judged_from"] == ARMS_AT
