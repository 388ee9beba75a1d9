"""``rlmix train`` is real Hydra: ``@hydra.main`` behind the Typer command, arguments passed through.

Before Hydra starts, a preflight composes and validates EVERY job of the requested run or sweep
with the Compose API, so a typo in the fifth job of a sweep fails in a second with one line —
not after four runs, and not with a traceback or a half-written run directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rlmix.config.naming import job_label, sweep_name
from rlmix.errors import ConfigError

CONFIG_MODULE = "rlmix.conf"
CONFIG_NAME = "train"
# Hydra flags that print or inspect instead of running: Hydra handles those itself.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}
_finished: list[tuple[str, dict, Path]] = []  # (label, summary, run dir) of each job of this command
_sweep_dir: list[Path] = []  # the multirun directory, once a sweep's first job has run
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}


def split_args(args: list[str]) -> tuple[list[str], bool, bool]:
    """(overrides, multirun, informational) from a Hydra command line."""
    overrides, multirun, info, skip = [], False, False, False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg.startswith("-"):
            info |= arg.split("=")[0] in _INFO_FLAGS
            skip = arg in _FLAGS_WITH_VALUE
        else:
            overrides.append(arg)
    return overrides, multirun, info


def expand_jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """One override list per job, as Hydra's basic sweeper would run them.

    Records the swept keys on the way: they name the jobs' directories and W&B runs.
    """
    from rlmix.config.naming import set_swept_keys, swept_keys

    set_swept_keys(())
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    set_swept_keys(swept_keys(parsed))
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


def compose_run_config(overrides: list[str], for_training: bool = True):
    """Compose ``train.yaml`` with ``overrides`` into a validated ``RunConfig`` (ConfigError on bad input)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from rlmix.config.load import one_line, to_run_config, validate
    from rlmix.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose(config_name=CONFIG_NAME, overrides=overrides)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(one_line(err)) from None
    finally:
        GlobalHydra.instance().clear()
    return validate(to_run_config(cfg), for_training=for_training)


def preflight(args: list[str]) -> None:
    overrides, multirun, info = split_args(args)
    if info:
        return
    try:
        jobs = expand_jobs(overrides, multirun)
    except Exception as err:
        from rlmix.config.load import one_line

        raise ConfigError(one_line(err)) from None
    for job in jobs:
        compose_run_config(job)


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _hydra_train(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlmix.config.load import to_run_config, validate
    from rlmix.orchestration.runner import train

    hc = HydraConfig.get()
    run_cfg = validate(to_run_config(cfg))
    overrides = list(hc.overrides.task)
    sweep = hc.mode is RunMode.MULTIRUN
    label = job_label(overrides, run_cfg.name, run_cfg.seed) if sweep else run_cfg.name
    try:
        summary = train(run_cfg, run_dir=hc.runtime.output_dir, label=label,
                        sweep_group=sweep_name(hc.sweep.dir) if sweep else None)
    except ConfigError as err:  # e.g. a model path that is not a model: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    _finished.append(end_of_run(run_cfg, summary, overrides, Path(hc.runtime.output_dir), label))
    _sweep_dir[:] = [Path(hc.sweep.dir)] if sweep else []


def end_of_run(cfg, summary: dict, overrides: list[str], output_dir: Path, label: str) -> tuple[str, dict, Path]:
    """Print the run's closing block; (label, summary, run dir) for the sweep's block."""
    from rlmix.metrics.console import run_block
    from rlmix.orchestration.runner import latest_checkpoint

    # A resumed run continues in its own directory; Hydra's directory holds this attempt's logs.
    resumed = cfg.resume is not None and latest_checkpoint(Path(cfg.resume)) is not None
    run_dir = Path(cfg.resume) if resumed else output_dir
    checkpoint = latest_checkpoint(run_dir)
    print(run_block(summary, run_dir, checkpoint, cfg.loop.steps, overrides, log_dir=output_dir), flush=True)
    return label, summary, run_dir


def run_train(args: list[str]) -> None:
    from rlmix.config.naming import register_resolver
    from rlmix.config.schema import register_configs
    from rlmix.metrics.console import sweep_block

    register_configs()
    register_resolver()
    preflight(args)
    sys.argv = ["rlmix train", *args]
    _finished.clear()
    _sweep_dir.clear()
    _hydra_train()
    if _sweep_dir and _finished:
        print(sweep_block(_finished, _sweep_dir[0]), flush=True)
