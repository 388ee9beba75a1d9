"""Typed configuration of the agentic tasks: SWE-bench Pro / HARD-51 (docs/math.md §7) and minicode_agent.

Light on purpose: no heavy imports, so the CLI can register it in Hydra's ConfigStore as the
``task=swebench_pro`` and ``task=minicode_agent`` group options without importing the harness. Every field is typed with a
default; the default lives here and nowhere else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

UNSET = "???"  # Hydra's "mandatory value"; "" is read as unset too


class RuntimeKind(enum.Enum):
    """Where agent commands and the verifier run. Member names are the YAML spelling."""

    local = "local"  # temporary working copy, commands isolated by bubblewrap (tests, embedded tasks)
    docker = "docker"  # the task's image, network off during the agent phase


@dataclass
class AgentEnvConfig:
    """What every agentic task shares: episode limits, the runtime, grading. Defaults suit SWE-bench Pro."""

    name: str = "agent"  # the task group option's name (how the CLI tells task configs apart)
    runtime: RuntimeKind = RuntimeKind.local
    # True: the tasks are your own, so the local runtime may run them without isolation where
    # bubblewrap cannot run (it still isolates wherever it can). False: such tasks are refused.
    trusted: bool = False
    # null: the built-in instructions of rlmix.agentic.actions.SYSTEM_PROMPT; "": no system message.
    system_prompt: Optional[str] = None
    # --- agent episode limits ---
    max_turns: int = 50  # policy actions per episode
    turn_timeout_s: float = 120.0  # wall-clock limit of one shell command
    # Wall-clock limit of the whole agent phase; null uses the task's [agent] timeout_sec.
    agent_timeout_s: Optional[float] = None
    max_total_tokens: int = 32768  # prompt + observations + policy tokens of one episode
    max_turn_tokens: int = 2048  # tokens one policy turn may generate (replaces loop.max_new_tokens)
    max_format_errors: int = 3  # malformed actions in one episode before it ends
    max_output_chars: int = 4000  # command output shown to the policy (head and tail kept)
    command_output_cap_bytes: int = 1048576  # output read from one command; the rest is dropped while read
    # --- episodes run concurrently: inside each sampler process in training, and in rlmix eval (docs/agentic.md) ---
    # Episodes in flight per sampler (in rlmix eval: in the evaluation); 0 = a whole request (evaluation) at once.
    concurrent_episodes: int = 16
    # A turn joins the torch sampler's running decode batch at the next step, and returns when it is
    # done (continuous batching); false: turns wait for the sampler's current call to end.
    continuous_batching: bool = True
    # --- grading ---
    grade_retries: int = 2  # extra attempts after an infrastructure failure (agent phase or grading)
    grade_network: bool = False  # give the verifier the network (the agent phase never has it)
    # --- local runtime limits ---
    local_memory_mb: Optional[int] = None  # RLIMIT_AS per command; null uses the task's memory_mb
    # RLIMIT_NPROC per command, counted per sandbox from Linux 5.14 (before, every process of the
    # user the sandboxes run as, nobody when the runner is root, so concurrent episodes share it).
    local_max_procs: int = 512
    local_cpu_s: Optional[int] = None  # RLIMIT_CPU per command; null = 2 x turn_timeout_s
    # One sandbox per working copy, kept up across its commands, which kills what each command
    # leaves behind; false: a new sandbox for every command (slower, isolated alike; docs/hard51.md).
    local_resident: bool = True
    # --- docker runtime ---
    docker_image_prefix: str = "rlmix-swebench"  # tag of images built from environment/Dockerfile


@dataclass
class SwebenchProConfig(AgentEnvConfig):
    """``task=swebench_pro``: Harbor task directories with a multi-turn shell agent (eval and train)."""

    name: str = "swebench_pro"
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

    def tasks_dir_set(self) -> bool:
        return self.tasks_dir not in (UNSET, "")


@dataclass
class MiniCodeAgentConfig(AgentEnvConfig):
    """``task=minicode_agent``: minicode problems solved with a tool in a sandbox (rlmix.embedded.minicode_agent)."""

    name: str = "minicode_agent"
    levels: list[int] = field(default_factory=lambda: [1, 2])
    split: str = "test"  # evaluation: "test" or "hard51" (minicode's splits)
    trusted: bool = True  # the tasks are generated by rlmix itself
    system_prompt: Optional[str] = ""  # the embedded model learnt the format without one
    max_turns: int = 6
    turn_timeout_s: float = 10.0
    agent_timeout_s: Optional[float] = 120.0
    max_total_tokens: int = 480  # the embedded agent model's context is 512
    max_turn_tokens: int = 64
    max_format_errors: int = 2
    max_output_chars: int = 200
    grade_retries: int = 1
