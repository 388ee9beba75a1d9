"""Each task's own configuration rules, registered with validation (``rlmix.config.load``).

Importing this module installs them. The checks import their task lazily, so registering stays
cheap; ``rlmix.config`` itself never imports a task implementation.
"""

from __future__ import annotations

from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.load import register_task_check
from rlmix.config.schema import MiniCodeTaskConfig, RunConfig


def check_dataset_task(cfg: RunConfig, for_training: bool) -> None:
    """Files load, fields exist, the reward imports and returns a number, the run fits ``task.epochs``."""
    from rlmix.tasks.dataset import check_config

    trained_prompts = cfg.loop.steps * cfg.loop.groups_per_step if for_training else 0
    check_config(cfg.task, cfg.seed, trained_prompts)


def check_minicode_task(cfg: RunConfig, for_training: bool) -> None:
    """Nothing beyond the schema: the constructor checks ``task.levels``."""


register_task_check(DatasetTaskConfig, check_dataset_task)
register_task_check(MiniCodeTaskConfig, check_minicode_task)
