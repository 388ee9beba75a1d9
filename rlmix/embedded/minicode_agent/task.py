"""``task=minicode_agent``'s problem source: minicode problems written as Harbor task directories.

Training draws problems (``sample``) and writes each as a task directory the sandbox runs
(``harbor_task``); ``rlmix eval task=minicode_agent`` writes a whole split and evaluates it as a
directory of Harbor tasks (``minicode_agent_eval_config``), with the episode code training uses.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from rlmix.agentic.harbor import HarborTask
from rlmix.config.swebench import AgentEnvConfig, MiniCodeAgentConfig, SwebenchProConfig
from rlmix.embedded.minicode import MiniCode
from rlmix.embedded.minicode_agent import write_task
from rlmix.isolation.scratch import scratch_dir
from rlmix.tasks.base import Problem


class MiniCodeAgentTask:
    """minicode problems as sandboxed agent tasks (an ``rlmix.agentic.train.AgentTask``)."""

    name = "minicode_agent"

    def __init__(self, levels: tuple[int, ...], seed: int, root: Path | None = None):
        self.minicode = MiniCode(levels=levels, seed=seed)
        self._root = Path(root) if root is not None else None

    @property
    def root(self) -> Path:
        """Where the task directories go; a temporary directory made on first use (in the sampler process)."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="rlmix-minicode-agent-", dir=scratch_dir()))
        return self._root

    def sample(self, n: int, seed: int) -> list[Problem]:
        return self.minicode.sample(n, seed)

    def split(self, name: str) -> list[Problem]:
        return self.minicode.split(name)

    def harbor_task(self, problem: Problem) -> HarborTask:
        return write_task(self.root, problem)

    def release(self, task: HarborTask) -> None:
        shutil.rmtree(task.path, ignore_errors=True)  # a long run would otherwise fill the temporary directory

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def minicode_agent_eval_config(cfg: MiniCodeAgentConfig, root: Path) -> tuple[SwebenchProConfig, dict[str, list[str]]]:
    """``rlmix eval task=minicode_agent``: the split's problems written as Harbor tasks under ``root``,
    evaluated by the same episode code as training (``run_swebench_eval``) with the same limits; and
    the task ids of each level (``level1``.., reported as sets of their own beside ``all``)."""
    task = MiniCodeAgentTask(tuple(cfg.levels), seed=0, root=root)
    levels: dict[str, list[str]] = {}
    for problem in task.split(cfg.split):
        levels.setdefault(f"level{problem.difficulty}", []).append(task.harbor_task(problem).task_id)
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(AgentEnvConfig) if f.name != "name"}
    return SwebenchProConfig(**shared, tasks_dir=str(root), subset="all", expected_subset_size=None), levels
