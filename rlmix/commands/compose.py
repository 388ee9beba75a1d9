"""Composing ``train.yaml`` into a validated ``RunConfig``: shared by every command.

Before ``rlmix train`` hands over to Hydra, a preflight composes and validates EVERY job of the requested run or sweep
with the Compose API, so a typo in the fifth job of a sweep fails in a second with one line —
not after four runs, and not with a traceback or a half-written run directory. The same preflight
checks that a local run's GPU pools fit the GPUs of this machine (rlmix/orchestration/hardware.py).
"""

from __future__ import annotations

from rlmix.errors import ConfigError

CONFIG_MODULE = "rlmix.conf"
CONFIG_NAME = "train"
# Hydra flags that print or inspect instead of running: Hydra handles those itself.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}
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
    """One override list per job, as Hydra's basic sweeper would run them."""
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


def compose_run_config(overrides: list[str], for_training: bool = True):
    """Compose ``train.yaml`` with ``overrides`` into a validated ``RunConfig`` (ConfigError on bad input)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    import rlmix.samplers.checks  # noqa: F401 - registers each backend's pool rules with validation
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
    from rlmix.orchestration.hardware import check_machine

    for job in jobs:
        check_machine(compose_run_config(job))  # GPUs asked for exist here, before Ray or a run dir
