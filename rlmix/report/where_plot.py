"""One figure per run: where each step's gradient came from (``rlmix report --where``).

Three panels against trainer step, from the run's own ``metrics.jsonl``:

1. the format-error rate and the share of groups whose samples all got one reward
   (``reward/uniform_groups_frac``: no advantage under a group baseline);
2. the gradient's share by band of the ratio p/q (``where/grad/r…``), stacked;
3. the gradient's share by the trainer's probability of the sampled token (``where/grad/p…``), stacked.

A step without gradient (every group uniform) has no shares: it is shaded grey in panels 2 and 3.
A run that logged no ratio bands (older runs) gets an empty panel that says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlmix.metrics.names import FORMAT_KEY, UNIFORM_GROUPS_FRAC, WHERE_GRAD
from rlmix.report.runs import RunRecord

WHERE_DIRNAME = "where"


def where_plot_name(run: RunRecord) -> str:
    """The figure's file name: the run's label with path separators made flat."""
    label = "run" if run.label in ("", ".") else run.label
    return label.replace("/", "__").replace("\\", "__") + ".png"


def _stack(ax, run: RunRecord, bins: Sequence[str], title: str) -> None:
    steps = [int(row["step"]) for row in run.metrics]
    keys = [f"{WHERE_GRAD}/{b}" for b in bins]
    shares = [[float(row.get(k, 0.0)) for row in run.metrics] for k in keys]
    has = [any(k in row for k in keys) for row in run.metrics]
    if not any(has):
        ax.text(0.5, 0.5, f"no {WHERE_GRAD}/{bins[0][0]}… in this run", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.stackplot(steps, *shares, labels=bins, linewidth=0)
        for step, logged in zip(steps, has):
            if not logged:
                ax.axvspan(step - 0.5, step + 0.5, color="0.6", alpha=0.5, linewidth=0)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="x-small")
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of Σ g²")
    ax.set_title(title, fontsize="medium")


def write_where_plot(run: RunRecord, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The bin names come with torch (rlmix.metrics.where): only a --where report pays that import.
    from rlmix.metrics.where import prob_bin_names, ratio_bin_names

    fig = Figure(figsize=(9, 8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    top, ratio, prob = fig.subplots(3, 1, sharex=True)
    for key, label in ((FORMAT_KEY, "format-error rate"), (UNIFORM_GROUPS_FRAC, "groups with one reward")):
        steps, values = run.series(key)
        if steps:
            top.plot(steps, values, label=label)
    top.set_ylim(0, 1)
    if top.get_lines():  # a legend of nothing is matplotlib's UserWarning on stderr
        top.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="x-small")
    planned = "?" if run.planned_steps is None else run.planned_steps
    top.set_title(f"{run.arm}, seed {run.seed}: {run.label} ({run.status}, {len(run.metrics)}/{planned} steps)",
                  fontsize="medium")
    _stack(ratio, run, ratio_bin_names(), "gradient by p/q (grey: a step without gradient)")
    _stack(prob, run, prob_bin_names(), "gradient by the trainer's probability of the sampled token")
    prob.set_xlabel("trainer step")
    fig.savefig(path)
    return path


def write_where_plots(runs: Sequence[RunRecord], out_dir: Path) -> list[Path]:
    """One figure per run into ``out_dir/where/``."""
    target = out_dir / WHERE_DIRNAME
    target.mkdir(parents=True, exist_ok=True)
    return [write_where_plot(run, target / where_plot_name(run)) for run in runs]
