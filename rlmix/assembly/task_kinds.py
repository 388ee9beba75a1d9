"""What code above the tasks asks of a run's task, answered by its kind: ``task_kind(task_config)``.

Two kinds. A single-turn task (minicode, minicode_trace, dataset) answers each prompt with one
completion, scored as text; an episode task (any ``AgentEnvConfig``: minicode_agent, swebench_pro)
plays sandboxed multi-turn episodes. The kind decides the embedded model a run starts from when
``model.path`` is unset, the checks a built task passes before Ray starts, a sampler's rollout
producer, the probe's draw and the evaluation. ``rlmix.assembly.plan.plan_run`` resolves it once
(``RunPlan.task``); orchestration and eval call its methods and never test a task config's class.
This module is the one place outside a task's own modules that does (tests/test_layers.py).

``TASK_KINDS`` is read along the config class's MRO, as ``rlmix.tasks.checks.task_check`` reads
its rules; a class without a kind is a ``KeyError``, caught by a test. Agentic and embedded modules
are imported inside the methods, so reading the table stays cheap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmix.assembly.draws import EpisodeDraw, SingleTurnDraw
from rlmix.assembly.parts import (EMBEDDED_AGENT_MODELS, EMBEDDED_MODELS, encode_prompts, make_task,
                                  model_max_positions, refuse_overlong_prompts, room_for_prompts)
from rlmix.assembly.producers import Episodes, RolloutProducer, SingleTurn
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.schema import MiniCodeTaskConfig, MiniCodeTraceTaskConfig, ModelConfig
from rlmix.config.swebench import AgentEnvConfig, MiniCodeAgentConfig
from rlmix.errors import ConfigError
from rlmix.tasks.base import Task
from rlmix.tasks.checks import by_config_class


@dataclass(frozen=True)
class TaskKind(ABC):
    """A run's task config and what its kind answers about it (one subclass per kind)."""

    config: Any  # the run's task config (RunConfig.task)

    def make(self, seed: int):
        """The task (``rlmix.assembly.parts.make_task``): its problems and its scoring."""
        return make_task(self.config, seed)

    @abstractmethod
    def embedded_model(self, model: ModelConfig, progress) -> Path:
        """The embedded model a run starts from when ``model.path`` is unset (built once, cached)."""

    @abstractmethod
    def build(self, seed: int, tokenizer, max_new_tokens: int | None = None, key: str = "loop.max_new_tokens"):
        """``make``, then ConfigError if the model's tokenizer or ``max_new_tokens`` (the setting
        ``key``) does not fit the task."""

    @abstractmethod
    def check_run(self, task, tokenizer, model_dir: Path, max_new_tokens: int | None = None) -> None:
        """What else about a run with the model in ``model_dir`` can be wrong before a process starts,
        as a one-line ConfigError (``max_new_tokens``: ``loop.max_new_tokens``)."""

    @abstractmethod
    def producer(self, seed: int, tokenizer, pool: str) -> RolloutProducer:
        """A sampler worker's rollout unit (``rlmix.assembly.producers``)."""

    @abstractmethod
    def probe_draw(self, seed: int, problems: list, tokenizer, samples_per_prompt: int):
        """What each pool draws for the probe (``rlmix.assembly.draws``)."""

    @abstractmethod
    def evaluate(self, evaluation) -> dict:
        """Evaluate through ``evaluation`` (``rlmix.eval.evaluate.Evaluation``) in this kind's form."""

    def rerun_caveat(self) -> str | None:
        """Why two runs of one seed under ``loop.lag`` may differ in their digits (None: they do not)."""
        return None

    def train_caveat(self) -> str | None:
        """What a user should hear about training on this task as configured (None: nothing)."""
        return None

    def check_prompts(self, problems: list, tokenizer, model_dir: Path, max_new_tokens: int, key: str,
                      source: str) -> None:
        """ConfigError if a prompt of ``problems`` (``source``) leaves less than ``max_new_tokens``
        (the setting ``key``) of the model's context. Episodes' turns are checked by ``check_run``."""
        return None


class SingleTurnKind(TaskKind):
    """One completion per prompt, rendered through the task's chat template and scored as text."""

    def embedded_model(self, model: ModelConfig, progress) -> Path:
        """The embedded model ``model.embedded_version`` names."""
        return EMBEDDED_MODELS[model.embedded_version](model, progress)

    def build(self, seed: int, tokenizer, max_new_tokens: int | None = None, key: str = "loop.max_new_tokens") -> Task:
        """ConfigError if the tokenizer cannot encode a dataset's prompts, or if ``max_new_tokens``
        would cut off a worked answer the task's reference holds."""
        cfg = self.config
        task = self.make(seed)
        if isinstance(cfg, DatasetTaskConfig):
            from rlmix.tasks.dataset import check_encodable

            check_encodable(task, tokenizer)
        if isinstance(cfg, MiniCodeTraceTaskConfig) and max_new_tokens is not None:
            longest = task.longest_reference_tokens(tokenizer) + 1  # and the end of sequence
            if max_new_tokens < longest:
                raise ConfigError(f"{key}={max_new_tokens}: the longest reference trace of task={cfg.name}'s test "
                                  f"split takes {longest} tokens with this model's tokenizer; set {key}>={longest}")
        return task

    def check_run(self, task, tokenizer, model_dir: Path, max_new_tokens: int | None = None) -> None:
        """A completion budget that leaves the model's context no room for a prompt, or (a dataset) too
        little for one of its prompts: the model would run on past the positions it knows. (A dataset's
        blank prompts were refused as it loaded, ``check_columns``.)"""
        if max_new_tokens is None:
            return
        room = room_for_prompts(model_dir, max_new_tokens, "loop.max_new_tokens")
        if room is not None and isinstance(self.config, DatasetTaskConfig):
            from rlmix.tasks.dataset import overlong_rows

            overlong = [(task.rows.name(row), n) for row, n in overlong_rows(task, tokenizer, room)]
            refuse_overlong_prompts(overlong, "task.train_files", len(task), room, model_dir, max_new_tokens,
                                    "loop.max_new_tokens")

    def check_prompts(self, problems: list, tokenizer, model_dir: Path, max_new_tokens: int, key: str,
                      source: str) -> list[list[int]]:
        """Each problem's prompt ids through the task's chat template; ConfigError if one leaves less
        than ``max_new_tokens`` (the setting ``key``) of the model's context, or (a dataset) is blank, the
        tokenizer cannot encode it or it renders to no token. A dataset's row is named in its file
        (``task.eval_files=test.jsonl: line 4``), and one whose ``token_floor`` alone exceeds the room
        is refused without encoding it."""
        if not isinstance(self.config, DatasetTaskConfig):
            prompts = encode_prompts(tokenizer, tuple(problems), 1, self.config.chat_template)
            room = room_for_prompts(model_dir, max_new_tokens, key)
            if room is not None:
                overlong = [(p.task_id, len(ids)) for p, ids in zip(problems, prompts) if len(ids) > room]
                refuse_overlong_prompts(overlong, source, len(problems), room, model_dir, max_new_tokens, key)
            return prompts
        from rlmix.tasks.dataset import (AtLeast, check_problems_encodable, floor_tokens, is_blank, problem_name,
                                         refuse_empty_prompt, refuse_no_token, token_floor)

        for problem in problems:
            if is_blank(problem.messages):
                refuse_empty_prompt(problem_name(problem), self.config)
        check_problems_encodable(problems, tokenizer)
        room = room_for_prompts(model_dir, max_new_tokens, key)
        floor = token_floor(tokenizer) if room is not None else None
        least = [floor_tokens(floor, problem.messages) for problem in problems]
        bounded = [(problem_name(p), AtLeast(n)) for p, n in zip(problems, least) if room is not None and n > room]
        rest = tuple(p for p, n in zip(problems, least) if not bounded or n <= room)
        prompts = encode_prompts(tokenizer, rest, 1, self.config.chat_template)
        for problem, ids in zip(rest, prompts):
            if not ids:
                refuse_no_token(problem)
        if room is not None:
            overlong = bounded + [(problem_name(p), len(ids)) for p, ids in zip(rest, prompts) if len(ids) > room]
            refuse_overlong_prompts(overlong, source, len(problems), room, model_dir, max_new_tokens, key)
        return prompts

    def train_caveat(self) -> str | None:
        """minicode trains on the split it is given: a held-out one is the one ``rlmix eval`` scores."""
        if isinstance(self.config, MiniCodeTaskConfig) and self.config.split != "train":
            return (f"task.split={self.config.split}: training on a held-out split, the one `rlmix eval` scores "
                    "(task.split=train is the training stream)")
        return None

    def producer(self, seed: int, tokenizer, pool: str) -> RolloutProducer:
        return SingleTurn(self.make(seed), tokenizer, self.config.chat_template)

    def probe_draw(self, seed: int, problems: list, tokenizer, samples_per_prompt: int) -> SingleTurnDraw:
        """The prompts encoded through the task's chat template."""
        return SingleTurnDraw(encode_prompts(tokenizer, tuple(problems), samples_per_prompt, self.config.chat_template))

    def evaluate(self, evaluation) -> dict:
        """pass@k of completions on ``task.split``."""
        cfg = self.config
        # minicode's default split names its training stream; evaluation means its test split
        split = "test" if isinstance(cfg, MiniCodeTaskConfig) and cfg.split == "train" else cfg.split
        return evaluation.completions(split)


class EpisodeKind(TaskKind):
    """Sandboxed multi-turn episodes (``rlmix.agentic``); a policy turn generates up to
    ``task.max_turn_tokens``."""

    def embedded_model(self, model: ModelConfig, progress) -> Path:
        """The embedded agent model ``model.embedded_version`` names (warm-started on scripted episodes:
        ``model.embedded_agent``), which knows the action format."""
        return EMBEDDED_AGENT_MODELS[model.embedded_version](model, progress)

    def build(self, seed: int, tokenizer, max_new_tokens: int | None = None, key: str = "loop.max_new_tokens"):
        """``make``: an episode task is checked by ``check_run``."""
        return self.make(seed)

    def check_run(self, task, tokenizer, model_dir: Path, max_new_tokens: int | None = None) -> None:
        """The runtime, the tasks and the model's room for one turn (``rlmix.agentic.train.check_agent_run``)."""
        from rlmix.agentic.train import check_agent_run

        check_agent_run(self.config, task, tokenizer, model_max_positions(model_dir))

    def producer(self, seed: int, tokenizer, pool: str) -> RolloutProducer:
        return Episodes(self.config, self.make(seed), tokenizer, pool)

    def probe_draw(self, seed: int, problems: list, tokenizer, samples_per_prompt: int) -> EpisodeDraw:
        """``samples_per_prompt`` episodes of each problem."""
        return EpisodeDraw(self.config, self.make(seed), problems, tokenizer, samples_per_prompt)

    def rerun_caveat(self) -> str | None:
        """Concurrent episodes share sampler calls in groups their timing decides. Each seeded turn
        draws its own random numbers, but the emulated kernels' rounding depends on the batch, so a
        near-tie can go the other way and the episode with it."""
        if self.config.concurrent_episodes == 1:
            return None
        return (f"task.concurrent_episodes={self.config.concurrent_episodes}: episodes batched by timing can "
                "differ from one run to the next; set task.concurrent_episodes=1 for runs that repeat exactly")

    def evaluate(self, evaluation) -> dict:
        """Episodes graded in fresh sandboxes, on minicode_agent's ``task.split`` or a Harbor ``task.subset``."""
        import tempfile

        from rlmix.embedded.minicode_agent.task import minicode_agent_eval_config
        from rlmix.isolation.scratch import scratch_dir

        cfg = self.config
        minicode = isinstance(cfg, MiniCodeAgentConfig)
        split = cfg.split if minicode else cfg.subset
        if not minicode:
            return evaluation.episodes(cfg, split)
        with tempfile.TemporaryDirectory(prefix="rlmix-minicode-agent-eval-", dir=scratch_dir()) as tmp:
            tasks, levels = minicode_agent_eval_config(cfg, Path(tmp))
            return evaluation.episodes(tasks, split, groups=levels)


# task config class -> its kind; a subclass without an entry takes its nearest base class's
TASK_KINDS: dict[type, type[TaskKind]] = {
    MiniCodeTaskConfig: SingleTurnKind,
    DatasetTaskConfig: SingleTurnKind,
    AgentEnvConfig: EpisodeKind,
}


def task_kind(config: object) -> TaskKind:
    """``config`` bound to the kind of its class, or of its nearest base class that has one."""
    return by_config_class(TASK_KINDS, config, "rlmix.assembly.task_kinds.TASK_KINDS")(config)
