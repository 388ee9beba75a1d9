"""What W&B gets at the end of a run, so a sweep can be compared in the W&B UI alone.

* ``pools``: a table with one row per sampler pool — its label and count, and the run's mean
  mismatch (k3 KL), format-error rate and sampler throughput, read back from ``metrics.jsonl``
  (so a resumed run's table covers all its steps).
* summary fields: the scalars of ``summary.json`` plus the collapse verdict flattened
  (``collapse/verdict``, ``collapse/step``, ``collapse/reason``; ``collapse/episodes`` and
  ``collapse/warnings`` as counts, with ``collapse/episodes_text`` and ``collapse/warnings_text``);
  W&B cannot filter on a dict.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlmix.metrics.console import episodes_text, warnings_text
from rlmix.metrics.jsonl import read_metrics
from rlmix.metrics.names import FORMAT_KEY, KL_KEY, SAMPLER_TOKENS_PER_S

POOL_COLUMNS = (KL_KEY, FORMAT_KEY, SAMPLER_TOKENS_PER_S)


def pool_rows(fleet: dict[str, dict], metrics_path: Path) -> list[list]:
    """[pool, label, count, steps with data, mean of each POOL_COLUMNS metric] per pool."""
    rows = read_metrics(metrics_path)
    out = []
    for pool, entry in fleet.items():
        means, seen = [], 0
        for key in POOL_COLUMNS:
            values = [r[f"{key}/{pool}"] for r in rows if isinstance(r.get(f"{key}/{pool}"), (int, float))]
            values = [v for v in values if math.isfinite(v)]
            seen = max(seen, len(values))
            means.append(sum(values) / len(values) if values else None)
        out.append([pool, entry.get("label", ""), entry.get("count", 0), seen, *means])
    return out


def summary_fields(summary: dict) -> dict:
    fields = {key: value for key, value in summary.items() if not isinstance(value, dict)}
    for key, value in (summary.get("collapse") or {}).items():
        # episodes and warnings are lists of records: W&B's summary gets how many and the text
        fields[f"collapse/{key}"] = len(value) if isinstance(value, list) else value
    collapse = summary.get("collapse") or {}
    if "episodes" in collapse:
        fields["collapse/episodes_text"] = episodes_text(collapse)
        fields["collapse/warnings_text"] = warnings_text(collapse)
    return fields


def finish_wandb(run, summary: dict, metrics_path: Path) -> None:
    import wandb

    if summary.get("fleet") and metrics_path.is_file():
        columns = ["pool", "label", "count", "steps", *POOL_COLUMNS]
        run.log({"pools": wandb.Table(columns=columns, data=pool_rows(summary["fleet"], metrics_path))})
    run.summary.update(summary_fields(summary))
    run.finish()
