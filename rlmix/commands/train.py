"""``rlmix train`` is real Hydra: ``@hydra.main`` behind the Typer command, arguments passed through.

Every job of the run or sweep is composed and validated first (``compose.preflight``); then Hydra
runs each job, which assembles the parts and calls ``rlmix.orchestration.runner.train``.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from rlmix.commands.compose import CONFIG_MODULE, CONFIG_NAME, preflight
from rlmix.errors import ConfigError


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _hydra_train(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    import rlmix.samplers.checks  # noqa: F401 - registers each backend's pool rules with validation
    from rlmix.config.load import to_run_config, validate
    from rlmix.orchestration.runner import train

    hc = HydraConfig.get()
    group = hc.sweep.dir if hc.mode is RunMode.MULTIRUN else None
    try:
        train(validate(to_run_config(cfg)), run_dir=hc.runtime.output_dir, sweep_group=group)
    except ConfigError as err:  # e.g. a model path that is not a model: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def run_train(args: list[str]) -> None:
    from rlmix.config.schema import register_configs

    register_configs()
    preflight(args)
    from rlmix.orchestration.session import SESSION

    sys.argv = ["rlmix train", *args]
    try:
        _hydra_train()
    finally:
        SESSION.close()  # a sweep kept Ray and its processes warm between jobs
