"""Running `rlmix`: the console script in a subprocess, or its Typer app in this process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

RLMIX = str(Path(sys.executable).with_name("rlmix"))


def rlmix(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The installed console script: what a user runs, at ~3 s of imports per call."""
    return subprocess.run([RLMIX, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def rlmix_refusing(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rlmix *args`` in this process, through the command's own Typer app, for input that is refused
    before Ray or a run directory: a subprocess would spend ~3 s importing for each refusal. An
    exception that would have reached the console as a traceback is raised here."""
    return rlmix_in_process(*args, cwd=cwd)


def rlmix_in_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rlmix *args`` in this process, through the command's own Typer app (the console script's
    entry, from argument parsing to the exit status), with its stdout and stderr captured.

    A run started here uses this process's Ray session: inside the ``warm_ray`` fixture Ray and the
    idle actor processes stay up from one command to the next, as between the jobs of a sweep.
    What a run changes in this process's logging (Hydra's job logging, the quiet console), its
    ``sys.path`` and the user modules it imported from ``cwd`` are undone afterwards. An exception that would have reached the console as a traceback is raised here."""
    from typer.testing import CliRunner

    from rlmix.cli import app

    argv, here, path, modules = sys.argv[:], os.getcwd(), sys.path[:], set(sys.modules)
    os.chdir(cwd)
    try:
        with _logging_restored():
            result = CliRunner().invoke(app, list(args), prog_name="rlmix")
    finally:
        os.chdir(here)
        sys.argv[:], sys.path[:] = argv, path
        # A user module the command imported from its directory (a reward's ``module:function``)
        # goes with it, as it would with the process: another test's module of that name is its own.
        for name in set(sys.modules) - modules:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if Path(origin).resolve().is_relative_to(Path(cwd).resolve()):
                del sys.modules[name]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["rlmix", *args], result.exit_code, result.stdout, result.stderr)


@contextmanager
def _logging_restored():
    """Every logger's handlers, level and propagation, and warnings' display, as they were before; a
    logger first made during the command keeps its own set-up, less the run's log files."""
    saved = {lg: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in _loggers()}
    show = warnings.showwarning
    try:
        yield
    finally:
        logging.captureWarnings(False)
        warnings.showwarning = show
        for lg in _loggers():
            handlers, level, propagate, disabled = saved.get(
                lg, ([h for h in lg.handlers if not isinstance(h, logging.FileHandler)], lg.level, lg.propagate,
                     lg.disabled))
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
