"""Per-arm curves against trainer step: mean over seeds, with a min–max band across seeds.

The means are over finished runs (``RunRecord.finished``): a run cut short would end its arm's curve
with fewer seeds than it started with, and its last steps are not its result. Each run that did not
finish is drawn alone, dotted, in its arm's colour.

matplotlib is imported lazily and used through its object API (``Figure`` + Agg canvas), so nothing
here touches pyplot's global backend state or needs a display.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlmix.metrics.names import (FORMAT_KEY, KL_KEY, REWARD_KEY, UNIFORM_GROUPS_FRAC, WHERE_GRAD_RATIO_TAIL,
                                 WHERE_GRAD_TOP)
from rlmix.report.runs import RunRecord


@dataclass(frozen=True)
class PlotSpec:
    filename: str
    key: str
    title: str
    ylabel: str
    log: bool = False


PLOTS = (
    PlotSpec("reward.png", REWARD_KEY, "Reward", "reward/mean"),
    PlotSpec("kl.png", KL_KEY, "Sampler–trainer KL (k3)", "mismatch/kl_k3 (log scale)", log=True),
    PlotSpec("format_errors.png", FORMAT_KEY, "Format-error rate", "format/error_rate"),
    # Near 1: the batch's groups got one reward each, so a group baseline leaves nothing to learn from
    # (a run that fails every sample cannot climb back on its own gradient).
    PlotSpec("uniform_groups.png", UNIFORM_GROUPS_FRAC, "Groups with one reward for all samples",
             "reward/uniform_groups_frac"),
    # Near 1: a handful of tokens carry each update (before the lr 1e-3 fleet collapse, docs/results.md).
    PlotSpec("grad_top1pct.png", WHERE_GRAD_TOP, "Gradient share of the top 1% of tokens", "where/grad_top1pct"),
    # The gradient the tokens far from the sampler carry: what a MIS mask drops (0 under it by construction).
    PlotSpec("grad_ratio_tail.png", WHERE_GRAD_RATIO_TAIL, "Gradient share of tokens with p/q outside [0.2, 5]",
             "where/grad_ratio_tail"),
)


@dataclass(frozen=True)
class ArmCurve:
    """One arm's curve: at each step, the mean / min / max over the seeds that logged that step."""

    arm: str
    seeds: int
    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    collapse_steps: list[int]


def arm_curves(runs: Sequence[RunRecord], key: str, positive_only: bool = False) -> list[ArmCurve]:
    """Aggregate ``key`` per arm and step. ``positive_only`` drops values ≤ 0 (for a log axis)."""
    by_arm: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_arm[run.arm].append(run)
    curves = []
    for arm in sorted(by_arm):
        per_step: dict[int, list[float]] = defaultdict(list)
        collapse_steps = []
        for run in by_arm[arm]:
            for step, value in zip(*run.series(key)):
                if value > 0 or not positive_only:
                    per_step[step].append(value)
            verdict, step, _ = run.collapse()
            if verdict and step is not None:
                collapse_steps.append(step)
        if not per_step:
            continue
        steps = sorted(per_step)
        curves.append(ArmCurve(
            arm=arm,
            seeds=len(by_arm[arm]),
            steps=steps,
            mean=[sum(per_step[s]) / len(per_step[s]) for s in steps],
            low=[min(per_step[s]) for s in steps],
            high=[max(per_step[s]) for s in steps],
            collapse_steps=sorted(collapse_steps),
        ))
    return curves


def write_plots(runs: Sequence[RunRecord], out_dir: Path) -> list[Path]:
    """Write one PNG per ``PLOTS`` entry into ``out_dir``; an arm-less plot says "no data"."""
    return [_plot(runs, spec, out_dir / spec.filename) for spec in PLOTS]


def _plot(runs: Sequence[RunRecord], spec: PlotSpec, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = {arm: f"C{i % 10}" for i, arm in enumerate(sorted({run.arm for run in runs}))}
    curves = arm_curves([run for run in runs if run.finished], spec.key, positive_only=spec.log)
    for curve in curves:
        color = colors[curve.arm]
        ax.plot(curve.steps, curve.mean, color=color, label=f"{curve.arm} (n={curve.seeds})")
        if curve.seeds > 1:
            ax.fill_between(curve.steps, curve.low, curve.high, color=color, alpha=0.2, linewidth=0)
        marks = [(s, m) for s, m in zip(curve.steps, curve.mean) if s in set(curve.collapse_steps)]
        if marks:
            ax.scatter(*zip(*marks), marker="x", s=60, color=color, zorder=3)
    drawn = len(curves) + _unfinished(ax, runs, spec, colors)
    if spec.log and drawn:
        ax.set_yscale("log")
    if not drawn:
        ax.text(0.5, 0.5, f"no data for {spec.key}", ha="center", va="center", transform=ax.transAxes)
    # A line each: the longer titles ran past an 8-inch figure's edges on one.
    dotted = "\ndotted: a run that did not finish, alone" if any(not run.finished for run in runs) else ""
    ax.set_title(f"{spec.title}\nby arm: mean over finished seeds, band = min–max, x = collapse{dotted}",
                 fontsize="medium")
    ax.set_xlabel("trainer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers; no 2.5 ticks on short runs
    ax.set_ylabel(spec.ylabel)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(loc="best", fontsize="small")
    fig.savefig(path)
    return path


def _unfinished(ax, runs: Sequence[RunRecord], spec: PlotSpec, colors: dict[str, str]) -> int:
    """Draw each run that did not finish on its own; returns how many had data for ``spec.key``."""
    drawn = 0
    for run in runs:
        if run.finished:
            continue
        points = [(s, v) for s, v in zip(*run.series(spec.key)) if v > 0 or not spec.log]
        if points:
            planned = "?" if run.planned_steps is None else run.planned_steps
            ax.plot(*zip(*points), color=colors[run.arm], linestyle=":",
                    label=f"{run.arm} seed {run.seed}: {run.status}, {len(run.metrics)}/{planned} steps")
            drawn += 1
    return drawn
