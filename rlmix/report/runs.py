"""Find and load run directories: a single run, a Hydra multirun, or a folder of either.

A run directory is any directory holding ``metrics.jsonl`` (docs/architecture.md, "Run directory"). Its
``.hydra/config.yaml`` gives the arm (``name``) and ``seed``; ``.hydra/overrides.yaml`` the command-line
overrides; ``summary.json`` (absent while a run is still going) the final verdict, wall time and how the
run ended (``status``, rlmix/orchestration/outcome.py).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rlmix.config.monitor import LastingRule
from rlmix.errors import ConfigError
from rlmix.metrics.jsonl import METRICS_FILE, read_metrics
from rlmix.metrics.lasting import lasting_series
from rlmix.metrics.names import FORMAT_KEY, REWARD_KEY
from rlmix.metrics.status import Status
from rlmix.report.sweep import swept_keys

# Overrides that do not make a different arm: the seed varies within an arm, and a name override is
# what ``name`` says (an experiment's too, unless a name given beside it hides it: ``_variant``).
# ``hydra.*`` only moves output directories, and ``resume=`` names the run's own directory (a resumed
# run records it among its overrides).
_NOT_AN_ARM = ("seed=", "+seed=", "name=", "+name=", "hydra.", "+hydra.", "resume=")
_EXPERIMENT = "experiment="

# No summary.json: the run is still going, or its process was killed (SIGKILL, out of memory, the machine
# went down) before it could write one. Nothing in the run directory tells the two apart.
NO_SUMMARY = "running or killed"
# A summary.json without ``status``: written before runs recorded how they ended.
NO_STATUS = "no status"
# A run that ended on its own: every step ran, or the monitor stopped it (the collapse is the outcome).
# Only these compare with each other; an interrupted or failed run's last step is not its result.
FINISHED = (Status.completed.value, Status.collapsed.value)


@dataclass(frozen=True)
class RunRecord:
    """One run as read from disk. ``metrics`` keeps ``metrics.jsonl``'s rows in file order."""

    path: Path
    label: str  # the run's path relative to the directory that was collected ("." for a single run)
    arm: str  # ``name`` from the config, plus the overrides that set this run apart from the others
    seed: int | None
    overrides: tuple[str, ...]
    metrics: tuple[Mapping[str, Any], ...]
    summary: Mapping[str, Any] | None
    lasting: LastingRule = field(default_factory=LastingRule)  # the run's own ``monitor.lasting``
    planned_steps: int | None = None  # ``loop.steps`` of its ``.hydra/config.yaml``

    @property
    def status(self) -> str:
        """How the run ended: ``summary.json``'s ``status``, else ``NO_SUMMARY`` (or ``NO_STATUS``)."""
        if self.summary is None:
            return NO_SUMMARY
        status = self.summary.get("status")
        return status if isinstance(status, str) and status else NO_STATUS

    @property
    def finished(self) -> bool:
        """Whether its numbers compare with other runs' (``FINISHED``). An old summary without a status
        counts when the run logged every planned step."""
        if self.status == NO_STATUS:
            return self.planned_steps is not None and len(self.metrics) >= self.planned_steps
        return self.status in FINISHED

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric over the rows that have a finite number for it."""
        steps, values = [], []
        for row in self.metrics:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(int(row["step"]))
                values.append(float(value))
        return steps, values

    @property
    def judged(self) -> bool:
        """False where ``summary.json`` says the monitor never armed (``collapse.judged``: the run ended before
        ``monitor.warmup_steps + monitor.baseline_steps``); a run without one, or from before the field, True."""
        collapse = (self.summary or {}).get("collapse")
        return not (isinstance(collapse, dict) and collapse.get("judged") is False)

    def collapse(self) -> tuple[bool, int | None, str]:
        """(verdict, step, reason) by the lasting rule (``rlmix.metrics.lasting``, as the monitor's own
        end-of-run verdict and scripts/reproduce.py): flagged and still down over the last steps.

        Flagged: ``summary.json``'s ``collapse`` verdict or episodes, else a ``metrics.jsonl`` row with
        ``monitor/collapse`` or ``monitor/episode`` = 1 (a run still going, or killed). Judging the rows
        again also reads run directories written before the verdict was the lasting one."""
        flagged, step, reason = self._flag()
        _, rewards = self.series(REWARD_KEY)
        _, formats = self.series(FORMAT_KEY)
        if not lasting_series(flagged, rewards, formats, self.lasting):
            return False, None, ""
        return True, step, reason

    def _flag(self) -> tuple[bool, int | None, str]:
        c = self.summary.get("collapse") if self.summary is not None else None
        if isinstance(c, dict):
            episodes = [e for e in c.get("episodes") or [] if isinstance(e, dict)]
            if c.get("verdict"):
                step = c.get("step")
                return True, step if isinstance(step, int) else None, str(c.get("reason") or "")
            if episodes:
                step = episodes[-1].get("start")
                return True, step if isinstance(step, int) else None, str(episodes[-1].get("reason") or "")
            return False, None, ""
        for row in self.metrics:
            if row.get("monitor/collapse") or row.get("monitor/episode"):
                return True, int(row["step"]), str(row.get("monitor/reason") or "")
        return False, None, ""


def collect_runs(path: str | Path) -> list[RunRecord]:
    """All run directories at or below ``path``, in natural path order (job 2 before job 10)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"report: {root} is not a directory (give a run or multirun directory)")
    run_dirs = sorted(find_run_dirs(root), key=_natural_key)
    if not run_dirs:
        raise ConfigError(f"report: no run directories (with metrics.jsonl) under {root}")
    runs = [_load_run(d, root) for d in run_dirs]
    return _label_arms(runs, swept_keys(root))


def find_run_dirs(root: Path) -> list[Path]:
    """Directories at or below ``root`` holding ``metrics.jsonl``. The walk does not go into a run
    directory (its checkpoints and W&B files hold no runs), nor into hidden directories (``.git``,
    a virtual environment), nor through symbolic links."""
    found = []
    for here, dirs, files in os.walk(root):
        if METRICS_FILE in files:
            found.append(Path(here))
            dirs.clear()
        else:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
    return found


def _natural_key(path: Path) -> list[tuple[int, int | str]]:
    return [(0, int(tok)) if tok.isdigit() else (1, tok) for tok in re.split(r"(\d+)", path.as_posix()) if tok]


def _load_run(run_dir: Path, root: Path) -> RunRecord:
    config = _read_yaml(run_dir / ".hydra" / "config.yaml")
    overrides = _read_yaml(run_dir / ".hydra" / "overrides.yaml")
    if not isinstance(config, dict):
        config = {}
    seed = config.get("seed")
    loop = config.get("loop")
    planned = loop.get("steps") if isinstance(loop, dict) else None
    summary_path = run_dir / "summary.json"
    return RunRecord(
        path=run_dir,
        label=run_dir.relative_to(root).as_posix() if run_dir != root else run_dir.name,  # not "."
        arm=str(config.get("name", run_dir.name)),
        seed=seed if isinstance(seed, int) else None,
        overrides=tuple(str(o) for o in overrides) if isinstance(overrides, list) else (),
        metrics=tuple(read_metrics(run_dir / METRICS_FILE)),
        summary=_read_json(summary_path) if summary_path.is_file() else None,
        lasting=_lasting_rule(config),
        planned_steps=planned if isinstance(planned, int) and not isinstance(planned, bool) else None,
    )


def _lasting_rule(config: Mapping[str, Any]) -> LastingRule:
    """The run's ``monitor.lasting`` (the default where its config has none, or an unreadable one)."""
    monitor = config.get("monitor")
    given = monitor.get("lasting") if isinstance(monitor, dict) else None
    if not isinstance(given, dict):
        return LastingRule()
    default = LastingRule()
    window, errors = given.get("window", default.window), given.get("format_errors", default.format_errors)
    if isinstance(window, int) and window >= 1 and isinstance(errors, (int, float)):
        return LastingRule(window=window, format_errors=float(errors))
    return default


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"report: {path} is not valid YAML ({exc.__class__.__name__})") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ConfigError(f"report: {path} is not valid JSON ({exc.msg}: {where})") from None


def _label_arms(runs: Sequence[RunRecord], swept: frozenset[str] = frozenset()) -> list[RunRecord]:
    """Append to each ``name`` the overrides that not every run shares (e.g. ``trainer.lr=3e-5``), so
    a sweep over something other than the experiment does not pool different settings as seeds. A key a
    sweep here varied (``swept``: its ``multirun.yaml``) stays in the label even where only one of its
    values has run so far, so a sweep's runs keep their arm from its first job to its last."""
    variants = [_variant(run) for run in runs]
    shared = set.intersection(*(set(v) for v in variants))
    labelled = []
    for run, variant in zip(runs, variants):
        extra = " ".join(o for o in variant if o not in shared or o.split("=", 1)[0].lstrip("+~") in swept)
        labelled.append(replace(run, arm=f"{run.arm} {extra}") if extra else run)
    return labelled


def _variant(run: RunRecord) -> tuple[str, ...]:
    """A run's overrides that may set it apart from others (``_NOT_AN_ARM`` left out), as ``key=value``. Its
    experiment only where the run's name is not the experiment's own (``name=cmp`` beside
    ``+experiment=grpo,sc_mis``: the experiment is then what tells the arms apart)."""
    found = []
    for override in run.overrides:
        bare = override.lstrip("+~")
        if override.startswith(_NOT_AN_ARM) or bare == f"{_EXPERIMENT}{run.arm}":
            continue
        found.append(bare if bare.startswith(_EXPERIMENT) else override)
    return tuple(found)
