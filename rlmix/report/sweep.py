"""The jobs of a Hydra sweep that left no run to report: never run, or stopped before their first step.

Hydra writes ``multirun.yaml`` into the sweep directory before the first job runs. Its
``hydra.overrides.task`` (with ``hydra.sweeper.params``) is the sweep as asked for, so expanding it as
Hydra's basic sweeper does gives every job, numbered in launch order; job ``n`` runs in ``<n>_<label>``
(rlmix's ``hydra.sweep.subdir``) or ``<n>`` (Hydra's). A sweep stopped part-way (Ctrl-C, a killed
driver, a job refused) has no directory for its later jobs: counting directories alone would report a
smaller sweep than the one that was run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlmix.metrics.jsonl import METRICS_FILE

MULTIRUN_FILE = "multirun.yaml"
NOT_RUN = "not run"  # no directory: the sweep stopped before it
NO_METRICS = "no steps logged"  # a directory without metrics.jsonl: stopped (or still starting) before step 1
_JOB_DIR = re.compile(r"(\d+)(?:_|$)")
_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass(frozen=True)
class SweepJob:
    """A job of a sweep with no ``metrics.jsonl`` to read."""

    label: str  # its directory relative to the collected one (the one it would have had, for NOT_RUN)
    state: str  # NOT_RUN or NO_METRICS
    seed: int | None
    overrides: tuple[str, ...]  # the job's own values of the swept keys


@dataclass(frozen=True)
class SweepCheck:
    jobs: int  # jobs the sweeps under the collected directory asked for (0: no multirun.yaml there)
    missing: tuple[SweepJob, ...]
    notes: tuple[str, ...]  # sweeps whose jobs could not be told: the page says so


def check_sweeps(root: Path) -> SweepCheck:
    """Every ``multirun.yaml`` at or below ``root`` (``_sweep_dirs``)."""
    jobs, missing, notes = 0, [], []
    for sweep in _sweep_dirs(root):
        try:
            planned = _planned_jobs(sweep / MULTIRUN_FILE)
        except Exception as exc:  # any sweep syntax this cannot expand: said on the page, not guessed
            where = (sweep / MULTIRUN_FILE).relative_to(root).as_posix()
            notes.append(f"{where}: the sweep's jobs not checked for runs missing here ({_one_line(exc)})")
            continue
        jobs += len(planned[0])
        missing += _missing(sweep, root, *planned)
    return SweepCheck(jobs, tuple(missing), tuple(notes))


def swept_keys(root: Path) -> frozenset[str]:
    """The keys the sweeps at or below ``root`` vary (their ``multirun.yaml``; one that cannot be read adds
    none: ``check_sweeps`` says so on the page)."""
    keys: set[str] = set()
    for sweep in _sweep_dirs(root):
        try:
            keys.update(_planned_jobs(sweep / MULTIRUN_FILE)[1])
        except Exception:  # any sweep syntax this cannot expand
            continue
    return frozenset(keys)


def _sweep_dirs(root: Path):
    """The directories at or below ``root`` holding a ``multirun.yaml`` (not inside run directories or hidden ones)."""
    for here, dirs, files in os.walk(root):
        if METRICS_FILE in files:
            dirs.clear()
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if MULTIRUN_FILE in files:
            yield Path(here)


def _planned_jobs(path: Path) -> tuple[list[list[str]], tuple[str, ...], bool]:
    """(each job's overrides, the swept keys, whether job directories are named ``<n>_<swept values>``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra = _get(yaml.safe_load(path.read_text()), "hydra")
    sweeper = _get(hydra, "sweeper")
    if sweeper.get("_target_", _BASIC_SWEEPER) != _BASIC_SWEEPER:
        raise ValueError(f"sweeper {sweeper.get('_target_')}, not Hydra's basic one")
    subdir = str(_get(hydra, "sweep").get("subdir", ""))
    if not subdir.startswith("${hydra.job.num}"):
        raise ValueError(f"hydra.sweep.subdir {subdir!r} does not start with the job number")
    task = _get(hydra, "overrides").get("task") or []
    params = sweeper.get("params") or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(task))
    swept = tuple(_key(o.input_line) for o in parsed if o.is_sweep_override())
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for job in batch]
    return jobs, swept, "rlmix_job_label" in subdir


def _missing(sweep: Path, root: Path, jobs: list[list[str]], swept: tuple[str, ...], labelled: bool) -> list[SweepJob]:
    present: dict[int, Path] = {}
    for child in sweep.iterdir():
        match = _JOB_DIR.match(child.name)
        if match and child.is_dir():
            present.setdefault(int(match.group(1)), child)
    out = []
    for num, job in enumerate(jobs):
        own = tuple(o.lstrip("+~") for o in job if _key(o) in swept)
        seeds = [o.split("=", 1)[1] for o in job if _key(o) == "seed"]
        seed = int(seeds[-1]) if seeds and seeds[-1].lstrip("-").isdigit() else None
        found = present.get(num)
        if found is None:
            name = f"{num}_{','.join(own).replace('/', '_')}" if labelled and own else str(num)
            out.append(SweepJob(f"{_rel(sweep, root)}/{name}".removeprefix("./"), NOT_RUN, seed, own))
        elif not (found / METRICS_FILE).is_file():
            out.append(SweepJob(_rel(found, root), NO_METRICS, seed, own))
    return out


def _get(mapping: Any, key: str) -> dict:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if not isinstance(value, dict):
        raise ValueError(f"no '{key}' mapping")
    return value


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or exc.__class__.__name__
