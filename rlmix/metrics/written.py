"""Files written whole or not at all, and the result files this process has written (``rlmix
eval``'s eval.json, ``rlmix probe``'s probe.json), so that a command a signal ends after its write
says so instead of "none written"."""

from __future__ import annotations

import os
from pathlib import Path

WRITTEN: list[Path] = []


def unwritable(path: str | Path) -> tuple[Path, str] | None:
    """Why directory ``path`` could not be created and written, checked without creating anything: (the
    nearest path that exists, "is a file, not a directory" or "is not writable"); None where it can."""
    target = Path(path).absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        return existing, "is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return existing, "is not writable"
    return None


def write_atomically(path: Path, text: str) -> Path:
    """``text`` into ``path`` through a temporary file: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def write_result(path: Path, text: str) -> Path:
    """A command's result file, written atomically and recorded in ``WRITTEN``."""
    WRITTEN.append(write_atomically(path, text))
    return path
