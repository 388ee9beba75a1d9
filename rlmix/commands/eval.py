"""``rlmix eval``: pass@k of a checkpoint on a task split (``rlmix.eval.evaluate``), with a run
directory's own task, model and generation length unless the arguments say otherwise."""

from __future__ import annotations

import os
from enum import Enum
from typing import Any

import torch

from rlmix.assembly.plan import RunPlan
from rlmix.errors import ConfigError
from rlmix.eval.evaluate import Scoring, evaluate, saved_by
from rlmix.isolation.scratch import run_scratch

# The task keys the name of eval's directory holds already: the split (a Harbor task's subset).
NAMED_KEYS = {"task.name", "task.split", "task.subset"}


def refuse_hydra_overrides(args: list[str], command: str, out_key: str) -> None:
    """``hydra.*`` overrides (and ``hydra/...`` options) refused in one line: ``rlmix eval`` and ``rlmix probe``
    compose the config without running a Hydra app, so Hydra's run directory, logging and job settings
    would be taken and ignored (their output would go elsewhere). ``hydra.searchpath``, where configs are
    found, is honoured. ``out_key`` is the command's own output directory. Both run one job: ``-m`` and
    a swept value (``seed=0,1``) are refused too, saying where sweeps are run."""
    for arg in args:
        if arg in ("-m", "--multirun"):
            raise ConfigError(f"{arg}: rlmix {command} runs one job; -m/--multirun sweeps are rlmix train's "
                              "(rlmix train -m ...)")
        key = arg.partition("=")[0].lstrip("+~")
        if (key == "hydra" or key.startswith(("hydra.", "hydra/"))) and key != "hydra.searchpath":
            raise ConfigError(f"{arg}: rlmix {command} does not run as a Hydra app and would ignore {key}; "
                              f"give {out_key}=<dir> for where its result goes (hydra.searchpath= is honoured)")
    _refuse_sweeps(args, command)


def _refuse_sweeps(args: list[str], command: str) -> None:
    """A swept value (``seed=0,1``, ``range(...)``) in one line: the command runs one job. An override
    Hydra cannot read is left to composing, which says why."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in args:
        try:
            override = parser.parse_override(arg)
        except HydraException:
            continue
        if not override.is_sweep_override():
            continue
        value = override.value()
        listed = isinstance(value, ChoiceSweep) and value.simple_form
        as_list = f"a list is written {arg.partition('=')[0]}=[{arg.partition('=')[2]}], " if listed else ""
        raise ConfigError(f"{arg}: rlmix {command} runs one job; {as_list}sweeps are rlmix train -m")


def run_of(args: list[str]):
    """The settings of the run ``checkpoint=`` names, itself or by one of its ``checkpoints/step_N``
    (None: a model dir, the base model)."""
    from rlmix.commands.run_settings import checkpoint_dir, run_settings
    from rlmix.config.load import one_line

    try:
        where = checkpoint_dir(args)
    except Exception as err:
        raise ConfigError(one_line(err)) from None
    if where is None:
        return None
    try:
        return run_settings(saved_by(where) or where)
    except ConfigError as err:  # its .hydra files: named with the checkpoint= they came from
        raise ConfigError(f"checkpoint={where}: {err}") from None


def eval_plan(args: list[str]) -> RunPlan:
    """The plan of ``rlmix eval args``: a run directory's own task, model and ``max_new_tokens``
    unless ``args`` say otherwise; a dataset without held-out rows is refused at ``task.split=test``,
    and a minicode split it does not have at the one given, before any model loads.
    ``logger.wandb.mode=online`` with no W&B API key is refused here too, as ``rlmix train`` refuses it:
    found only once the scores are in, it left them in an offline W&B run."""
    from rlmix.commands.compose import compose_plan
    from rlmix.config.dataset import DatasetTaskConfig
    from rlmix.metrics.logger import check_wandb_login

    refuse_hydra_overrides(args, "eval", "eval.out_dir")
    plan = compose_plan(args, for_training=False, run=run_of(args))
    check_wandb_login(plan.cfg.logger.wandb)
    task = plan.cfg.task
    if isinstance(task, DatasetTaskConfig) and task.split == "test" and task.eval_files is None:
        raise ConfigError("task.split=test: this task has no task.eval_files (rows held out for evaluation); "
                          "give task.eval_files=<file> or evaluate the training rows with task.split=train")
    check_given_split(plan, args)
    return plan


def check_given_split(plan: RunPlan, args: list[str]) -> None:
    """minicode's default split, train, stands for test (in ``rlmix eval`` and ``rlmix probe``); given, it
    is refused like any other name the task lacks: training draws fresh problems, there is no train
    split to score or sample."""
    from rlmix.commands.run_settings import overridden_keys
    from rlmix.config.schema import MiniCodeTaskConfig

    if isinstance(plan.cfg.task, MiniCodeTaskConfig) and "task.split" in overridden_keys(args):
        plan.task.make(plan.cfg.seed).split(plan.cfg.task.split)


_MISSING = object()


def _value(cfg, key: str) -> Any:
    """The value of dotted ``key`` in a composed ``RunConfig`` (``_MISSING`` where it has none)."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def _normal(key: str, value: Any) -> Any:
    """``value`` as it compares and is recorded: an enum as its value, a node as a dict, a path
    setting's relative paths made absolute (from here, as a run's are from where it started)."""
    from dataclasses import asdict, is_dataclass

    from rlmix.commands.run_settings import PATH_VALUES

    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value):
        return {k: _normal(f"{key}.{k}", v) for k, v in asdict(value).items()}
    if isinstance(value, list):
        return [_normal(key, v) for v in value]
    if key in PATH_VALUES and isinstance(value, str) and "://" not in value:
        return os.path.normpath(os.path.abspath(os.path.expanduser(value)))
    return value


def task_differs(cfg, settings, args: list[str]) -> dict[str, Any]:
    """The task settings of the composed ``cfg`` that are not those of the run it evaluates
    (``settings``: ``run_of(args)``), dotted key -> value; {} for the run's own task settings, or
    where there is no run to differ from. Against the run's own task option every ``task.*`` value is
    compared (``task=<the run's option>`` resets those the command line leaves out); against another
    option (``task=minicode``), whose name the directory carries, those the command line gives. The
    split is in the directory's name already."""
    from rlmix.commands.run_settings import overridden_keys

    if settings is None:
        return {}
    given = {k for k in overridden_keys(args) if k.startswith("task.") and k not in NAMED_KEYS}
    own = settings.values.get("task.name") == cfg.task.name
    theirs = {k: v for k, v in settings.values.items() if k.startswith("task.") and k not in NAMED_KEYS} if own else {}
    differs = {}
    for key in sorted(given | {k for k in theirs if _value(cfg, k) is not _MISSING}):
        now = _value(cfg, key)
        now = None if now is _MISSING else _normal(key, now)
        if key not in theirs or now != _normal(key, theirs[key]):
            differs[key] = now
    return differs


def run_eval(args: list[str]) -> None:
    """``rlmix eval``: ``eval_plan(args)`` evaluated, with a progress line per task; task settings other than
    the run's own are scored in a directory of their own (``task_differs``, ``default_out_dir``)."""
    from rlmix.metrics.console import CountedLines

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    plan = eval_plan(args)
    scoring = Scoring(task_differs(plan.cfg, run_of(args), args), tuple(args))
    with run_scratch(), CountedLines("eval") as progress:  # sandboxes go with the command, however it ends
        evaluate(plan, progress, scoring)
