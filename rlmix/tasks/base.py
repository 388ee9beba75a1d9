"""The task interface: prompts in, verifiable rewards out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str  # the text the policy continues
    difficulty: int
    payload: object = None  # task-private data (hidden tests); never shown to the policy
    messages: tuple[dict[str, str], ...] | None = None  # chat form of the prompt; None: one user turn


@dataclass(frozen=True)
class Score:
    reward: float  # 1.0 iff the answer is well-formed and correct
    format_ok: bool  # False is a format error, counted apart from a wrong answer
    error: str | None = None  # the reward function raised: excluded from its group, counted
    exploit_suspected: bool = False  # the grader caught a known reward hack (reward 0), counted


class Task(Protocol):
    name: str

    def sample(self, n: int, seed: int) -> list[Problem]:
        """n training problems, deterministic in seed."""

    def split(self, name: str) -> list[Problem]:
        """A fixed evaluation split ("test", "hard51", ...)."""

    def score(self, problem: Problem, completion: str) -> Score: ...


@runtime_checkable
class OrderedTask(Task, Protocol):
    """A task whose training problems form one stream (a dataset's rows, epoch after epoch)."""

    def sample_at(self, position: int, n: int) -> list[Problem]:
        """Problems ``position .. position + n - 1`` of the stream: a function of the position alone."""
