"""Argument types the scripts share: a bad count or path is argparse's one usage error (exit 2), before any
work starts, not a traceback at its end."""

from __future__ import annotations

import argparse
from pathlib import Path


def at_least(low: int):
    """An ``int`` of ``low`` or more (``--steps 0`` would otherwise run a profile's default, or nothing)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {low}")
        return value

    parse.__name__ = f"at least {low}"  # what argparse names in its message
    return parse


def existing(kind: str = "path"):
    """A ``Path`` that exists: a ``file``, a ``directory`` or either (``path``)."""
    test = {"file": Path.is_file, "directory": Path.is_dir, "path": Path.exists}[kind]

    def parse(text: str) -> Path:
        path = Path(text).expanduser()
        if not test(path):
            raise argparse.ArgumentTypeError(f"{text}: no such {kind}")
        return path

    parse.__name__ = kind
    return parse
