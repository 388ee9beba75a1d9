"""A quiet console: third-party output goes to log files in the run directory, not the terminal.

Two sources, two routes:

* the driver (the ``rlmix train`` process): Python logging. Records from rlmix and Hydra reach
  the console; everything else (Ray, W&B, DeepSpeed, ...) reaches only Hydra's ``train.log``.
  Errors always reach the console, except the raylet's report of a dead worker (a paragraph of
  possible causes per death), which goes to train.log: rlmix says in one line which actor died
  and what the run does about it.
* the Ray workers (samplers, trainer): vLLM, DeepSpeed and torch print from C++ and from child
  processes too, so logging filters cannot catch it all. Each worker process points its own
  stdout and stderr (file descriptors 1 and 2, which child processes inherit) at
  ``workers.log`` in the run directory when it takes on the run's environment
  (``adopt_worker_env``, first thing in each actor's constructor), and Ray does not forward
  worker output to the driver.

``logger.verbose=true`` turns both routes off: everything streams to the console as before.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

WORKERS_LOG = "workers.log"
DRIVER_LOG = "train.log"  # written by Hydra's job logging (hydra.job.name: train)
_LOG_ENV = "RLMIX_WORKER_LOG"
# Worker processes: no tokenizer thread pools, no per-load progress bars even in the log file.
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
_CONSOLE_LOGGERS = ("rlmix", "hydra", "__main__")
THIRD_PARTY = ("deepspeed", "wandb", "transformers", "vllm", "torch", "py.warnings", "urllib3", "filelock")
_SOURCE = re.compile(r"([\w.-]+\.py:\d+)")
_WARNING = re.compile(r"\bWARN(ING)?\b|Warning|^\[W\d|\(raylet\).*warn", re.IGNORECASE)


def worker_env(run_dir: Path, verbose: bool) -> dict[str, str]:
    """The environment every worker of a run takes on (``adopt_worker_env``)."""
    env = dict(WORKER_ENV)
    if not verbose:
        env[_LOG_ENV] = str(Path(run_dir).resolve() / WORKERS_LOG)
    return env


_ADOPTED: dict[str, str] = {}  # this process's run environment, for the actors it starts itself


def adopt_worker_env(env_vars: dict[str, str]) -> None:
    """This process takes on a run's worker environment: its variables, and its output goes to the
    run's workers.log. Actors get it as a constructor argument rather than as Ray's ``runtime_env``,
    which would start each worker through a second interpreter and Ray's runtime-env agent
    (docs/performance.md, Start-up)."""
    os.environ.update(env_vars)
    _ADOPTED.clear()
    _ADOPTED.update(env_vars)
    redirect_worker_output()  # a no-op when the run streams worker output to the console


def inherited_runtime_env() -> dict:
    """Ray ``runtime_env`` for the actors a worker starts itself (DeepSpeed's ranks): the run's
    worker environment as this process adopted it, output included."""
    if not _ADOPTED:
        return {}
    env: dict = {"env_vars": dict(_ADOPTED)}
    if _LOG_ENV in _ADOPTED:
        env["worker_process_setup_hook"] = f"{__name__}.redirect_worker_output"
    return env


def redirect_worker_output() -> None:
    """This process's stdout and stderr append to the run's workers.log (also Ray's worker set-up hook).

    On a remote node that cannot see the run directory the worker keeps Ray's own log files.
    """
    path = os.environ.get(_LOG_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return
    for stream in (1, 2):
        os.dup2(fd, stream)
    os.close(fd)
    logging.captureWarnings(True)


class _RunConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or record.name.split(".")[0] in _CONSOLE_LOGGERS


class _ThirdPartyFile(logging.FileHandler):
    """train.log for a third-party logger that no longer propagates (one per logger, per run)."""


class _ThirdPartyErrors(logging.StreamHandler):
    """A third-party logger's errors still reach the console."""


def route_driver_logs(log_dir: Path, verbose: bool) -> None:
    """Keep third-party records of this process off the console; they go to ``log_dir``/train.log.

    Two layers, because Hydra re-configures the root logger around every job of a sweep: the
    known libraries get their own file handler and stop propagating (that survives Hydra's
    re-configuration, and catches W&B's records at interpreter exit), and the root's console
    handlers pass only rlmix's and Hydra's records below ERROR. Call after ``import ray`` and
    before ``ray.init``: Ray attaches a console handler on import, removed here.
    """
    if verbose:
        return
    logging.captureWarnings(True)  # warnings.warn(...) becomes a record of logger py.warnings
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler) and not any(
            isinstance(f, _RunConsoleFilter) for f in handler.filters
        ):
            handler.addFilter(_RunConsoleFilter())
    # ray.init(configure_logging=False) clears the "ray" logger's handlers, so a file handler there
    # would not last; its records propagate to the root instead (file: yes, console: filtered).
    ray = logging.getLogger("ray")
    for handler in [h for h in ray.handlers if not isinstance(h, logging.FileHandler)]:
        ray.removeHandler(handler)
    ray.propagate = True
    _raylet_reports_to_log()
    root_file = next((h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None)
    for name in THIRD_PARTY:
        _to_file(logging.getLogger(name), Path(log_dir) / DRIVER_LOG, root_file.formatter if root_file else None)


def library_logs_to(path: Path) -> None:
    """The known libraries' records of this process go to ``path`` (their errors still to the console),
    for a command without a run directory or Ray (``rlmix probe``). vLLM attaches its own console
    handler when imported unless told not to: call before it is imported."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    logging.captureWarnings(True)
    formatter = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    for name in THIRD_PARTY:
        _to_file(logging.getLogger(name), path, formatter)


@contextmanager
def stderr_to(path: Path | None):
    """File descriptor 2 appends to ``path`` inside the block (None: left as it is): what libraries write
    there from C++ or a progress bar (torch's ``[W...]`` lines, vLLM's weight loading), which no logging
    handler sees. The block's own output goes to stdout; an exception still surfaces after it."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved, fd = os.dup(2), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _raylet_reports_to_log() -> None:
    """The raylet's error reports become records of the "ray" logger (train.log) instead of lines
    on stdout. Ray's driver prints them from a thread of its own through a module-level function
    and offers no switch for it, so that function is wrapped (once per process)."""
    import ray._private.worker as ray_worker

    printer = ray_worker.print_to_stdstream
    if getattr(printer, "rlmix_wrapped", False):
        return

    def to_log(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            return printer(data, ignore_prefix)
        for line in data.get("lines", []):
            logging.getLogger("ray").warning("(raylet) %s", line)

    to_log.rlmix_wrapped = True
    ray_worker.print_to_stdstream = to_log


def _to_file(logger: logging.Logger, path: Path, formatter: logging.Formatter | None) -> None:
    """``logger`` writes to ``path`` (and its errors to stderr) instead of its own or the root's handlers."""
    for handler in list(logger.handlers):
        if isinstance(handler, (_ThirdPartyFile, _ThirdPartyErrors)):
            handler.close()
        if not isinstance(handler, logging.FileHandler) or isinstance(handler, _ThirdPartyFile):
            logger.removeHandler(handler)
    to_file = _ThirdPartyFile(path, delay=True)
    # W&B keeps its own debug log in the run's wandb/ folder; train.log takes its warnings only.
    to_file.setLevel(logging.WARNING if logger.name == "wandb" else logging.INFO)
    if formatter is not None:
        to_file.setFormatter(formatter)
    errors = _ThirdPartyErrors()
    errors.setLevel(logging.ERROR)
    logger.addHandler(to_file)
    logger.addHandler(errors)
    logger.propagate = False


def quiet_console(name: str) -> None:
    """``name``'s errors stop reaching the console too (they still go to train.log): for a library
    whose failures the run expects, e.g. W&B's after a Ctrl-C has ended its service process."""
    logger = logging.getLogger(name)
    for handler in [h for h in logger.handlers if isinstance(h, _ThirdPartyErrors)]:
        logger.removeHandler(handler)
        handler.close()


def worker_warnings(run_dir: Path) -> tuple[int, int]:
    """(warning lines, distinct warnings) in the run's workers.log: the once-per-run summary."""
    path = Path(run_dir) / WORKERS_LOG
    if not path.is_file():
        return 0, 0
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if _WARNING.search(ln)]
    # One kind per source line that warned (vLLM, DeepSpeed and Python warnings all name it);
    # otherwise the text without the numbers that differ between repeats (times, pids, layers).
    kinds = {(m.group(1) if (m := _SOURCE.search(ln)) else re.sub(r"\d+", "#", ln)) for ln in lines}
    return len(lines), len(kinds)
