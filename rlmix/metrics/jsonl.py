"""Reading a run's ``metrics.jsonl`` back (the report and a resumed run both do), and cutting it
back to a checkpoint's step (a resumed run, a restarted trainer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlmix.errors import ConfigError
from rlmix.metrics.written import write_atomically

METRICS_FILE = "metrics.jsonl"  # one JSON object per trainer step, in a run's directory


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``. A cut-off last line (a run killed mid-write) is dropped; any other
    bad line is an error naming the file and line. So is a step that does not follow the one before:
    a run rewinds its file before training steps again, so steps that go back mean two runs wrote
    into one directory, and their rows read as one run would be numbers of neither."""
    lines = path.read_text().splitlines()
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):
                break
            raise ConfigError(f"report: {path}:{lineno} is not a JSON object") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ConfigError(f"report: {path}:{lineno} needs a JSON object with an integer 'step'")
        if rows and row["step"] <= rows[-1]["step"]:
            raise ConfigError(f"report: {path}:{lineno}: step {row['step']} after step {rows[-1]['step']} "
                              "(steps must increase: two runs written into one directory?)")
        rows.append(row)
    return rows


def keep_rows(path: Path, step: int) -> list[dict[str, Any]]:
    """Rewrite ``path`` (atomically) with its rows up to ``step`` only; returns them. The steps after
    a checkpoint are trained again when a run goes back to it, so their rows go, not duplicated."""
    rows = [row for row in read_metrics(path) if row["step"] <= step] if path.exists() else []
    write_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))
    return rows
