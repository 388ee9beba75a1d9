"""``rlmix eval``: pass@k of a checkpoint on a task split (``rlmix.eval.evaluate``), with a run
directory's own task, model and generation length unless the arguments say otherwise."""

from __future__ import annotations

import torch

from rlmix.config.schema import RunConfig
from rlmix.errors import ConfigError
from rlmix.eval.evaluate import evaluate
from rlmix.isolation.scratch import run_scratch


def run_of(args: list[str]):
    """The settings of the run ``checkpoint=`` names (None: a model dir, the base model)."""
    from rlmix.commands.run_settings import checkpoint_dir, run_settings
    from rlmix.config.load import one_line

    try:
        where = checkpoint_dir(args)
    except Exception as err:
        raise ConfigError(one_line(err)) from None
    return None if where is None else run_settings(where)


def eval_config(args: list[str]) -> RunConfig:
    """The validated config of ``rlmix eval args``: a run directory's own task, model and
    ``max_new_tokens`` unless ``args`` say otherwise; a dataset without held-out rows is refused
    at ``task.split=test`` before any model loads."""
    from rlmix.commands.compose import compose_run_config
    from rlmix.config.dataset import DatasetTaskConfig

    cfg = compose_run_config(args, for_training=False, run=run_of(args))
    if isinstance(cfg.task, DatasetTaskConfig) and cfg.task.split == "test" and cfg.task.eval_files is None:
        raise ConfigError("task.split=test: this task has no task.eval_files (rows held out for evaluation); "
                          "give task.eval_files=<file> or evaluate the training rows with task.split=train")
    return cfg


def run_eval(args: list[str]) -> None:
    """``rlmix eval``: ``eval_config(args)`` evaluated, with a progress line per task."""
    from rlmix.metrics.console import CountedLines

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    cfg = eval_config(args)
    with run_scratch(), CountedLines("eval") as progress:  # sandboxes go with the command, however it ends
        evaluate(cfg, progress)
