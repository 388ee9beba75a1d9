"""Composing ``train.yaml`` into a resolved ``RunPlan`` (``rlmix.assembly.plan``): shared by every command.

Before ``rlmix train`` hands over to Hydra, a preflight composes and plans EVERY job of the requested run or sweep
with the Compose API, so a typo in the fifth job of a sweep fails in a second with one line —
not after four runs, and not with a traceback or a half-written run directory. The same preflight
checks that a local run's GPU pools fit the GPUs of this machine (rlmix/orchestration/hardware.py).
It returns the plans, keyed by ``job_key``, so Hydra's job runs the plan already made instead of
resolving its config a second time.
"""

from __future__ import annotations

from rlmix.errors import ConfigError

CONFIG_MODULE = "rlmix.conf"
CONFIG_NAME = "train"
# Hydra flags that print or inspect instead of running: Hydra handles those itself.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}


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
        if eq and key.lstrip("+~") in PATH_KEYS and value[:1] not in ("'", '"') \
                and _HYDRA_SPECIAL & set(value) and Path(value).expanduser().exists():
            arg = f"{key}='" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        out.append(arg)
    return out


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
    from rlmix.commands.naming import set_swept_keys, swept_keys

    set_swept_keys(())
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    set_swept_keys(swept_keys(parsed))
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


def compose_run_config(overrides: list[str], for_training: bool = True, output_dir_key: str | None = None,
                       run=None):
    """``compose_plan(...).cfg``: the validated ``RunConfig`` alone."""
    return compose_plan(overrides, for_training, output_dir_key, run).cfg


def compose_plan(overrides: list[str], for_training: bool = True, output_dir_key: str | None = None, run=None):
    """Compose ``train.yaml`` with ``overrides`` and resolve it (``rlmix.assembly.plan.plan_run``) into a
    ``RunPlan`` (ConfigError on bad input).

    ``output_dir_key`` (``hydra.run.dir`` or ``hydra.sweep.dir``): also check that this directory
    can be created and written, before Hydra creates it. ``run`` (``run_settings.RunSettings``):
    start from a run's task, model and generation length; ``overrides`` win.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    from rlmix.assembly.plan import plan_run
    from rlmix.assembly.rules import check_new_run_dir, check_output_dir
    from rlmix.config.load import one_line, to_run_config
    from rlmix.config.schema import register_configs

    from rlmix.commands.run_settings import apply_run_settings, group_overrides

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            groups = overrides if run is None else group_overrides(run, overrides)
            cfg = compose(config_name=CONFIG_NAME, overrides=groups, return_hydra_config=output_dir_key is not None)
            if run is not None:
                apply_run_settings(cfg, run, overrides)
            if output_dir_key is not None:
                out_dir = OmegaConf.select(cfg, output_dir_key)
                with open_dict(cfg):
                    del cfg["hydra"]
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(one_line(err)) from None
    finally:
        GlobalHydra.instance().clear()
    plan = plan_run(to_run_config(cfg), for_training=for_training)
    if output_dir_key is not None:
        check_output_dir(output_dir_key, out_dir)
        if output_dir_key == "hydra.run.dir" and plan.cfg.resume is None:
            check_new_run_dir(output_dir_key, out_dir)
    return plan


def job_key(overrides: list[str]) -> tuple[str, ...]:
    """A job's identity: its config overrides, without Hydra's own (``hydra.run.dir=`` and the like,
    which Hydra keeps apart from the job's task overrides)."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith("hydra."))


def preflight(args: list[str]) -> dict[tuple[str, ...], object]:
    """Every job of ``args`` composed, planned and checked against this machine: ``{job_key: RunPlan}``
    (empty for ``--help`` and the like); ConfigError on the first job that fails."""
    overrides, multirun, info = split_args(args)
    if info:
        return {}
    try:
        jobs = expand_jobs(overrides, multirun)
    except Exception as err:
        from rlmix.config.load import one_line

        raise ConfigError(one_line(err)) from None
    from rlmix.assembly.checkpoints import check_resume
    from rlmix.orchestration.hardware import check_machine

    plans = {}
    for job in jobs:
        plan = compose_plan(job, output_dir_key="hydra.sweep.dir" if multirun else "hydra.run.dir")
        check_machine(plan.cfg)  # GPUs asked for exist here, before Ray or a run dir
        check_resume(plan.cfg.resume)
        plans[job_key(job)] = plan
    return plans


def resume_in_place(args: list[str]) -> list[str]:
    """``resume=<dir>`` continues in ``<dir>``: Hydra's run dir defaults to it rather than a new one."""
    overrides, multirun, _ = split_args(args)
    resume = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    if multirun or not resume or any(o.startswith("hydra.run.dir=") for o in overrides):
        return args
    return [*args, f"hydra.run.dir={resume[-1]}"]


def command_line(task_overrides: list[str]) -> str:
    """The command that reproduces this job, without ``resume=`` (the caller appends its own)."""
    import shlex

    kept = [o for o in task_overrides if not o.startswith("resume=")]
    return " ".join(["rlmix", "train", *map(shlex.quote, kept)])
