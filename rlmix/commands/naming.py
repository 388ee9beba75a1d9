"""Names that say what differs: sweep job directories, W&B run names and groups.

In a sweep every job shares the preset's ``name``; what tells the jobs apart is the overrides
that were swept (``correction.mode=mis,sc_mis`` → ``correction.mode=mis`` and
``correction.mode=sc_mis``). ``rlmix train`` records the swept keys before Hydra starts
(``set_swept_keys``); ``conf/train.yaml`` names each job directory with the
``rlmix_job_label`` resolver, and the runner names the job's W&B run with the same label. A launcher
that runs the jobs in worker processes (``hydra/launcher=joblib``) resolves the job directory there:
the keys reach those processes in the environment they inherit (``SWEPT_ENV``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

RESOLVER = "rlmix_job_label"
SWEPT_ENV = "RLMIX_SWEPT_KEYS"  # the swept keys, comma-separated (no key holds a comma)
_swept: tuple[str, ...] = ()
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def override_key(override: str) -> str:
    """``+experiment=smoke`` → ``experiment``: the key without Hydra's add/delete prefixes."""
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(overrides: Iterable) -> tuple[str, ...]:
    """The keys of the parsed Hydra overrides that take several values (``a=x,y``, ``range``, ...)."""
    return tuple(override_key(o.input_line) for o in overrides if o.is_sweep_override())


def set_swept_keys(keys: Iterable[str]) -> None:
    """Record the swept keys here, and in the environment for the worker processes a launcher starts after."""
    global _swept
    _swept = tuple(keys)
    os.environ[SWEPT_ENV] = ",".join(_swept)


def _swept_keys() -> tuple[str, ...]:
    """The keys ``rlmix train`` recorded: in this process, or in the one that started this worker."""
    return _swept or tuple(key for key in os.environ.get(SWEPT_ENV, "").split(",") if key)


def job_label(task_overrides: Iterable[str], name: str, seed: int) -> str:
    """``correction.mode=sc_mis,seed=1`` for a sweep job; ``<name>_s<seed>`` when nothing is swept.

    Path separators in values (``model.path=/a/b``) become ``_`` so the label stays one directory.
    """
    swept = [o.lstrip("+~") for o in task_overrides if override_key(o) in _swept_keys()]
    if not swept:
        return f"{name}_s{seed}"
    return ",".join(swept).replace("/", "_")


def sweep_name(sweep_dir: str | Path) -> str:
    """The W&B group of a sweep: ``2026-12-03_07-14-05_smoke`` for ``multirun/2026-12-03/07-14-05_smoke``."""
    path = Path(sweep_dir)
    return f"{path.parent.name}_{path.name}" if _DATE.fullmatch(path.parent.name) else path.name


def register_resolver() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(
        RESOLVER, lambda overrides, name, seed: job_label(list(overrides), name, seed), replace=True
    )
