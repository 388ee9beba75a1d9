"""``rlmix train`` is real Hydra: ``@hydra.main`` behind the Typer command, arguments passed through.

Every job of the run or sweep is composed and validated first (``compose.preflight``); then Hydra
runs each job, which assembles the parts and calls ``rlmix.orchestration.runner.train``, then
prints the block that ends the run (and, after a sweep's last job, one line per job).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rlmix.commands.compose import CONFIG_MODULE, CONFIG_NAME, preflight
from rlmix.commands.naming import job_label, register_resolver, sweep_name
from rlmix.errors import ConfigError


_finished: list[tuple[str, dict, Path]] = []  # (label, summary, run dir) of each job of this command
_sweep_dir: list[Path] = []  # the multirun directory, once a sweep's first job has run


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _hydra_train(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    import rlmix.samplers.checks  # noqa: F401 - registers each backend's pool rules with validation
    import rlmix.tasks.checks  # noqa: F401 - registers each task's own rules with validation
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
    from rlmix.assembly.parts import latest_checkpoint
    from rlmix.metrics.console import run_block

    # A resumed run continues in its own directory; Hydra's directory holds this attempt's logs.
    resumed = cfg.resume is not None and latest_checkpoint(Path(cfg.resume)) is not None
    run_dir = Path(cfg.resume) if resumed else output_dir
    checkpoint = latest_checkpoint(run_dir)
    print(run_block(summary, run_dir, checkpoint, cfg.loop.steps, overrides, log_dir=output_dir), flush=True)
    return label, summary, run_dir


def run_train(args: list[str]) -> None:
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
