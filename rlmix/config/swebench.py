"""Typed configuration of the SWE-bench Pro / HARD-51 evaluation (docs/math.md §7).

Light on purpose: no heavy imports, so the CLI can register it in Hydra's ConfigStore as the
``task=swebench_pro`` group option without importing the harness. Every field is typed with a
default; the default lives here and nowhere else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

UNSET = "???"  # Hydra's "mandatory value"; "" is read as unset too


class RuntimeKind(enum.Enum):
    """Where agent commands and the verifier run. Member names are the YAML spelling."""

    local = "local"  # temporary working copy, commands isolated by bubblewrap (tests, embedded tasks)
    docker = "docker"  # the task's image, network off during the agent phase


@dataclass
class SwebenchProConfig:
    """``task=swebench_pro``: Harbor task directories evaluated with a multi-turn shell agent."""

    name: str = "swebench_pro"  # the task group option's name (how the CLI tells task configs apart)
    # Directory holding one Harbor task directory per instance. "???" or "" means unset (an error).
    tasks_dir: str = UNSET
    # Name of the subset reported beside the whole set ("hard51"), or "all" for no subset.
    subset: str = "hard51"
    # File listing the subset's instance ids, one per line ("#" comments); required unless subset=all.
    subset_file: Optional[str] = None
    # The subset must have exactly this many ids (51 for HARD-51); null skips the check.
    expected_subset_size: Optional[int] = 51
    # False: evaluate only the subset's tasks. True: evaluate every task, report the whole set and the subset.
    eval_all_tasks: bool = False
    runtime: RuntimeKind = RuntimeKind.local
    # True: the tasks are your own, so the local runtime may run them without isolation where
    # bubblewrap cannot run (it still isolates wherever it can). False: such tasks are refused.
    trusted: bool = False
    # --- agent episode limits ---
    max_turns: int = 50  # policy actions per episode
    turn_timeout_s: float = 120.0  # wall-clock limit of one shell command
    # Wall-clock limit of the whole agent phase; null uses the task's [agent] timeout_sec.
    agent_timeout_s: Optional[float] = None
    max_total_tokens: int = 32768  # prompt + observations + policy tokens of one episode
    max_format_errors: int = 3  # malformed actions in one episode before it ends
    max_output_chars: int = 4000  # command output shown to the policy (head and tail kept)
    command_output_cap_bytes: int = 1048576  # output read from one command; the rest is dropped while read
    # --- grading ---
    grade_retries: int = 2  # extra attempts after an infrastructure failure (agent phase or grading)
    grade_network: bool = False  # give the verifier the network (the agent phase never has it)
    # --- local runtime limits ---
    local_memory_mb: Optional[int] = None  # RLIMIT_AS per command; null uses the task's memory_mb
    # RLIMIT_NPROC per command; the kernel counts every process of the user the sandboxes run as
    # (nobody when the runner is root), so concurrent episodes share it.
    local_max_procs: int = 512
    local_cpu_s: Optional[int] = None  # RLIMIT_CPU per command; null = 2 x turn_timeout_s
    # --- docker runtime ---
    docker_image_prefix: str = "rlmix-swebench"  # tag of images built from environment/Dockerfile

    def tasks_dir_set(self) -> bool:
        return self.tasks_dir not in (UNSET, "")
