"""``rlmix train``: one run from a validated config to a finished run directory."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from rlmix.config.schema import RunConfig
from rlmix.metrics.logger import RunLogger
from rlmix.assembly.fleet import SamplerSpec, fleet_manifest, resolve_fleet
from rlmix.assembly.parts import CHECKPOINTS, latest_checkpoint, package_versions, resolve_model_dir
from rlmix.orchestration.cores import CorePlan, plan_cores
from rlmix.orchestration.session import SESSION, TRAINER_RESOURCE, ActorRequest

log = logging.getLogger(__name__)

def start_ray(cfg: RunConfig, specs: list[SamplerSpec]) -> None:
    """Start or join Ray; the running instance of a sweep's previous job is kept where it fits."""
    resources = {spec.resource for spec in specs} | {TRAINER_RESOURCE}
    SESSION.ensure_ray(cfg.cluster.address, cfg.cluster.num_cpus, {name: 1.0 for name in resources})


def core_plan(cfg: RunConfig, specs: list[SamplerSpec]) -> CorePlan:
    """Threads per process from the cores Ray reports (rlmix.orchestration.cores)."""
    import ray

    cpu_samplers = sum(1 for spec in specs if spec.gpus == 0)
    cpus = ray.cluster_resources().get("CPU", 1.0)
    node_cpus = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]), default=cpus)
    return plan_cores(cpus, cpu_samplers, cfg.trainer.num_threads, cfg.loop.sampler_threads,
                      cfg.loop.concurrent_requests, node_cpus)


def start_actors(cfg: RunConfig, specs: list[SamplerSpec], model_dir: Path, plan: CorePlan):
    """(trainer, sampler slots, readiness refs): every actor asked for at once, warm where possible."""
    from rlmix.orchestration.loop import SamplerSlot
    from rlmix.orchestration.workers import SamplerWorker, TrainerWorker, derive_seed

    trainer_cfg = dataclasses.replace(cfg.trainer, num_threads=plan.trainer_threads)
    wanted = [ActorRequest(
        TrainerWorker, {"num_cpus": 0, "resources": {TRAINER_RESOURCE: 1.0} if cfg.cluster.address is None else {}},
        (str(model_dir), trainer_cfg, cfg.correction, cfg.seed), reuse_with_other_args=True,
    )]
    for spec in specs:
        threads = plan.sampler_threads if spec.gpus == 0 else cfg.loop.sampler_threads
        wanted.append(ActorRequest(
            SamplerWorker, {"num_cpus": 0, "num_gpus": spec.gpus, "resources": {spec.resource: 0.001}, "max_restarts": 3},
            (spec, str(model_dir), cfg.task, derive_seed(cfg.seed, spec.name), threads), reuse_with_other_args=False,
        ))
    handles, ready = SESSION.actors(wanted)
    slots = [SamplerSlot(name=spec.name, pool=spec.pool, actor=h, on_cpu=spec.gpus == 0)
             for spec, h in zip(specs, handles[1:])]
    return handles[0], slots, ready


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
    launched = time.perf_counter()
    start_ray(cfg, specs)
    keep_warm = sweep_group is not None  # the next job of this sweep reuses Ray and the processes
    try:
        plan = core_plan(cfg, specs)
        log.info("%s", plan.describe())
        trainer, slots, ready = start_actors(cfg, specs, model_dir, plan)
        # Every process up before the clock starts: an engine that takes 20 s to start would
        # otherwise sit out the first steps of a short run. All are awaited together, once.
        ray.get(ready)
        log.info("Ray and %d actors ready in %.1fs", len(ready), time.perf_counter() - launched)
        monitor = CollapseMonitor(cfg.monitor)
        start_version, run_dir = resume(cfg, trainer, monitor, run_dir)
        logger = RunLogger(
            run_dir, cfg.logger.wandb, cfg.name, config_dict(cfg), sweep_group, cfg.loop.steps, cfg.logger.console_every
        )
        loop = AsyncLoop(
            cfg.loop, trainer, slots, make_task(cfg.task, cfg.seed), cfg.seed, tokenizer.pad_token_id,
            start_version=start_version,
            start_request=start_version * cfg.loop.groups_per_step // cfg.loop.groups_per_request,
            generating=plan.generating,
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
    except BaseException:
        keep_warm = False  # after a failure nothing is trusted: the next job starts from scratch
        raise
    finally:
        SESSION.release(keep=keep_warm)  # parked processes are reset before any reuse


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
