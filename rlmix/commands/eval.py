"""``rlmix eval``: pass@k of a checkpoint on a task split (``rlmix.eval.evaluate``), with a run
directory's own task, model and generation length unless the arguments say otherwise."""

from __future__ import annotations

import torch

from rlmix.assembly.plan import RunPlan
from rlmix.errors import ConfigError
from rlmix.eval.evaluate import evaluate, saved_by
from rlmix.isolation.scratch import run_scratch


def run_of(args: list[str]):
    """The settings of the run ``checkpoint=`` names, itself or by one of its ``checkpoints/step_N``
    (None: a model dir, the base model)."""
    from rlmix.commands.run_settings import checkpoint_dir, run_settings
    from rlmix.config.load import one_line

    try:
        where = checkpoint_dir(args)
    except Exception as err:
        raise ConfigError(one_line(err)) from None
    return None if where is None else run_settings(saved_by(where) or where)


def eval_plan(args: list[str]) -> RunPlan:
    """The plan of ``rlmix eval args``: a run directory's own task, model and ``max_new_tokens``
    unless ``args`` say otherwise; a dataset without held-out rows is refused at ``task.split=test``,
    and a minicode split it does not have at the one given, before any model loads.
    ``logger.wandb.mode=online`` with no W&B API key is refused here too, as ``rlmix train`` refuses it:
    found only once the scores are in, it left them in an offline W&B run."""
    from rlmix.commands.compose import compose_plan
    from rlmix.config.dataset import DatasetTaskConfig
    from rlmix.metrics.logger import check_wandb_login

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


def run_eval(args: list[str]) -> None:
    """``rlmix eval``: ``eval_plan(args)`` evaluated, with a progress line per task."""
    from rlmix.metrics.console import CountedLines

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    plan = eval_plan(args)
    with run_scratch(), CountedLines("eval") as progress:  # sandboxes go with the command, however it ends
        evaluate(plan, progress)
