"""What machine this is, in the words results pages use (no heavy imports)."""

from __future__ import annotations

from pathlib import Path


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), or None where that is not readable. Results pages name
    it: the embedded models build, and runs train, differently on different CPUs' kernels."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else None
