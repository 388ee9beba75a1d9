"""Running `rlmix`: the console script in a subprocess, or its Typer app in this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RLMIX = str(Path(sys.executable).with_name("rlmix"))


def rlmix(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The installed console script: what a user runs, at ~3 s of imports per call."""
    return subprocess.run([RLMIX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def rlmix_refusing(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rlmix *args`` in this process, through the command's own Typer app, for input that is refused
    before Ray or a run directory: a subprocess would spend ~3 s importing for each refusal. An
    exception that would have reached the console as a traceback is raised here."""
    from typer.testing import CliRunner

    from rlmix.cli import app

    argv, here = sys.argv[:], os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), prog_name="rlmix")
    finally:
        os.chdir(here)
        sys.argv[:] = argv
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["rlmix", *args], result.exit_code, result.stdout, result.stderr)
