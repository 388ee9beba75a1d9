"""Each task's own configuration rules: ``task_check(task)(run, for_training)``.

``rlmix.assembly.plan.plan_run`` calls the rule of the run's task after the config's own rules.
The rules import their task lazily, so reading this table stays cheap; ``rlmix.config`` itself
never imports a task implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.schema import MiniCodeTaskConfig, RunConfig
from rlmix.config.swebench import AgentEnvConfig, MiniCodeAgentConfig, SwebenchProConfig
from rlmix.errors import ConfigError

T = TypeVar("T")

# (run config, training?) -> None, or ConfigError naming the task's key
TaskCheck = Callable[[RunConfig, bool], None]


def check_dataset_task(cfg: RunConfig, for_training: bool) -> None:
    """Files load, fields exist, the reward imports and returns a number, the run fits ``task.epochs``;
    ``task.train_files`` is set for training (eval and probe may read ``task.eval_files`` alone)."""
    from rlmix.tasks.dataset import check_config

    trained_prompts = cfg.loop.steps * cfg.loop.groups_per_step if for_training else 0
    check_config(cfg.task, cfg.seed, trained_prompts, for_training)


def check_minicode_task(cfg: RunConfig, for_training: bool) -> None:
    """Nothing beyond the schema: the constructor checks ``task.levels``."""


def check_agent_task(cfg: RunConfig, for_training: bool) -> None:
    """The agent task's own fields; the runtime, the tasks and the model's room are checked by
    ``rlmix.agentic.train.check_agent_run`` before any process starts."""
    task = cfg.task
    _require(task.max_turns >= 1, f"task.max_turns={task.max_turns}: must be >= 1")
    _require(task.max_turn_tokens >= 1, f"task.max_turn_tokens={task.max_turn_tokens}: must be >= 1")
    _require(task.max_total_tokens >= 2, f"task.max_total_tokens={task.max_total_tokens}: must be >= 2")
    _require(task.concurrent_episodes >= 0,
             f"task.concurrent_episodes={task.concurrent_episodes}: must be >= 0 (0 = all of a request at once)")
    _require(task.max_format_errors >= 1, f"task.max_format_errors={task.max_format_errors}: must be >= 1")


def check_minicode_agent_task(cfg: RunConfig, for_training: bool) -> None:
    check_agent_task(cfg, for_training)
    bad = [lv for lv in cfg.task.levels if lv not in (1, 2, 3)]
    _require(bool(cfg.task.levels) and not bad, f"task.levels={list(cfg.task.levels)}: each level must be in 1..3")


def check_swebench_task(cfg: RunConfig, for_training: bool) -> None:
    check_agent_task(cfg, for_training)
    task = cfg.task
    if for_training:
        _require(task.tasks_dir_set(), "task.tasks_dir is not set: point it at a directory of Harbor task "
                 "directories (docs/agentic.md, \"Bringing Harbor tasks\")")
        # Before the model is resolved: a typo must not cost a first run the embedded agent's build.
        _require(Path(task.tasks_dir).is_dir(), f"task.tasks_dir={task.tasks_dir} is not a directory")


TASK_CHECKS: dict[type, TaskCheck] = {
    DatasetTaskConfig: check_dataset_task,
    MiniCodeTaskConfig: check_minicode_task,
    MiniCodeAgentConfig: check_minicode_agent_task,
    SwebenchProConfig: check_swebench_task,
    AgentEnvConfig: check_agent_task,
}


def by_config_class(table: Mapping[type, T], config: object, name: str) -> T:
    """``table``'s entry for ``config``'s class, or for its nearest base class that has one; a
    ``KeyError`` naming the table (``name``) when none has."""
    for cls in type(config).__mro__:
        if cls in table:
            return table[cls]
    raise KeyError(f"no entry for task config {type(config).__name__}: add it to {name}")


def task_check(task: object) -> TaskCheck:
    """The rule of ``task``'s config class, or of its nearest base class that has one."""
    return by_config_class(TASK_CHECKS, task, "rlmix.tasks.checks.TASK_CHECKS")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
