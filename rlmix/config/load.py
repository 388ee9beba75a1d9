"""Config becomes a typed object once, here: ``to_run_config`` turns Hydra's composed
``DictConfig`` into a ``RunConfig`` (the dataclasses of ``rlmix.config``), and ``one_line`` turns any
composition error into the single line the CLI prints.

Whether a config can run is asked above, by ``rlmix.assembly.plan.plan_run``: its own cross-field
rules (``rlmix.assembly.rules``), then what only a backend or a task can answer.
"""

from __future__ import annotations

import re

from omegaconf import DictConfig, OmegaConf

from rlmix.config.schema import PoolConfig, RunConfig
from rlmix.errors import ConfigError


# A pool's settings that belong to its own weight format: a fleet-wide precision resets them.
FORMAT_KNOBS = ("kv_precision", "fp8_scales", "linear_inputs", "fp8_attention")


def to_run_config(cfg: DictConfig) -> RunConfig:
    try:
        run = OmegaConf.to_object(cfg)
    except Exception as err:  # MISSING values and the like surface here
        raise ConfigError(one_line(err)) from None
    if isinstance(run, RunConfig) and run.fleet.precision is not None:
        default = PoolConfig()
        for pool in run.fleet.pools.values():  # the fleet-wide format replaces each pool's, and its knobs
            pool.precision = run.fleet.precision
            for knob in FORMAT_KNOBS:
                setattr(pool, knob, getattr(default, knob))
    return run



def one_line(err: BaseException) -> str:
    """A composition/validation error as one line: the key at fault and what is allowed."""
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    causes = [err]
    while causes[-1].__cause__ is not None:
        causes.append(causes[-1].__cause__)
    for cause in reversed(causes):
        if isinstance(cause, MissingMandatoryValue) and getattr(cause, "full_key", None):
            return f"{cause.full_key}: not set, and it has no default; give {cause.full_key}=..."
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            msg = str(cause).splitlines()[0].strip()
            return f"{cause.full_key}: {msg}"
    text = str(err)
    if "Available options in" in text:
        return unknown_option(text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(err).__name__


def unknown_option(text: str) -> str:
    """Hydra's "Could not find 'fleet/nope'" as the user typed it, with the group's options.

    Hydra appends its config search path (providers, ``pkg://`` URLs) and lists the schema
    nodes registered for validation; neither is something a user can pick, so both go.
    """
    import difflib

    missing = re.search(r"Could not find '([^']+)'", text)
    group, _, value = (missing.group(1) if missing else "").rpartition("/")
    block = text.split("Available options in", 1)[1].split("Config search path", 1)[0]
    options = [ln.strip() for ln in block.splitlines()[1:] if ln.startswith("\t") and not ln.strip().endswith("_schema")]
    if not missing:
        return f"unknown config option; available: {', '.join(options)}"
    close = difflib.get_close_matches(value, options, n=1)
    hint = f" (did you mean {group}={close[0]}?)" if close else ""
    return f"{group}={value}: no such option{hint}; available: {', '.join(options)}"
