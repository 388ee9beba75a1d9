"""``rlmix train``: one run from a validated config to a finished run directory."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from rlmix.config.schema import RunConfig
from rlmix.metrics.logger import RunLogger
from rlmix.assembly.fleet import SamplerSpec, fleet_manifest, resolve_fleet
from rlmix.assembly.parts import CHECKPOINTS, latest_checkpoint, package_versions, resolve_model_dir

log = logging.getLogger(__name__)

TRAINER_RESOURCE = "rlmix_trainer"
# Worker processes: no tokenizer thread pools, no per-load progress bars in the run's console.
QUIET_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}


def start_ray(cfg: RunConfig, specs: list[SamplerSpec]) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if cfg.cluster.address is not None:
        ray.init(address=cfg.cluster.address, runtime_env={"env_vars": QUIET_ENV})
        return
    # Emulated accelerator types are declared as Ray's own accelerator_type resources, so the
    # same placement code runs unchanged on a real heterogeneous cluster.
    resources = {spec.resource: 1.0 for spec in specs} | {TRAINER_RESOURCE: 1.0}
    ray.init(
        num_cpus=cfg.cluster.num_cpus or os.cpu_count(),
        resources=resources,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
        runtime_env={"env_vars": QUIET_ENV},
    )


def start_actors(cfg: RunConfig, specs: list[SamplerSpec], model_dir: Path):
    import ray

    from rlmix.orchestration.loop import SamplerSlot
    from rlmix.orchestration.workers import SamplerWorker, TrainerWorker, derive_seed

    trainer = (
        ray.remote(TrainerWorker)
        .options(num_cpus=0, resources={TRAINER_RESOURCE: 1.0} if cfg.cluster.address is None else {})
        .remote(str(model_dir), cfg.trainer, cfg.correction, cfg.seed)
    )
    slots = []
    for spec in specs:
        actor = (
            ray.remote(SamplerWorker)
            .options(num_cpus=0, num_gpus=spec.gpus, resources={spec.resource: 0.001}, max_restarts=3)
            .remote(spec, str(model_dir), cfg.task, derive_seed(cfg.seed, spec.name), cfg.loop.sampler_threads)
        )
        slots.append(SamplerSlot(name=spec.name, pool=spec.pool, actor=actor))
    return trainer, slots


def train(cfg: RunConfig, run_dir: Path, sweep_group: str | None = None) -> dict:
    """Run ``cfg`` to completion in ``run_dir``; returns the summary written to summary.json."""
    import ray

    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.metrics.monitor import CollapseMonitor
    from rlmix.orchestration.loop import AsyncLoop
    from rlmix.orchestration.workers import make_task

    run_dir = Path(run_dir)
    model_dir = resolve_model_dir(cfg)
    tokenizer = load_fast_tokenizer(model_dir)
    specs = resolve_fleet(cfg, tokenizer.eos_token_id)
    manifest = fleet_manifest(specs)
    for pool, entry in manifest.items():
        log.info("pool %s: %d x %s", pool, entry["count"], entry["label"])
    start_ray(cfg, specs)
    try:
        trainer, slots = start_actors(cfg, specs, model_dir)
        # Every process up before the clock starts: an engine that takes 20 s to start would
        # otherwise sit out the first steps of a short run.
        ray.get([slot.actor.version.remote() for slot in slots] + [trainer.version.remote()])
        monitor = CollapseMonitor(cfg.monitor)
        start_version, run_dir = resume(cfg, trainer, monitor, run_dir)
        logger = RunLogger(
            run_dir, cfg.logger.wandb, cfg.name, config_dict(cfg), sweep_group, cfg.loop.steps, cfg.logger.console_every
        )
        loop = AsyncLoop(
            cfg.loop, trainer, slots, make_task(cfg.task, cfg.seed), cfg.seed, tokenizer.pad_token_id,
            start_version=start_version,
            start_request=start_version * cfg.loop.groups_per_step // cfg.loop.groups_per_request,
        )
        steps = StepHandler(cfg, trainer, monitor, logger, run_dir)
        loop.run(cfg.loop.steps, steps)
        steps.checkpoint(loop.version)
        summary = {
            "name": cfg.name,
            "seed": cfg.seed,
            "steps": loop.version,
            "final": steps.last,
            "collapse": monitor.verdict.as_summary(),
            "fleet": manifest,
            "model_dir": str(model_dir),
            "versions": package_versions(),
        }
        logger.finish(summary)
        return summary
    finally:
        ray.shutdown()  # a sweep's next job starts from a clean slate


class StepHandler:
    """After each trainer step: collapse monitor, logging, periodic checkpoints, the stop decision."""

    def __init__(self, cfg: RunConfig, trainer, monitor, logger: RunLogger, run_dir: Path):
        self.cfg, self.trainer, self.monitor, self.logger, self.run_dir = cfg, trainer, monitor, logger, run_dir
        self.last: dict[str, float | str] = {}

    def __call__(self, report) -> bool:
        from rlmix.config.monitor import MonitorAction

        verdict = self.monitor.update(report.step, report.metrics)
        self.last = report.metrics | verdict.as_metrics()
        self.logger.log(report.step, self.last)
        every = self.cfg.loop.checkpoint_every
        if every and report.step % every == 0 and report.step < self.cfg.loop.steps:
            self.checkpoint(report.step)
        return not (verdict.collapse and self.cfg.monitor.action is MonitorAction.stop)

    def checkpoint(self, step: int) -> None:
        import ray

        ray.get(self.trainer.save_checkpoint.remote(str(self.run_dir / CHECKPOINTS / f"step_{step}")))


def resume(cfg: RunConfig, trainer, monitor, run_dir: Path) -> tuple[int, Path]:
    """(start version, run dir): a resumed run continues in its own directory from its last checkpoint."""
    import ray

    checkpoint = latest_checkpoint(Path(cfg.resume)) if cfg.resume else None
    if checkpoint is None:
        return 0, run_dir
    version = ray.get(trainer.load_checkpoint.remote(str(checkpoint)))
    run_dir = Path(cfg.resume)
    replay_history(run_dir, version, monitor)
    print(f"resuming {run_dir} from {checkpoint.name} at step {version}")
    return version, run_dir


def replay_history(run_dir: Path, step: int, monitor) -> None:
    """Keep the metrics up to the checkpoint's step and feed them to the collapse monitor again.

    Steps after the last checkpoint are re-run, so their rows are dropped, not duplicated.
    """
    from rlmix.metrics.logger import METRICS_FILE
    from rlmix.metrics.jsonl import read_metrics

    path = run_dir / METRICS_FILE
    rows = [row for row in read_metrics(path) if row["step"] <= step] if path.exists() else []
    for row in rows:
        monitor.update(row["step"], {k: v for k, v in row.items() if isinstance(v, (int, float))})
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)


def config_dict(cfg: RunConfig) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
