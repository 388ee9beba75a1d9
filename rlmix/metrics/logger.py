"""Where per-step metrics go: ``metrics.jsonl`` (always), W&B (offline by default), the console.

W&B is best effort: if it fails to start or to log, the run continues on JSONL and says so once.
``online`` needs an API key, checked before the run starts (``check_wandb_login``); an online start
that cannot reach W&B waits ``WANDB_INIT_TIMEOUT`` seconds at most, then logs offline in the run dir.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

from rlmix.config.schema import WandbConfig, WandbMode
from rlmix.errors import ConfigError, RunFailed
from rlmix.metrics.console import StepDisplay, shown
from rlmix.metrics.jsonl import METRICS_FILE, keep_rows
from rlmix.metrics.names import FORMAT_KEY, KL_KEY, REWARD_KEY, SAMPLER_TOKENS_PER_S, STALENESS_MEAN, STEP_S
from rlmix.metrics.quiet import quiet_console
from rlmix.metrics.wandb_tables import finish_wandb
from rlmix.metrics.written import write_atomically

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
# How long an online start may wait for W&B's server: a reachable one starts a run in a few seconds,
# and 30 s leaves room for its retries; wandb's own 90 s held up every start without a network.
INIT_TIMEOUT_ENV = "WANDB_INIT_TIMEOUT"  # wandb's own variable for it: a user's value is kept
INIT_TIMEOUT_S = 30.0


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null keeps the line valid
    return value


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        wandb_cfg: WandbConfig,
        run_name: str,
        config: dict,
        group: str | None,
        total_steps: int,
        console_every: int = 1,
        stream: TextIO | None = None,  # None: sys.stdout when the run starts, not when this was imported
        run_id: str | None = None,
        elapsed_s: float = 0.0,
    ):
        """``run_id`` continues that W&B run (a resumed run); ``elapsed_s``: wall time of its earlier parts."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.start = time.time() - elapsed_s
        self.total_steps = total_steps
        self.display = StepDisplay(total_steps, console_every, stream)
        try:
            self._jsonl = open(self.run_dir / METRICS_FILE, "a", buffering=1)
        except OSError as err:  # nothing trained yet: one line, as for a process that did not start
            raise RunFailed(f"{METRICS_FILE} cannot be opened to append rows: {_first_line(err)}") from err
        self._logged, self._wandb_from = 0, 0  # the newest step logged; the first step W&B takes
        self.wandb = start_wandb(wandb_cfg, self.run_dir, run_name, config, group, run_id)
        # The W&B run this one continues, kept apart from the live object, which a failure drops: a
        # checkpoint records it, so that a later resume still continues the same W&B run.
        self.wandb_id = getattr(self.wandb, "id", None) or run_id

    def elapsed_s(self) -> float:
        return round(time.time() - self.start, 3)

    def log(self, step: int, metrics: dict[str, float | str]) -> None:
        record = {"step": step, "time": round(time.time() - self.start, 3)}
        record |= {key: _jsonable(value) for key, value in sorted(metrics.items())}
        try:
            self._jsonl.write(json.dumps(record) + "\n")
        except OSError as err:  # a full disk, a file made read-only: the run fails as a failed save does
            raise RunFailed(f"writing step {step} to {METRICS_FILE} failed: {_first_line(err)}") from err
        self._logged = max(self._logged, step)
        if self.wandb is not None and step >= self._wandb_from:
            try:
                self.wandb.log(metrics, step=step)
            except Exception as err:  # W&B failure never kills training
                log.warning("W&B logging failed (%s); continuing with metrics.jsonl only", err)
                self.wandb = None
        self.display.update(step, progress_line(step, self.total_steps, metrics, time.time() - self.start))

    def rewind(self, step: int) -> list[dict]:
        """Drop ``metrics.jsonl``'s rows after ``step`` (they are trained again); returns the rows kept.

        W&B keeps the rows it was sent: its steps only increase, so the steps trained again are
        not sent twice, and the W&B curve keeps the first attempt's values for them.
        """
        self._close_rows()
        try:
            rows = keep_rows(self.run_dir / METRICS_FILE, step)
            self._jsonl = open(self.run_dir / METRICS_FILE, "a", buffering=1)
        except OSError as err:
            raise RunFailed(f"going back to step {step} in {METRICS_FILE} failed: {_first_line(err)}") from err
        self._wandb_from = max(self._wandb_from, self._logged + 1)
        return rows

    def finish(self, summary: dict, at_once: bool = False) -> dict:
        """Write summary.json (with the wall time) and close every sink; returns what was written.

        ``at_once``: the run was stopped by a second signal. W&B's service process got the same
        Ctrl-C, so its run is closed without the final tables, and what W&B reports about a
        service that is gone goes to train.log, not the console."""
        summary = {"wall_time_s": round(time.time() - self.start, 3)} | summary
        try:
            write_atomically(self.run_dir / SUMMARY_FILE, json.dumps(summary, indent=2, default=str))
        except OSError as err:  # a full disk: the run's closing lines still say how it ended
            with suppress(OSError):
                (self.run_dir / f"{SUMMARY_FILE}.tmp").unlink(missing_ok=True)
            log.error("%s was not written (%s): the lines below are the only record of how the run ended",
                      SUMMARY_FILE, _first_line(err))
        self._close_rows()
        self.display.close()
        if self.wandb is not None and at_once:
            quiet_console("wandb")
            try:
                self.wandb.finish(exit_code=1)
            except Exception as err:
                log.debug("W&B finish after a stop at once failed (%s)", err)
        elif self.wandb is not None:
            try:
                finish_wandb(self.wandb, summary, self.run_dir / METRICS_FILE)
            except Exception as err:
                log.warning("W&B finish failed (%s)", err)
        return summary


    def _close_rows(self) -> None:
        """Close ``metrics.jsonl``; a row whose write failed is still buffered, and failing again here adds
        nothing to the run's failure already told."""
        try:
            self._jsonl.close()
        except OSError as err:
            log.debug("closing %s failed (%s)", METRICS_FILE, err)


def progress_line(step: int, total: int, metrics: dict, elapsed_s: float) -> str:
    tokens_s = sum(v for k, v in metrics.items() if k.startswith(f"{SAMPLER_TOKENS_PER_S}/"))
    nan = float("nan")
    return (
        f"step {step:>4}/{total}  reward {metrics.get(REWARD_KEY, nan):.3f}  "
        f"kl_k3 {metrics.get(KL_KEY, nan):.2e}  "
        f"fmt_err {metrics.get(FORMAT_KEY, nan):.3f}  "
        f"stale {metrics.get(STALENESS_MEAN, nan):.1f}  "
        f"sampler {tokens_s:,.0f} tok/s  step {metrics.get(STEP_S, nan):.2f}s  "
        f"[{elapsed_s:,.0f}s]"
    )


def start_wandb(cfg: WandbConfig, run_dir: Path, name: str, config: dict, group: str | None, run_id: str | None = None):
    if cfg.mode is WandbMode.disabled:
        return None
    try:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")  # the run's own console line says enough
        run = dict(project=cfg.project, entity=cfg.entity, group=cfg.group or group, name=name, dir=str(run_dir),
                   config=config, reinit="finish_previous", id=run_id, resume="allow" if run_id else None)
        if cfg.mode is WandbMode.online:
            return _start_online(wandb, run)
        return wandb.init(mode=cfg.mode.value, **run)
    except Exception as err:
        log.warning("W&B did not start in %s mode (%s); metrics go to %s only", cfg.mode.value, _first_line(err),
                    METRICS_FILE)
        return None


def _start_online(wandb, run: dict):
    """An online W&B run, or, when W&B's server cannot be reached in time, an offline one in the
    run dir: its metrics are kept for ``wandb sync`` instead of lost, and the run has waited
    ``init_timeout()`` seconds, not wandb's 90."""
    timeout = init_timeout()
    log.info("waiting for W&B to start the run online (up to %.0f s, %s)", timeout, INIT_TIMEOUT_ENV)
    try:
        with _wandb_errors_in_log_only():
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=timeout), **run)
    except Exception as err:
        offline = wandb.init(mode="offline", **run)
        log.warning("W&B did not start online (%s); logging offline instead, upload later with: wandb sync %s",
                    _first_line(err), shlex.quote(shown(offline.settings.sync_dir)))
        return offline


@contextmanager
def _wandb_errors_in_log_only():
    """W&B's own report of a failed start (an error record with a traceback) goes to train.log only:
    the run says in one line what it does instead. A streamed console (``logger.verbose``) keeps it."""
    handlers = [h for h in logging.getLogger("wandb").handlers if not isinstance(h, logging.FileHandler)]
    for handler in handlers:
        handler.addFilter(_drop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_drop)


def _drop(record: logging.LogRecord) -> bool:
    return False


def _first_line(err: BaseException) -> str:
    """wandb's errors run to several lines of advice; the first says what failed."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def init_timeout() -> float:
    """Seconds an online start waits for W&B: ``WANDB_INIT_TIMEOUT`` where set, else ``INIT_TIMEOUT_S``."""
    value = os.environ.get(INIT_TIMEOUT_ENV, "").strip()
    try:
        seconds = float(value) if value else INIT_TIMEOUT_S
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigError(f"{INIT_TIMEOUT_ENV}={value}: must be a number of seconds > 0 (how long "
                          "logger.wandb.mode=online waits for W&B before it logs offline)")
    return seconds


def check_wandb_login(cfg: WandbConfig) -> None:
    """``logger.wandb.mode=online`` with no API key where wandb looks for one is refused before
    anything starts: wandb.init would prompt for one, or fail once Ray is up, with nothing written
    for a later ``wandb sync``. ConfigError naming the two ways out."""
    if cfg.mode is not WandbMode.online:
        return
    init_timeout()  # a WANDB_INIT_TIMEOUT that is not a number is refused here too
    from wandb.errors import AuthenticationError

    try:
        found = _wandb_credentials()
    except AuthenticationError as err:  # a key that cannot be one (too short), or two sources of one
        raise ConfigError(f"logger.wandb.mode=online: {_first_line(err).rstrip('.')}; fix it, or set "
                          "logger.wandb.mode=offline and upload later with `wandb sync`") from None
    if not found:
        raise ConfigError("logger.wandb.mode=online: no W&B API key found (WANDB_API_KEY, or the netrc file "
                          "that `wandb login` writes); log in with `wandb login` (or set WANDB_API_KEY), or "
                          "set logger.wandb.mode=offline and upload later with `wandb sync`")


def _wandb_credentials() -> bool:
    """Whether wandb.init would find credentials, asked as it asks (the environment, the netrc file,
    wandb's settings files), without the network and without a prompt."""
    os.environ.setdefault("WANDB_SILENT", "true")  # as start_wandb, before wandb reads its settings
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth

        host = wbauth.HostUrl(wandb_setup.singleton().settings.base_url)
    except Exception as err:  # another wandb version, or settings it rejects: its own start decides
        log.debug("W&B credentials not checked (%s)", err)
        return True
    return wbauth.authenticate_session(host=host, source="rlmix", prompt=False, update_session=False) is not None
