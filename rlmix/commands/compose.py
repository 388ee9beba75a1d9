"""Composing ``train.yaml`` into a resolved ``RunPlan`` (``rlmix.assembly.plan``): shared by every command.

Before ``rlmix train`` hands over to Hydra, a preflight composes and plans EVERY job of the requested run or sweep
with the Compose API, so a typo in the fifth job of a sweep fails in a second with one line —
not after four runs, and not with a traceback or a half-written run directory. The same preflight
checks that a local run's GPU pools fit the GPUs of this machine (rlmix/orchestration/hardware.py).
It returns the plans, keyed by ``job_key``, so Hydra's job runs the plan already made instead of
resolving its config a second time.

A sweep job's directory is worked out as Hydra's launcher will name it, and must not hold a run:
a new run there would append to that run's metrics and prune its checkpoints. ``resume=<sweep dir>``
continues a sweep in place instead (``sweep_job``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from rlmix.errors import ConfigError

CONFIG_MODULE = "rlmix.conf"
CONFIG_NAME = "train"
MULTIRUN_FILE = "multirun.yaml"  # what Hydra writes into a sweep's directory before its first job
# Hydra flags that print or inspect instead of running: Hydra handles those itself.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}
# Of those, the ones that print the config (or what it is made of), which Hydra takes instead of -m; with --help,
# which prints it too, the ones that compose it: the preflight checks it composes.
_PRINTING_FLAGS = {"--cfg", "-c", "--info", "-i"}
_COMPOSING_FLAGS = _PRINTING_FLAGS | {"--help", "-h"}
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_CONFIG_DIR, _CONFIG_NAME, _CONFIG_PATH = ("--config-dir", "-cd"), ("--config-name", "-cn"), ("--config-path", "-cp")


# Keys whose values are paths. A sweep job's directory carries its overrides in its name
# (``3_correction.mode=sc_mis,seed=1``), and ``=`` or ``,`` in a value means something else to
# Hydra's override grammar; such a value is quoted for Hydra when it names an existing path.
PATH_KEYS = ("checkpoint", "resume", "model.path", "task.tasks_dir", "eval.out_dir", "hydra.run.dir",
             "hydra.sweep.dir")
_HYDRA_SPECIAL = set("=,[]{}()'\" :$%*?<>|&;#!")


def quote_paths(args: list[str]) -> list[str]:
    """``args`` with every existing path value of ``PATH_KEYS`` that Hydra would misparse quoted."""
    from pathlib import Path

    out = []
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+~") in PATH_KEYS and value[:1] not in ("'", '"') and Path(value).expanduser().exists():
            arg = f"{key}={hydra_quoted(value)}"
        out.append(arg)
    return out


def hydra_quoted(value: str) -> str:
    """``value`` as an override gives it to Hydra: single-quoted where its grammar would misparse it."""
    if not _HYDRA_SPECIAL & set(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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


class ConfigSource(NamedTuple):
    """Where Hydra composes a job from: rlmix's own configs, with ``--config-dir``'s folder added, and
    ``--config-name`` as the primary config. The preflight composes from the same, so the plan it
    makes is the one of the config Hydra records for the job."""

    config_dir: str | None = None  # as given (the printed commands repeat it)
    config_name: str = CONFIG_NAME

    def args(self) -> list[str]:
        """The flags that give this source again."""
        return ([_CONFIG_DIR[0], self.config_dir] if self.config_dir is not None else []) + \
            ([_CONFIG_NAME[0], self.config_name] if self.config_name != CONFIG_NAME else [])


def config_source(args: list[str]) -> ConfigSource:
    """The ``--config-dir`` and ``--config-name`` of a Hydra command line (ConfigError on a missing or
    bad value, and on ``--config-path``, which would replace rlmix's own configs rather than add to them)."""
    found: dict[str, str] = {}
    rest = iter(args)
    for arg in rest:
        flag, eq, value = arg.partition("=")
        if flag in _CONFIG_PATH:
            raise ConfigError(f"{flag}: rlmix's own config folder cannot be replaced; add a folder of yours with "
                              "--config-dir DIR (and pick a config in it with --config-name NAME)")
        if arg.startswith("-") and flag in _CONFIG_DIR + _CONFIG_NAME:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-"):
                raise ConfigError(f"{flag} needs a value: --config-dir DIR, --config-name NAME")
            found[_CONFIG_DIR[0] if flag in _CONFIG_DIR else _CONFIG_NAME[0]] = value
    config_dir = found.get(_CONFIG_DIR[0])
    if config_dir is not None and not Path(config_dir).expanduser().is_dir():
        raise ConfigError(f"--config-dir {config_dir}: no such directory")
    return ConfigSource(config_dir, found.get(_CONFIG_NAME[0], CONFIG_NAME))


def searchpath_args(args: list[str]) -> list[str]:
    """The ``hydra.searchpath`` overrides of a command line: Hydra keeps them out of a job's task
    overrides, and a command that repeats the job needs them."""
    return [a for a in args if not a.startswith("-") and a.split("=", 1)[0].lstrip("+") == "hydra.searchpath"]


@contextmanager
def _initialized(source: ConfigSource):
    """Hydra initialised as ``rlmix train``'s ``@hydra.main`` is: ``rlmix.conf``, and ``--config-dir``'s
    folder where Hydra adds it (ahead of the structured configs)."""
    import os

    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase("1.3")
    search_path = create_config_search_path(f"pkg://{CONFIG_MODULE}")
    if source.config_dir is not None:
        search_path.prepend(provider="command-line", anchor=SearchPathQuery(provider="schema"),
                            path="file://" + os.path.abspath(os.path.expanduser(source.config_dir)))
    Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


def expand_jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """One override list per job, as Hydra's basic sweeper would run them.

    Records the swept keys on the way: they name the jobs' directories and W&B runs.
    """
    from rlmix.commands.naming import set_swept_keys, swept_keys

    set_swept_keys(())
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    set_swept_keys(swept_keys(parsed))
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    jobs = [job for batch in batches for job in batch]
    if not jobs:  # Hydra would launch nothing and exit 0, leaving a sweep directory and its multirun.yaml
        empty = [o.input_line for o in parsed if o.is_sweep_override() and not _sweep_values(o)]
        given = f"{empty[0]} gives no value" if empty else "a swept key is given no value"
        raise ConfigError(f"the sweep has no jobs: {given}")
    return jobs


def _sweep_values(override) -> list[str]:
    """A sweep override's values; one that only Hydra's config loader can list (``glob``) counts as some."""
    from hydra.errors import HydraException

    try:
        return list(override.sweep_string_iterator())
    except HydraException:  # glob(): "ConfigLoader is not set"
        return ["?"]


def compose_run_config(overrides: list[str], for_training: bool = True, output_dir_key: str | None = None,
                       run=None):
    """``compose_plan(...).cfg``: the validated ``RunConfig`` alone."""
    return compose_plan(overrides, for_training, output_dir_key, run).cfg


def compose_plan(overrides: list[str], for_training: bool = True, output_dir_key: str | None = None, run=None,
                 source: ConfigSource = ConfigSource()):
    """Compose ``train.yaml`` with ``overrides`` and resolve it (``rlmix.assembly.plan.plan_run``) into a
    ``RunPlan`` (ConfigError on bad input).

    ``output_dir_key`` (``hydra.run.dir`` or ``hydra.sweep.dir``): also check that this directory
    can be created and written, before Hydra creates it. ``run`` (``run_settings.RunSettings``):
    start from a run's task, model and generation length; ``overrides`` win. ``source``: compose
    ``--config-name`` with ``--config-dir`` added.
    """
    return _compose(overrides, for_training, output_dir_key, run, source=source)[0]


def _compose(overrides: list[str], for_training: bool = True, output_dir_key: str | None = None, run=None,
             job_num: int | None = None,
             source: ConfigSource = ConfigSource()) -> tuple[object, str | None, str | None, dict, object]:
    """``(plan, output dir, job dir, config, mode)``: ``compose_plan``'s plan, the directory of
    ``output_dir_key`` and, for sweep job ``job_num``, the job's directory in it (``hydra.sweep.subdir``),
    the composed config it was planned from (``composed``) and the ``hydra.mode`` it sets (None where
    ``output_dir_key`` is None, or where the command line's ``-m`` decides)."""
    from hydra import compose
    from omegaconf import OmegaConf, open_dict

    from rlmix.assembly.plan import plan_run
    from rlmix.assembly.rules import check_new_run_dir, check_output_dir
    from rlmix.config.load import to_run_config

    from rlmix.commands.run_settings import apply_run_settings, group_overrides

    out_dir = job_dir = mode = None
    with _composing(source):
        groups = overrides if run is None else group_overrides(run, overrides)
        _check_overrides(groups, source.config_name)
        cfg = compose(config_name=source.config_name, overrides=groups, return_hydra_config=output_dir_key is not None)
        if run is not None:
            apply_run_settings(cfg, run, overrides)
        if output_dir_key is not None:
            out_dir, mode = OmegaConf.select(cfg, output_dir_key), OmegaConf.select(cfg, "hydra.mode")
            if job_num is not None:  # the launcher numbers the jobs in the sweeper's order
                with open_dict(cfg):
                    cfg.hydra.job.num = job_num
                job_dir = str(Path(out_dir) / OmegaConf.select(cfg, "hydra.sweep.subdir"))
            with open_dict(cfg):
                del cfg["hydra"]
        config = composed(cfg)
    plan = plan_run(to_run_config(cfg), for_training=for_training)
    if output_dir_key is not None:
        check_output_dir(output_dir_key, out_dir)
        if output_dir_key == "hydra.run.dir" and plan.cfg.resume is None:
            check_new_run_dir(output_dir_key, out_dir)
    return plan, out_dir, job_dir, config, mode


@contextmanager
def _composing(source: ConfigSource):
    """Hydra initialised for composing from ``source`` (``_initialized``), and cleared after; an error
    of composing is one line (ConfigError)."""
    from hydra.core.global_hydra import GlobalHydra

    from rlmix.commands.naming import register_resolver
    from rlmix.config.load import one_line
    from rlmix.config.schema import register_configs

    register_configs()
    register_resolver()
    GlobalHydra.instance().clear()
    try:
        with _initialized(source):
            yield
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(one_line(err)) from None
    finally:
        GlobalHydra.instance().clear()


def _check_composes(overrides: list[str], source: ConfigSource) -> None:
    """``--cfg`` and ``--info`` print the config as Hydra composes it, nothing planned or checked: overrides it
    cannot compose (``fleet=bogus``), or a key it composes that no schema has (``+loop.stpes=3``), are refused
    in one line, as a run's are, not with Hydra's error and its config search path or a config no run takes."""
    from hydra import compose

    from rlmix.config.load import refuse_added_keys

    with _composing(source):
        _check_overrides(overrides, source.config_name)
        refuse_added_keys(compose(config_name=source.config_name, overrides=overrides, return_hydra_config=True))


def _check_overrides(overrides: list[str], config_name: str) -> None:
    """What Hydra would compose without a word but rlmix refuses: a group's schema chosen as an option, a
    pool added under a name the fleet has."""
    _check_no_schema_chosen(overrides)
    _check_added_pools(overrides, config_name)


SCHEMA_SUFFIX = "_schema"  # rlmix.config.schema.register_configs' names: each group's typed keys


def _check_no_schema_chosen(overrides: list[str]) -> None:
    """``correction=correction_schema`` would compose: the group's schema sits beside its options (the
    options extend it), and composes to the schema's defaults, which no option is. Refused in one line."""
    for override in overrides:
        key, eq, value = override.lstrip("+~").partition("=")
        if eq and "." not in key and not key.startswith("hydra/") and value.strip().endswith(SCHEMA_SUFFIX):
            raise ConfigError(f"{key}={value}: that is the {key} group's schema (its keys and types), not an option; "
                              f"`rlmix train --help` lists the {key} options")


def _check_added_pools(overrides: list[str], config_name: str) -> None:
    """``+fleet.pools.<name>={...}`` adds a pool; under a name the fleet already has, Hydra would merge
    the value into that pool instead (a pool neither the fleet's nor the one asked for): refused."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    added = {o.input_line: o.key_or_group.split(".", 2)[2] for o in parsed
             if o.is_add() and o.key_or_group.startswith("fleet.pools.") and o.key_or_group.count(".") == 2}
    if not added:
        return
    pools = compose(config_name=config_name, overrides=[o for o in overrides if o not in added]).fleet.pools
    for line, name in added.items():
        if name in pools:
            raise ConfigError(f"{line.split('=', 1)[0]}: the fleet already has a pool {name}; set its fields with "
                              f"fleet.pools.{name}.<field>=..., or add the new pool under another name")


def composed(cfg) -> dict:
    """A composed config as it compares to another (interpolations unresolved, without ``hydra``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=False)


def job_key(overrides: list[str]) -> tuple[str, ...]:
    """A job's identity: its config overrides, without Hydra's own (``hydra.run.dir=`` and the like,
    which Hydra keeps apart from the job's task overrides)."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith("hydra."))


class Job(NamedTuple):
    """One job of a run or sweep, as the preflight planned it."""

    key: tuple[str, ...]  # job_key: how Hydra's job finds its plan
    plan: object  # its RunPlan
    label: str  # a sweep job's swept overrides (naming.job_label); a single run's name
    run_dir: Path | None  # a sweep job's directory (in the sweep directory the preflight saw)
    kept: dict | None = None  # a continued sweep's job that failed with no checkpoint: its summary, kept as it is
    config: dict | None = None  # the config it was planned from (``composed``): Hydra's job must have composed the same
    mode: object = None  # the ``hydra.mode`` its config sets (None: the command line's ``-m`` decides)
    shared_dir: Path | None = None  # the one sweep directory given to Hydra for jobs that named theirs apart


def preflight(args: list[str]) -> dict[tuple[str, ...], object]:
    """Every job of ``args`` composed, planned and checked against this machine: ``{job_key: RunPlan}``
    (empty for ``--help`` and the like); ConfigError on the first job that fails."""
    return {job.key: job.plan for job in plan_jobs(args)}


def plan_jobs(args: list[str]) -> list[Job]:
    """``preflight``'s jobs, in the order Hydra runs them, with their labels and sweep directories."""
    from rlmix.commands.naming import job_label

    overrides, multirun, info = split_args(args)
    flags = {a.split("=")[0] for a in args} & _INFO_FLAGS
    if multirun and flags & _PRINTING_FLAGS:  # Hydra's answer: a ValueError and its traceback
        raise ConfigError(f"{min(flags & _PRINTING_FLAGS)} prints one config, -m runs a sweep: Hydra takes one of "
                          "them; leave out -m (and give one value per key) to see a job's config")
    if info and not flags <= _COMPOSING_FLAGS:
        return []  # --help and the like: nothing is composed
    source = config_source(args)
    try:
        jobs = expand_jobs(overrides, multirun)
    except ConfigError:
        raise
    except Exception as err:
        from rlmix.config.load import one_line

        raise ConfigError(one_line(err)) from None
    if info:  # Hydra prints the config, which must compose
        if len(jobs) > 1 and flags & {"--help", "-h"}:  # Hydra's help composes one (a traceback, for a sweep)
            raise ConfigError("--help shows one config: give each key one value (a sweep's lists compose one job each)")
        for job in jobs:
            _check_composes(job, source)
        return []
    from rlmix.assembly.checkpoints import check_resume
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.metrics.logger import check_wandb_login
    from rlmix.orchestration.hardware import check_machine
    from rlmix.orchestration.runner import check_continues, ended_run

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    made = [_compose(job, output_dir_key=key, job_num=num if multirun else None, source=source)
            for num, job in enumerate(jobs)]
    shared = shared_sweep_dir(overrides, [(plan.cfg.name, sweep_dir) for plan, sweep_dir, *_ in made]) \
        if multirun else None
    if shared is not None:
        from rlmix.assembly.rules import check_output_dir

        check_output_dir(key, shared)
    planned = []
    for job, (plan, sweep_dir, job_dir, config, mode) in zip(jobs, made):
        if shared is not None:
            sweep_dir, job_dir = shared, str(Path(shared) / Path(job_dir).relative_to(sweep_dir))
        check_machine(plan.cfg)  # GPUs asked for exist here, before Ray or a run dir
        check_wandb_login(plan.cfg.logger.wandb)  # online needs an API key: refused before Ray, not after
        kept = None
        if multirun:
            plan, kept = sweep_job(plan, Path(sweep_dir), Path(job_dir), len(jobs))
        check_resume(plan.cfg.resume)
        if plan.cfg.resume and ended_run(Path(plan.cfg.resume), plan.cfg.loop.steps) is None:
            check_continues(plan.cfg, resolve_model_dir(plan))  # before Hydra writes the run's .hydra/ anew
        label = job_label(job_key(job), plan.cfg.name, plan.cfg.seed) if multirun else plan.cfg.name
        planned.append(Job(job_key(job), plan, label, Path(job_dir) if multirun else None, kept, config, mode,
                           None if shared is None else Path(shared)))
    return planned


def shared_sweep_dir(overrides: list[str], dirs: list[tuple[str, str]]) -> str | None:
    """One directory for a sweep whose jobs name their sweep directory apart, from ``(name, sweep dir)`` per
    job; None where they share one name, or where the command line gives ``hydra.sweep.dir``. Hydra resolves
    ``hydra.sweep.dir`` (``..._${name}``) per job, and ``+experiment=grpo,sc_mis`` sets a name per job: its
    jobs went to ``<time>_grpo`` and ``<time>_sc_mis`` and the sweep's record to ``<time>_default``, so
    neither ``rlmix report`` nor ``resume=`` saw the sweep whole. Shared: ``<time>_grpo+sc_mis``, the
    names in job order (the first job's directory where the pattern does not end in the name), at the first
    job's ``${now:}``: each job here was composed apart, so their times may differ by a second where Hydra's
    jobs share its own."""
    names = list(dict.fromkeys(n for n, _ in dirs))
    if len(names) < 2 or any(o.split("=", 1)[0].lstrip("+~") == "hydra.sweep.dir" for o in overrides):
        return None
    (name, first), names = dirs[0], "+".join(names)
    head = Path(first)
    if not head.name.endswith(f"_{name}"):
        return first
    return str(head.with_name(head.name[: -len(name)] + names))


def shared_dir_args(args: list[str], jobs: list[Job]) -> list[str]:
    """``args`` with the jobs' shared sweep directory (``shared_sweep_dir``) given to Hydra, where there is one."""
    shared = jobs[0].shared_dir if jobs else None
    if shared is None:
        return args
    return [*args, f"hydra.sweep.dir={hydra_quoted(str(shared))}"]


@contextmanager
def mode_known(jobs: list[Job]):
    """Hydra's ``run`` and ``multirun`` compose the whole config once more only to read ``hydra.mode``
    (``Hydra.get_mode``, 0.3 s before Ray starts); the preflight read it already, from the same config
    and overrides (a sweep's first job stands for the sweep: ``hydra.mode`` is no value to sweep)."""
    from hydra._internal.hydra import Hydra

    original = Hydra.__dict__.get("get_mode")
    if not jobs or original is None:  # nothing planned (Hydra handles --help and the like), or another Hydra
        yield
        return
    Hydra.get_mode = lambda self, config_name, overrides: jobs[0].mode
    try:
        yield
    finally:
        Hydra.get_mode = original


def is_sweep_dir(path: str | Path | None) -> bool:
    return path is not None and (Path(path) / MULTIRUN_FILE).is_file()


def logged_run(run_dir: Path) -> str:
    """What in ``run_dir`` shows that a run trained there ("" for nothing): rows in its metrics.jsonl,
    or a checkpoint, complete or not."""
    from rlmix.assembly.checkpoints import CHECKPOINTS
    from rlmix.metrics.jsonl import METRICS_FILE

    metrics = run_dir / METRICS_FILE
    held = [METRICS_FILE] if metrics.is_file() and metrics.stat().st_size > 0 else []
    return ", ".join(held + [CHECKPOINTS] * any((run_dir / CHECKPOINTS).glob("step_*")))


def sweep_job(plan, sweep_dir: Path, job_dir: Path, jobs: int):
    """``(plan, kept summary)`` of a sweep job that runs in ``job_dir``; ConfigError where it cannot.

    A new sweep's job directory holds no run (Hydra would run the job on top of it). ``resume=`` names
    one run, so a sweep of several jobs cannot share it, but ``resume=<sweep dir>`` continues a sweep
    in place, job by job: a job with a complete checkpoint resumes from it (one that had ended trains
    nothing unless ``loop.steps`` is raised), a job that never trained starts, and one that failed
    before its first checkpoint is kept as it ended, as sweep tools keep errored trials. A job that
    stopped before its first checkpoint any other way can do neither in place: refused.
    """
    import json

    from rlmix.assembly.checkpoints import latest_checkpoint
    from rlmix.assembly.rules import held_run

    resume = plan.cfg.resume
    if resume is None:  # as rules.check_new_run_dir for a single run
        if held := held_run(job_dir):
            raise ConfigError(f"hydra.sweep.dir={sweep_dir}: {job_dir} already holds a run ({', '.join(held)}): "
                              f"continue the sweep with resume={sweep_dir}, or give this sweep a directory of its own")
        return plan, None
    if not is_sweep_dir(resume):
        if jobs > 1:
            raise ConfigError(f"resume={resume}: each of the {jobs} jobs of this sweep would continue that one run; "
                              "resume a run without -m, or continue a sweep with resume=<its sweep directory>")
        return plan, None
    if Path(resume).resolve() != sweep_dir.resolve():
        raise ConfigError(f"resume={resume} continues that sweep in its own directory, not in "
                          f"hydra.sweep.dir={sweep_dir}")
    if latest_checkpoint(job_dir) is not None:
        return replace(plan, cfg=replace(plan.cfg, resume=str(job_dir))), None
    fresh = replace(plan, cfg=replace(plan.cfg, resume=None))
    held = logged_run(job_dir)
    if not held:
        return fresh, None
    try:
        summary = json.loads((job_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    if summary.get("status") == "failed":
        return fresh, summary
    raise ConfigError(f"resume={resume}: {job_dir} holds a run ({held}) that stopped before its first complete "
                      "checkpoint: it can neither continue nor start again there; move it out of the sweep "
                      "directory to train that job again")


def resume_in_place(args: list[str]) -> list[str]:
    """``resume=<dir>`` continues in ``<dir>``: Hydra's run dir defaults to it rather than a new one, and
    so does a sweep's directory when ``<dir>`` is a sweep's."""
    overrides, multirun, _ = split_args(args)
    resume = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    if not resume or any(o.startswith(key) for o in overrides):
        return args
    if multirun and not is_sweep_dir(_value(resume[-1])):
        return args
    return [*args, f"{key}{resume[-1]}"]


def _value(value: str) -> str | None:
    """An override's value as Hydra reads it (``'a=b'`` → ``a=b``); None where it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return str(OverridesParser.create().parse_override(f"resume={value}").value())
    except Exception:
        return None


def command_line(task_overrides: list[str], config_args: list[str] | tuple[str, ...] = ()) -> str:
    """The command that reproduces this job, without ``resume=`` (the caller appends its own);
    ``config_args`` (``repeated_source``) first."""
    import shlex

    kept = [o for o in task_overrides if not o.startswith("resume=")]
    return " ".join(["rlmix", "train", *map(shlex.quote, [*config_args, *kept])])


def repeated_source(args: list[str]) -> list[str]:
    """What a command that repeats a job of ``args`` needs besides its task overrides: the
    ``--config-dir`` and ``--config-name`` flags and the ``hydra.searchpath`` overrides."""
    return [*config_source(args).args(), *searchpath_args(args)]
