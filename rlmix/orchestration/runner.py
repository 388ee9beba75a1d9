"""``rlmix train``: one run from a resolved config (``RunPlan``) to a finished run directory."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import time
from pathlib import Path

from rlmix.config.schema import RunConfig, lr_horizon
from rlmix.errors import ConfigError, RunFailed, TrainerDied
from rlmix.metrics.jsonl import keep_rows
from rlmix.metrics.jsonl import METRICS_FILE
from rlmix.metrics.logger import SUMMARY_FILE, RunLogger
from rlmix.assembly import checkpoints
from rlmix.assembly.checkpoints import RunState
from rlmix.assembly.fleet import SamplerSpec, fleet_manifest, resolve_fleet
from rlmix.assembly.plan import RunPlan
from rlmix.assembly.parts import package_versions, resolve_model_dir
from rlmix.orchestration.cores import CorePlan, is_synchronous, plan_cores
from rlmix.orchestration.session import SESSION, TRAINER_RESOURCE, ActorRequest

log = logging.getLogger(__name__)


def start_ray(cfg: RunConfig, specs: list[SamplerSpec], log_dir: Path) -> dict[str, str]:
    """Start or join Ray (a sweep's previous job's instance is kept where it fits); returns the
    environment this run's actors take on (their output goes to ``log_dir``/workers.log)."""
    from rlmix.metrics.quiet import route_driver_logs, worker_env
    from rlmix.orchestration.workers import LAUNCH_DIR_ENV

    route_driver_logs(log_dir, cfg.logger.verbose)
    env_vars = worker_env(log_dir, cfg.logger.verbose) | {LAUNCH_DIR_ENV: os.getcwd()}
    resources = {spec.resource for spec in specs} | {TRAINER_RESOURCE}
    SESSION.ensure_ray(cfg.cluster.address, cfg.cluster.num_cpus, resources, env_vars, cfg.logger.verbose,
                       cfg.cluster.fork_workers)
    return env_vars


def core_plan(cfg: RunConfig, specs: list[SamplerSpec]) -> CorePlan:
    """Threads per process from the cores Ray reports (rlmix.orchestration.cores)."""
    import ray

    cpu_samplers = sum(1 for spec in specs if spec.gpus == 0)
    cpus = ray.cluster_resources().get("CPU", 1.0)
    node_cpus = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]), default=cpus)
    return plan_cores(cpus, cpu_samplers, cfg.trainer.num_threads, cfg.loop.sampler_threads,
                      cfg.loop.concurrent_requests, node_cpus, synchronous=is_synchronous(cfg.loop))


def start_actors(run: RunPlan, specs: list[SamplerSpec], model_dir: Path, cores: CorePlan, env_vars: dict):
    """(trainer, sampler slots, readiness refs): every actor asked for at once, warm where possible.

    The trainer takes the plan's correction, each sampler the plan's task (its kind makes the
    sampler's rollout producer).

    ``env_vars`` (this run's worker environment: where worker output goes) travel with each actor,
    so an actor of a sweep's later job, new or reused, writes to its own run's directory. Each
    sampler slot keeps this job's token and arguments, to re-initialise a sampler that Ray
    re-created from an earlier job's (rlmix.orchestration.session).
    """
    from rlmix.orchestration.hardware import trainer_actor_gpus
    from rlmix.orchestration.loop import SamplerSlot
    from rlmix.orchestration.workers import SamplerWorker, TrainerWorker
    from rlmix.seeds import derive_seed

    cfg = run.cfg
    trainer_cfg = dataclasses.replace(cfg.trainer, num_threads=cores.trainer_threads,
                                      lr_decay_steps=lr_horizon(cfg))
    trainer_options = {"num_cpus": 0, "resources": {TRAINER_RESOURCE: 1.0} if cfg.cluster.address is None else {}}
    if gpus := trainer_actor_gpus(cfg):  # a one-rank DeepSpeed trainer on NCCL: its engine runs in the actor
        trainer_options["num_gpus"] = gpus
    trainer_args = (str(model_dir), trainer_cfg, run.correction, cfg.seed)
    wanted = [ActorRequest(TrainerWorker, trainer_options, trainer_args, env_vars)]
    job = SESSION.begin_job()
    for spec in specs:
        threads = cores.sampler_threads if spec.gpus == 0 else cfg.loop.sampler_threads
        options = {"num_cpus": 0, "num_gpus": spec.gpus, "resources": {spec.resource: 0.001},
                   "max_restarts": cfg.loop.sampler_max_restarts}
        args = (spec, str(model_dir), run.task, derive_seed(cfg.seed, spec.name), threads, job)
        wanted.append(ActorRequest(SamplerWorker, options, args, env_vars))
    handles, ready = SESSION.actors(wanted)
    slots = [SamplerSlot(name=spec.name, pool=spec.pool, actor=h, on_cpu=spec.gpus == 0, job=job,
                         init=(req.env_vars, *req.args))
             for spec, req, h in zip(specs, wanted[1:], handles[1:])]
    return handles[0], slots, ready


def started(ready: list) -> None:
    """Every actor up, or one line: an actor that died of a ``ConfigError`` is bad input (exit 2, the
    run directory removed), any other death a failed start (exit 1); neither with Ray's traceback."""
    import ray

    from rlmix.orchestration.loop import NODE_GRACE_S, first_line

    try:
        ray.get(ready)
    except ray.exceptions.RayActorError as err:
        causes = [err]  # Ray's wrappers, then what the actor raised (the innermost one is the message)
        while len(causes) < 8 and (inner := getattr(causes[-1], "cause", None) or causes[-1].__cause__):
            causes.append(inner)
        if (why := SESSION.node_lost(NODE_GRACE_S)) is not None:  # not the actor's own failure
            raise RunFailed(f"a process did not start: {why}") from None
        config = next((c for c in reversed(causes) if isinstance(c, ConfigError)), None)
        if config is not None:
            lines = [ln.strip() for ln in str(config).splitlines() if ln.strip()]
            raise ConfigError(lines[0] if lines else type(config).__name__) from None
        if (line := raised_config_error(err)) is not None:
            raise ConfigError(line) from None
        raise RunFailed(f"a process did not start: {first_line(err)}") from None


RAISED_CONFIG_ERROR = re.compile(r"^(?:rlmix\.errors\.)?ConfigError: (.*\S)", re.MULTILINE)


def raised_config_error(err: BaseException) -> str | None:
    """The first line of the ``ConfigError`` an actor's constructor raised, or None. Ray (2.60) keeps only
    the text of a creation task's error, its traceback ending in ``rlmix.errors.ConfigError: <line>``, not
    the exception: read from there (the last one, where one was raised while handling another)."""
    from rlmix.orchestration.loop import ANSI_ESCAPE

    if not getattr(err, "actor_init_failed", False):
        return None
    found = RAISED_CONFIG_ERROR.findall(ANSI_ESCAPE.sub("", str(err)))
    return found[-1].strip() if found else None


def train(plan: RunPlan, run_dir: Path, sweep_group: str | None = None, label: str | None = None) -> dict:
    """Run ``plan`` (``rlmix.assembly.plan.plan_run``: a validated, resolved config) in ``run_dir``; returns the summary written to summary.json (its ``status``:
    rlmix.orchestration.outcome).

    ``label`` names the W&B run (a sweep job's swept overrides; default ``cfg.name``) and
    ``sweep_group`` its group (default: the run's name, so a single run is a group of one).
    """
    import ray

    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.metrics.monitor import CollapseMonitor
    from rlmix.orchestration.loop import AsyncLoop
    from rlmix.orchestration.outcome import StopRequest, StoppedWhileStarting, finish

    cfg = plan.cfg
    run_dir = Path(run_dir)
    if cfg.resume and (ended := ended_run(Path(cfg.resume), cfg.loop.steps)) is not None:
        print(f"resume={cfg.resume}: the run ended at step {ended['steps']} ({ended['status']}); nothing is left to "
              f"train at loop.steps={cfg.loop.steps} (raise it above {ended['steps']} to go on)", flush=True)
        return ended
    model_dir = resolve_model_dir(plan)
    if cfg.resume and (unchecked := check_continues(cfg, model_dir)):
        log.warning("%s", unchecked)
    tokenizer = load_fast_tokenizer(model_dir)
    # Before Ray: a prompt it cannot encode, or an answer the budget would cut, is one line.
    task = plan.task.build(cfg.seed, tokenizer, cfg.loop.max_new_tokens)
    specs = resolve_fleet(plan, tokenizer.eos_token_id)
    # An episode task's runtime, tasks and context; a completion budget the context cannot hold: one line.
    plan.task.check_run(task, tokenizer, model_dir, cfg.loop.max_new_tokens)
    if cfg.loop.lag is not None and (caveat := plan.task.rerun_caveat()):
        log.warning("loop.lag=%d: %s", cfg.loop.lag, caveat)
    if caveat := plan.task.train_caveat():
        log.warning("%s", caveat)
    manifest = fleet_manifest(specs)
    for pool, entry in manifest.items():
        log.info("pool %s: %d x %s", pool, entry["count"], entry["label"])
    launched = time.perf_counter()
    env_vars = start_ray(cfg, specs, log_dir=run_dir)
    stop = StopRequest()
    # The next job of this sweep (or, under SESSION.hold(), the next command) reuses Ray and the processes.
    keep_warm = sweep_group is not None or SESSION.held
    try:
        with stop.installed():
            cores = core_plan(cfg, specs)
            log.info("%s", cores.describe())
            trainer, slots, ready = start_actors(plan, specs, model_dir, cores, env_vars)
            # Every process up before the clock starts: an engine that takes 20 s to start would
            # otherwise sit out the first steps of a short run. All are awaited together, once.
            started(ready)
            log.info("Ray and %d actors ready in %.1fs", len(ready), time.perf_counter() - launched)
            monitor = CollapseMonitor(cfg.monitor)
            state, run_dir, last = resume(cfg, trainer, monitor, run_dir)
            logger = RunLogger(
                run_dir, cfg.logger.wandb, label or cfg.name, config_dict(cfg), sweep_group or cfg.name,
                cfg.loop.steps, cfg.logger.console_every, run_id=state.wandb_id, elapsed_s=state.wall_time_s,
            )
            steps = StepHandler(cfg, trainer, monitor, logger, run_dir, saved_step=state.step, last=last,
                                written_by=checkpoints.written_by(cfg, model_dir))
            loop = AsyncLoop(
                cfg.loop, trainer, slots, task, cfg.seed, tokenizer.pad_token_id,
                start_version=state.step, start_request=state.next_request, generating=cores.generating,
                idle_lanes=cores.idle_lanes, restart=TrainerRestarts(cfg, steps), start_faults=state,
                node_lost=SESSION.node_lost,
            )
            steps.loop = loop
            facts = {"name": cfg.name, "seed": cfg.seed, "run_dir": str(run_dir), "fleet": manifest,
                     "model_dir": str(model_dir), "versions": package_versions()}
            stop.training()
            summary = finish(loop, steps, stop, facts)
            # Only after an orderly end are the processes trusted with the next job of a sweep (a
            # sampler that died may still be restarting, and has used up some of Ray's restarts).
            # A collapse is the policy's, not the processes': the study's sweeps expect some.
            clean = summary.get("status") in ("completed", "collapsed") and not any(slot.deaths for slot in slots)
            keep_warm = keep_warm and clean
            return summary
    except BaseException as err:
        keep_warm = False
        if isinstance(err, KeyboardInterrupt) and not stop.started and stop.signum is not None:
            raise StoppedWhileStarting(stop.signum) from None  # ray.get raises a KeyboardInterrupt of its own
        raise
    finally:
        SESSION.release(keep=keep_warm)  # parked processes are reset before any reuse


class StepHandler:
    """After each trainer step: collapse monitor, logging, periodic checkpoints, the stop decision."""

    def __init__(self, cfg: RunConfig, trainer, monitor, logger: RunLogger, run_dir: Path, saved_step: int,
                 last: dict[str, float | str], written_by: dict | None = None):
        self.cfg, self.trainer, self.monitor, self.logger, self.run_dir = cfg, trainer, monitor, logger, run_dir
        self.written_by = written_by  # recorded in each checkpoint: what a resume must ask for to load it
        self.loop = None  # the AsyncLoop, whose data position a checkpoint records
        self.last = last  # the newest step's metrics (a resumed run's before it trains any)
        self.saved_step = saved_step  # a resumed run starts from a saved step
        self.saved_at = time.monotonic()
        self.misaligned = False  # said once per run

    def __call__(self, report) -> bool:
        from rlmix.config.monitor import MonitorAction
        from rlmix.metrics.verdict import CollapseRule

        verdict = self.monitor.update(report.step, report.metrics)
        self.last = report.metrics | verdict.as_metrics()
        self.logger.log(report.step, self.last)
        self._check_alignment(report.step, report.metrics)
        if verdict.rule is CollapseRule.nonfinite:
            return False  # nothing more can be learned: the outcome says failed
        if self._checkpoint_due(report.step):
            self.checkpoint(report.step)
        return not (verdict.collapse and self.cfg.monitor.action is MonitorAction.stop)

    def _check_alignment(self, step: int, metrics: dict[str, float]) -> None:
        from rlmix.metrics.names import ALIGNMENT_ERROR, ALIGNMENT_TOLERANCE

        error = metrics.get(ALIGNMENT_ERROR, 0.0)
        if error > ALIGNMENT_TOLERANCE and not self.misaligned:
            self.misaligned = True
            log.warning("step %d: the samplers' records are misaligned (%s %.3g nats): a sampled token's "
                        "log-prob differs from its own slot in the recorded head, so the SC arms' head terms "
                        "are not that token's (docs/math.md §3.3)", step, ALIGNMENT_ERROR, error)

    def _checkpoint_due(self, step: int) -> bool:
        loop = self.cfg.loop
        if step >= loop.steps:
            return False  # the final checkpoint is written once the loop ends
        by_steps = loop.checkpoint_every > 0 and step % loop.checkpoint_every == 0
        by_time = loop.checkpoint_every_min > 0 and time.monotonic() - self.saved_at >= 60 * loop.checkpoint_every_min
        return by_steps or by_time

    def checkpoint(self, step: int) -> Path | None:
        """Save step ``step`` (unless it is already saved); returns the checkpoint's directory."""
        import ray

        from rlmix.orchestration.loop import first_line

        if step == self.saved_step:
            return checkpoints.latest_checkpoint(self.run_dir)
        tmp = checkpoints.staging_dir(self.run_dir, step)
        try:
            ray.get(self.trainer.save_checkpoint.remote(str(tmp)), timeout=self.cfg.loop.step_timeout_s)
        except ray.exceptions.RayActorError as err:
            raise TrainerDied(f"the trainer died while saving step {step} ({type(err).__name__})") from err
        except ray.exceptions.GetTimeoutError as err:
            raise RunFailed(f"the trainer hung while saving step {step} ({type(err).__name__}); "
                            "waiting on the trainer") from err
        except ray.exceptions.RayError as err:  # the save raised in the trainer (a full disk, say)
            raise RunFailed(f"saving step {step} failed: {first_line(err)}") from err
        from rlmix.orchestration.outcome import fault_counts

        state = RunState(step, self.loop.data_position(step), self.logger.elapsed_s(), self.logger.wandb_id,
                         self.written_by, **fault_counts(self.loop))
        try:
            path = checkpoints.seal(tmp, state, self.cfg.loop.keep_checkpoints)
        except OSError as err:
            raise RunFailed(f"saving step {step} failed: {first_line(err)}") from err
        self.saved_step, self.saved_at = step, time.monotonic()
        return path

    def go_back(self, trainer, step: int) -> None:
        """Continue from checkpoint step ``step`` with ``trainer``: the rows after it go, and the
        collapse monitor sees the run's history up to it again."""
        from rlmix.metrics.monitor import CollapseMonitor

        self.trainer = trainer
        self.monitor = CollapseMonitor(self.cfg.monitor)
        rows = self.logger.rewind(step)
        feed_monitor(self.monitor, rows)
        # A run that ends before it trains a step again reports the step it went back to, not one thrown away.
        self.last = last_metrics(rows)
        self.saved_step, self.saved_at = step, time.monotonic()


class TrainerRestarts:
    """A dead trainer, replaced: a new process of this job at the run's newest complete checkpoint
    (the start weights before the first), up to ``trainer.max_restarts`` times.

    The steps after that checkpoint are trained again, from its data position, as a resumed run
    would train them; the deaths and the step each went back to are logged.
    """

    def __init__(self, cfg: RunConfig, steps: StepHandler):
        self.cfg, self.steps, self.count = cfg, steps, 0

    def __call__(self, died: TrainerDied) -> tuple[object, RunState]:
        import ray

        limit = self.cfg.trainer.max_restarts
        if self.count >= limit:
            used = f"after {limit} restart{'s' if limit != 1 else ''}" if limit else "and trainer.max_restarts=0"
            raise RunFailed(f"{died} {used} (trainer.max_restarts)") from died
        self.count += 1
        trainer, ready = SESSION.replace(self.steps.trainer)
        checkpoint = checkpoints.latest_checkpoint(self.steps.run_dir)
        try:
            ray.get(ready, timeout=self.cfg.loop.step_timeout_s)
            if checkpoint is not None:
                ray.get(trainer.load_checkpoint.remote(str(checkpoint)), timeout=self.cfg.loop.step_timeout_s)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as err:
            raise RunFailed(f"{died}; the new trainer did not start ({type(err).__name__})") from err
        state = checkpoints.read_run_state(checkpoint) if checkpoint is not None else RunState(0, 0, 0.0)
        self.steps.go_back(trainer, state.step)
        where = f"checkpoint {checkpoint.name}" if checkpoint is not None else "the start weights (no checkpoint yet)"
        log.warning("%s; restarted it (%d of %d) from %s: steps %d on are trained again",
                    died, self.count, limit, where, state.step + 1)
        return trainer, state


def ended_run(run_dir: Path, steps: int) -> dict | None:
    """The summary of a run that ended at or past ``steps`` with its newest complete checkpoint at
    that step: resuming it trains nothing, so neither Ray nor a process is started. None otherwise."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if summary.get("status") not in ("completed", "collapsed") or summary.get("steps", -1) < steps:
        return None
    checkpoint, _ = checkpoints.newest_complete(run_dir)
    if checkpoint is None or checkpoints.read_run_state(checkpoint).step != summary["steps"]:
        return None
    return summary


def check_continues(cfg: RunConfig, model_dir: Path) -> str | None:
    """ConfigError, before Ray starts and with the run's files untouched, where resuming cannot go as asked:
    a checkpoint of another trainer or model (``checkpoints.check_fits``), or ``loop.steps`` below the
    step it is at (nothing would train, and the run would be called completed short of its steps).
    Returns what ``check_fits`` could not check, for the run to log (None when it checked everything)."""
    unchecked = checkpoints.check_fits(cfg.resume, cfg, model_dir)
    checkpoint, _ = checkpoints.newest_complete(Path(cfg.resume))
    state = checkpoints.read_run_state(checkpoint) if checkpoint is not None else None
    if state is not None and cfg.loop.steps < state.step:
        raise ConfigError(f"resume={cfg.resume}: the run is at step {state.step} ({checkpoint.name}); "
                          f"loop.steps={cfg.loop.steps} is below it: give loop.steps above {state.step} to train more")
    return unchecked


def resume(cfg: RunConfig, trainer, monitor, run_dir: Path) -> tuple[RunState, Path, dict]:
    """(run state to start from, run dir, metrics of its newest logged step): a resumed run continues
    in its own directory from its newest complete checkpoint. The metrics are what its summary reports
    as final if no step is left to train (resuming a run that had completed)."""
    import ray

    if not cfg.resume:
        return RunState(step=0, next_request=0, wall_time_s=0.0), run_dir, {}
    run_dir = Path(cfg.resume).resolve()  # summary.json's paths hold wherever the command is run from
    checkpoint, skipped = checkpoints.newest_complete(run_dir)
    if checkpoint is None:  # validate() checked this; the directory changed since
        raise ConfigError(f"resume={cfg.resume}: no complete checkpoint under {run_dir / checkpoints.CHECKPOINTS}")
    for path, why in skipped:
        print(f"skipping {path.name}: {why}")
    ray.get(trainer.load_checkpoint.remote(str(checkpoint)))
    state = checkpoints.read_run_state(checkpoint)
    rows = keep_rows(run_dir / METRICS_FILE, state.step)  # later steps are trained again
    if gaps := missing_rows(rows, state.step):
        log.warning("%s", gaps)
    # The run is going again: its summary is written anew when it ends. Left in place, it would tell
    # `rlmix report` the earlier part's outcome while this part runs, or after it is killed.
    (run_dir / SUMMARY_FILE).unlink(missing_ok=True)
    feed_monitor(monitor, rows)
    print(f"resuming {run_dir} from {checkpoint.name} at step {state.step}")
    if (change := checkpoints.schedule_change(state, cfg)) is not None:
        print(change)
    return state, run_dir, last_metrics(rows)


def missing_rows(rows: list[dict], step: int) -> str:
    """'' when ``rows`` hold every step 1..``step``, else a line naming the missing ones: the collapse
    monitor is rebuilt from the rows (``feed_monitor``), so the steps without one are not in its history."""
    missing = sorted(set(range(1, step + 1)) - {row["step"] for row in rows})
    if not missing:
        return ""
    spans, start = [], missing[0]
    for prev, now in zip(missing, [*missing[1:], None]):
        if now != prev + 1:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = now
    return (f"{METRICS_FILE} lacks step{'s' * (len(missing) > 1)} {', '.join(spans)} of the {step} the checkpoint "
            f"has: the collapse monitor sees only the other {step - len(missing)}")


def last_metrics(rows: list[dict]) -> dict:
    """The metrics of the newest of a run's logged ``rows`` (none: {}), as a step's report holds them."""
    return {k: v for k, v in rows[-1].items() if k not in ("step", "time")} if rows else {}


def feed_monitor(monitor, rows: list[dict]) -> None:
    """The collapse monitor sees a run's logged history again (a resumed run, a restarted trainer).

    metrics.jsonl holds a non-finite value as null (JSON has no NaN): it goes back in as NaN, as the
    monitor first saw it, so that, say, a NaN gradient norm is a spike again (docs/monitor_and_report.md).
    """
    for row in rows:
        monitor.update(row["step"], {k: math.nan if v is None else v for k, v in row.items()
                                     if v is None or isinstance(v, (int, float))})


def config_dict(cfg: RunConfig) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
