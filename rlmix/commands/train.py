"""``rlmix train`` is real Hydra: ``@hydra.main`` behind the Typer command, arguments passed through.

Every job of the run or sweep is composed and planned first (``compose.preflight``); then Hydra
runs each job, which takes its plan and calls ``rlmix.orchestration.runner.train``, then
prints the block that ends the run (and, after a sweep's last job, one line per job: where a launcher
ran the jobs in other processes, from the summary.json each left). How the run
ended becomes one line and the exit status here (docs/reliability.md):

completed / collapsed: 0 · failed: 1 · bad input: 2 · interrupted by signal N: 128 + N (SIGINT 130, SIGTERM 143, SIGHUP 129).
A failed job of a sweep does not stop the sweep; the command exits 1 once every job has run.
A signal stops the sweep at the job it interrupts: the sweep's block still lists every job (those
that never ran too) and the command that continues the sweep, ``resume=<sweep dir>``.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rlmix.commands.compose import (CONFIG_MODULE, CONFIG_NAME, MULTIRUN_FILE, SCHEMA_SUFFIX, Job, command_line,
                                    composed, job_key, logged_run, mode_known, plan_jobs, repeated_source,
                                    resume_in_place, shared_dir_args, sweep_job)
from rlmix.commands.naming import job_label, register_resolver, sweep_name
from rlmix.errors import ConfigError, RunFailed
from rlmix.metrics.quiet import WORKERS_LOG

log = logging.getLogger(__name__)

_FAILED: list[str] = []  # run dirs of the failed jobs of this process's sweep


_finished: list[tuple[str, dict, Path]] = []  # (label, summary, run dir) of each job of this command
_sweep_dir: list[Path] = []  # the multirun directory, once a sweep's first job has started
_jobs: list[Job] = []  # every job of this command as the preflight planned it, in the order Hydra runs them
_source: list[str] = []  # the config flags and hydra.searchpath of this command (compose.repeated_source)


class SweepStopped(BaseException):
    """A signal interrupted a job of a sweep: the sweep stops there (Hydra would start its next job,
    and it lets a BaseException through, as it does not an Exception)."""

    def __init__(self, code: int, signal_name: str):
        super().__init__(code)
        self.code, self.signal_name = code, signal_name

    def __reduce__(self):  # raised in a joblib worker, it is pickled back to the parent
        return SweepStopped, (self.code, self.signal_name)


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _hydra_train(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlmix.assembly.plan import plan_run
    from rlmix.config.load import to_run_config
    from rlmix.orchestration.runner import train

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    sweep = hc.mode is RunMode.MULTIRUN
    output_dir = Path(hc.runtime.output_dir)
    _sweep_dir[:] = [Path(hc.sweep.dir)] if sweep else []
    try:
        # The preflight planned this job from the same overrides and config, numbered as Hydra numbers
        # a sweep's jobs (two jobs of a sweep can share their overrides); a job it did not see (Hydra
        # called another way, or composing another config) is planned here.
        num = hc.job.num if sweep else 0
        job = _jobs[num] if num < len(_jobs) and _jobs[num].key == job_key(overrides) else None
        job = job if job is not None and job.config == composed(cfg) else None
        plan, kept = (job.plan, job.kept) if job else (plan_run(to_run_config(cfg)), None)
        if sweep and job is None:  # (the preflight refused a run's resume= shared by several jobs)
            plan, kept = sweep_job(plan, Path(hc.sweep.dir), output_dir, jobs=1)
        run_cfg = plan.cfg
        label = job_label(overrides, run_cfg.name, run_cfg.seed) if sweep else run_cfg.name
        if kept is not None:
            keep_failed(kept, overrides, output_dir, label)
            return
        summary = train(plan, run_dir=output_dir, label=label, sweep_group=sweep_name(hc.sweep.dir) if sweep else None)
    except ConfigError as err:  # e.g. a model path that is not a model: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        remove_unstarted(output_dir)
        sys.exit(2)
    except RunFailed as err:  # a process did not start (runner.started): nothing trained, no summary
        output = output_dir / WORKERS_LOG
        print(f"error: {err}" + (f" (its output: {output})" if output.is_file() else ""), file=sys.stderr)
        if sweep:
            _FAILED.append(str(output_dir))  # the other jobs of the sweep still run
            return
        sys.exit(1)
    _finished.append(end_of_run(run_cfg, summary, overrides, output_dir, label))
    code = exit_code(summary)
    say(summary, overrides)
    if code == 1 and sweep:
        _FAILED.append(str(output_dir))  # the other jobs of the sweep still run
    elif code != 0 and sweep:
        raise SweepStopped(code, summary["signal"])
    elif code != 0:
        sys.exit(code)


def keep_failed(summary: dict, overrides: list[str], run_dir: Path, label: str) -> None:
    """A continued sweep's job that had failed before its first checkpoint stays as it ended: one line
    with the command that trains it again, in a directory of its own."""
    _finished.append((label, summary, run_dir))
    _FAILED.append(str(run_dir))
    again = command_line([o for o in overrides if not o.startswith(("hydra.", "+hydra."))], _source)
    print(f"{label}: kept as it ended (failed at step {summary.get('steps', 0)}, no checkpoint to continue "
          f"from); start it again with: {again}", file=sys.stderr, flush=True)


# What Hydra writes before a job runs: into the job's directory, and into a sweep's.
JOB_FILES, SWEEP_FILES = {".hydra", "train.log", WORKERS_LOG}, {MULTIRUN_FILE}


def remove_unstarted(run_dir: Path) -> None:
    """A job refused before it trained leaves nothing behind: its directory goes if it holds only
    what Hydra wrote for it, and so do the directories above it, inside the working directory, that
    are left empty (or hold only a sweep's multirun.yaml). A directory holding anything else, an
    earlier run's files say, is kept as it is."""
    import shutil

    cwd, directory = Path.cwd().resolve(), run_dir.resolve()
    if not directory.is_dir() or {p.name for p in directory.iterdir()} - JOB_FILES:
        return
    shutil.rmtree(directory)
    for parent in directory.parents:
        if parent == cwd or cwd not in parent.parents or {p.name for p in parent.iterdir()} - SWEEP_FILES:
            return
        shutil.rmtree(parent)


def end_of_run(cfg, summary: dict, overrides: list[str], output_dir: Path, label: str) -> tuple[str, dict, Path]:
    """Print the run's closing block; (label, summary, run dir) for the sweep's block."""
    from rlmix.assembly.checkpoints import latest_checkpoint
    from rlmix.metrics.console import run_block

    # A resumed run continues in its own directory; Hydra's directory holds this attempt's logs.
    resumed = cfg.resume is not None and latest_checkpoint(Path(cfg.resume)) is not None
    run_dir = Path(cfg.resume) if resumed else output_dir
    checkpoint = latest_checkpoint(run_dir)
    print(run_block(summary, run_dir, checkpoint, cfg.loop.steps, overrides, log_dir=output_dir,
                    eval_args=eval_args(cfg), config_args=_source), flush=True)
    return label, summary, run_dir


def eval_args(cfg) -> tuple[str, ...]:
    """What the printed ``rlmix eval`` adds to the run's own task: a dataset without
    ``task.eval_files`` has no test split, so its training rows are scored (and so labelled)."""
    from rlmix.config.dataset import DatasetTaskConfig

    if isinstance(cfg.task, DatasetTaskConfig) and cfg.task.eval_files is None:
        return ("task.split=train",)
    return ()


def exit_code(summary: dict) -> int:
    status = summary["status"]
    if status == "interrupted":
        return 128 + signal.Signals[summary["signal"]].value  # the shell's convention
    return 1 if status == "failed" else 0


def tell_interrupted(line: str, signal_name: str, block: bool = False) -> None:
    """An interrupted run's one line (or a stopped sweep's ``block``, on stdout): on stderr, or, after a
    SIGHUP (the terminal is most likely gone), in train.log (and on the console, which then is /dev/null)."""
    if signal_name == "SIGHUP":
        log.warning(line)
    else:
        print(line, file=sys.stdout if block else sys.stderr, flush=True)


def say(summary: dict, overrides: list[str]) -> None:
    """The one line for a run that did not complete: what happened and the command that continues
    it, or that starts it again (in a new directory) when no checkpoint was written."""
    status, step = summary["status"], summary["steps"]
    resume = shlex.quote(str(summary["run_dir"]))
    resume_cmd = f"continue with: {command_line(overrides, _source)} resume={resume}"
    train_cmd = command_line([o for o in overrides if not o.startswith(("hydra.", "+hydra."))], _source)
    if status == "interrupted":
        checkpoint = Path(summary["checkpoint"]).name if summary["checkpoint"] else None
        then = resume_cmd if checkpoint else f"start again with: {train_cmd}"
        if summary.get("stopped_at_once"):  # a second signal: no checkpoint of the last steps
            how = f"{summary['signal']} twice: stopped at once"
            lost = "" if checkpoint == f"step_{step}" else " (the steps after it train again)"
            saved = f"newest checkpoint {checkpoint}{lost}" if checkpoint else "no checkpoint"
        else:
            how, saved = summary["signal"], f"checkpoint {checkpoint}" if checkpoint else "no step to save"
        tell_interrupted(f"interrupted at step {step} ({how}), {saved}; {then}", summary["signal"])
    elif status == "failed":
        then = resume_cmd if summary["resumable"] else f"no checkpoint was written yet; start again with: {train_cmd}"
        print(f"error: run failed at step {step}: {summary['error']}; {then}", file=sys.stderr, flush=True)


def run_train(args: list[str]) -> None:
    from rlmix.config.schema import register_configs
    from rlmix.metrics.console import sweep_block

    from rlmix.orchestration.forkserver import discard_early
    from rlmix.orchestration.session import SESSION

    _prestart_fork_server(args)
    try:
        register_configs()
        register_resolver()
        args = resume_in_place(args)
        _jobs[:] = plan_jobs(args)
        _source[:] = repeated_source(args) if _jobs else []
    except BaseException:  # bad input: nothing of the run starts
        discard_early()
        raise

    sys.argv = ["rlmix train", *shared_dir_args(args, _jobs)]  # Hydra's; the printed commands repeat ``args``
    seen: list[Path] = []  # the sweep's directory, once Hydra resolved it for the launcher
    try:
        _finished.clear()
        _FAILED.clear()
        _sweep_dir.clear()
        with mode_known(_jobs), sweep_dir_seen(seen), help_without_schemas(args):
            _hydra_train()
        # A sweep the preflight planned whose jobs ran in other processes (joblib's workers): what they left on disk.
        if ran_in_other_processes(seen):
            _sweep_dir[:] = seen
            _finished[:] = ran_elsewhere(seen[0])
            _FAILED[:] = [str(run_dir.absolute()) for _, summary, run_dir in _finished
                          if summary.get("status") == "failed"]
        if _sweep_dir and _finished:
            print(sweep_block(_finished, _sweep_dir[0]), flush=True)
        if _FAILED:
            print(f"error: {len(_FAILED)} job(s) of the sweep failed: {', '.join(_FAILED)}", file=sys.stderr)
            sys.exit(1)
    except SweepStopped as stopped:
        name = stopped.signal_name
        if ran_in_other_processes(seen):  # a worker's job saved its step; joblib then killed the other workers
            told = interrupted_elsewhere(args, seen[0], name)
            tell_interrupted(told[0], name)
            tell_interrupted(told[1], name, block=True)
        else:
            tell_interrupted(stopped_sweep(args), name, block=True)
        sys.exit(stopped.code)
    except KeyboardInterrupt as stopped:
        # A signal before a run's loop began (a run that trained ends through its summary instead).
        signum = getattr(stopped, "signum", signal.SIGINT)  # a bare KeyboardInterrupt: Ctrl-C before Ray
        name = signal.Signals(signum).name
        if ran_in_other_processes(seen) and (told := interrupted_elsewhere(args, seen[0], name)):
            tell_interrupted(told[0], name)
            tell_interrupted(told[1], name, block=True)
            sys.exit(128 + signum)
        if _sweep_dir:
            label = _jobs[len(_finished)].label if len(_finished) < len(_jobs) else "a job"
            tell_interrupted(f"interrupted while {label} was starting ({name}: stopped at once), it trained nothing",
                             name)
            tell_interrupted(stopped_sweep(args, starting=True), name, block=True)
            sys.exit(128 + signum)
        again = " ".join(["rlmix", "train", *map(shlex.quote, args)])
        trained = f"{len(_finished)} run(s) of the sweep had finished, that one trained nothing" if _finished \
            else "nothing trained"
        tell_interrupted(f"interrupted while the run was starting ({name}: stopped at once), {trained}; "
                         f"start again with: {again}", name)
        sys.exit(128 + signum)
    finally:
        _jobs.clear()
        _source.clear()
        SESSION.end_command()  # a sweep kept Ray and its processes warm between jobs


def _prestart_fork_server(args: list[str]) -> None:
    """Launch the fork server of the local Ray instance this command will start, before composing
    anything (rlmix.orchestration.forkserver.prestart): not for help or a printed config, on a
    cluster, with ``cluster.fork_workers=false``, or where this process already holds an instance."""
    from rlmix.orchestration.forkserver import prestart
    from rlmix.orchestration.session import SESSION

    printed = {"--help", "-h", "--cfg", "-c", "--info", "--resolve", "--hydra-help"}
    if printed & set(args) or SESSION.ray_key is not None:
        return
    for arg in args:
        key, _, value = arg.partition("=")
        key, value = key.lstrip("+~"), value.strip().lower()
        if key == "cluster.address" and value not in ("", "null", "none"):
            return  # a cluster's nodes start their workers as Ray does
        if key == "cluster.fork_workers" and value in ("false", "0", "no", "off"):
            return
    prestart()


@contextmanager
def help_without_schemas(args: list[str]):
    """``rlmix train --help``: Hydra lists every config of a group, each group's schema among its options
    (``correction: correction_schema, mis, ...``); the schemas go from those lines."""
    if not {"--help", "-h"} & set(args):
        yield
        return
    import contextlib
    import io

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        sys.stdout.write(without_schemas(printed.getvalue()))


def without_schemas(help_text: str) -> str:
    """Hydra's help with the ``*_schema`` options left out of its configuration groups' lines."""
    groups, config, rest = help_text.partition("== Config ==")
    lines = []
    for line in groups.splitlines(keepends=True):
        group, sep, options = line.partition(": ")
        if sep and " " not in group and not line.startswith(" "):
            kept = [o for o in options.rstrip("\n").split(", ") if not o.endswith(SCHEMA_SUFFIX)]
            line = f"{group}: {', '.join(kept)}\n"
        lines.append(line)
    return "".join(lines) + config + rest


def ran_in_other_processes(seen: list[Path]) -> bool:
    """Hydra launched the preflight's sweep, and none of its jobs ran in this process (joblib's workers ran them)."""
    return bool(seen) and not _sweep_dir and bool(_jobs) and all(job.run_dir for job in _jobs)


@contextmanager
def sweep_dir_seen(seen: list[Path]):
    """``seen`` gets the sweep's directory as Hydra resolves it for the launcher (its ``${now:}`` kept
    for the jobs): a launcher that runs the jobs in other processes never runs ``_hydra_train`` here."""
    from hydra._internal.callbacks import Callbacks

    original = Callbacks.__dict__.get("on_multirun_start")
    if original is None:  # another Hydra: no sweep block for jobs run elsewhere
        yield seen
        return

    def on_multirun_start(self, config, **kwargs):
        seen.append(Path(config.hydra.sweep.dir))
        original(self, config=config, **kwargs)

    Callbacks.on_multirun_start = on_multirun_start
    try:
        yield seen
    finally:
        Callbacks.on_multirun_start = original


def ran_elsewhere(sweep_dir: Path) -> list[tuple[str, dict, Path]]:
    """(label, summary, run dir) of each planned job, from the summary.json its run wrote; a job without one
    (a process did not start) failed, as ``_FAILED`` counts it where the jobs run in this process."""
    rows = []
    for job in _jobs:
        run_dir = job_run_dir(job, sweep_dir)
        rows.append((job.label, summary_of(run_dir) or {"status": "failed", "steps": 0}, run_dir))
    return rows


def job_run_dir(job: Job, sweep_dir: Path) -> Path:
    """Where a planned job of the sweep in ``sweep_dir`` ran: a resumed job continues in its own run."""
    return Path(job.plan.cfg.resume or sweep_dir / job.run_dir.name)


def summary_of(run_dir: Path) -> dict | None:
    """The summary.json a run wrote when it ended, or None (none written, or unreadable)."""
    import json

    from rlmix.metrics.logger import SUMMARY_FILE

    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None


def interrupted_elsewhere(args: list[str], sweep_dir: Path, signal_name: str) -> tuple[str, str] | None:
    """(one line, the sweep's block) for a signal to a sweep whose jobs ran in other processes: joblib's
    parent takes the Ctrl-C as a KeyboardInterrupt and SIGKILLs its workers at once (loky's
    ``kill_workers``), so a job that was training keeps its newest complete checkpoint and no summary.
    What each job left on disk says what ``resume=<sweep dir>`` does with it. None when no job logged a step."""
    from rlmix.assembly.checkpoints import latest_checkpoint, read_run_state

    jobs, not_run, states = [], [], []
    for job in _jobs:
        run_dir = job_run_dir(job, sweep_dir)
        if not logged_run(run_dir):
            not_run.append((job.label, run_dir))
            states.append(f"{job.label} not started")
            continue
        checkpoint = latest_checkpoint(run_dir)
        summary = summary_of(run_dir)
        if summary is None:  # stopped mid-run: the newest complete checkpoint is where it continues
            step = read_run_state(checkpoint).step if checkpoint is not None else 0
            summary = {"status": "interrupted", "steps": step}
        jobs.append((job.label, summary, run_dir))
        status = summary.get("status")
        states.append(f"{job.label} {status}" if status in ("completed", "collapsed", "failed") else
                      f"{job.label} checkpoint {checkpoint.name}" if checkpoint else f"{job.label} no checkpoint")
    if not jobs:
        return None
    _sweep_dir[:], _finished[:] = [sweep_dir], jobs
    line = (f"interrupted ({signal_name}) while joblib's workers ran the sweep's jobs, which joblib ends at once "
            f"(a step in flight is lost): {'; '.join(states)}; {continue_sweep(args, sweep_dir, jobs)}")
    return line, stopped_sweep(args, not_run=not_run)


def stuck_jobs(jobs: list[tuple[str, dict, Path]]) -> list[Path]:
    """Run dirs of the ``jobs`` that logged steps but stopped before their first checkpoint, not as a failure:
    ``resume=<sweep dir>`` can neither continue them nor start them again there (``compose.sweep_job``)."""
    from rlmix.assembly.checkpoints import latest_checkpoint

    return [run_dir for _, summary, run_dir in jobs if summary.get("status") != "failed"
            and logged_run(run_dir) and latest_checkpoint(run_dir) is None]


def continue_command(args: list[str], sweep_dir: Path) -> str:
    """The sweep's own command, continuing it in ``sweep_dir``."""
    from rlmix.metrics.console import shown

    kept = [a for a in args if not a.startswith(("resume=", "hydra.sweep.dir=", "+hydra.sweep.dir="))]
    return " ".join(["rlmix train", *map(shlex.quote, kept), f"resume={shlex.quote(shown(sweep_dir))}"])


def continue_sweep(args: list[str], sweep_dir: Path, jobs: list[tuple[str, dict, Path]]) -> str:
    """'continue with: …', first naming the job directories that must be moved out of the sweep's."""
    from rlmix.metrics.console import shown

    stuck = stuck_jobs(jobs)
    move = (f"first move {', '.join(shlex.quote(shown(d)) for d in stuck)} out of the sweep directory (stopped "
            "before a first checkpoint: resume= refuses such a job), then " if stuck else "")
    return f"{move}continue with: {continue_command(args, sweep_dir)}"


def stopped_sweep(args: list[str], starting: bool = False, not_run: list[tuple[str, Path]] | None = None) -> str:
    """The block of a sweep a signal stopped: every job, the interrupted one (``starting``: it was
    stopped before it trained) and those that never ran, then the commands that work now, the one that
    continues the sweep in its directory among them. ``not_run``: the jobs that never started (default:
    those after the ones that ran, as one process runs them in order)."""
    from rlmix.metrics.console import shown, sweep_block

    sweep_dir = _sweep_dir[0]
    jobs = list(_finished)
    rest = not_run if not_run is not None else [(job.label, sweep_dir / job.run_dir.name) for job in _jobs[len(jobs):]]
    if starting and rest:
        jobs.append((rest[0][0], {"status": "interrupted", "steps": 0}, rest.pop(0)[1]))
    lines = []
    if any(logged_run(run_dir) for _, _, run_dir in jobs):
        lines.append(f"  rlmix report {shlex.quote(shown(sweep_dir))}")
    # A second signal (or joblib's kill) before a job's first checkpoint: nothing to continue from in place.
    for stuck in stuck_jobs(jobs):
        lines.append(f"  (first move {shlex.quote(shown(stuck))} out of the sweep directory: it stopped "
                     "before its first checkpoint)")
    lines.append(f"  {continue_command(args, sweep_dir)}")
    return sweep_block(jobs, sweep_dir, not_run=rest, next_lines=lines)
