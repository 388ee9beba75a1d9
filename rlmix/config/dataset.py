"""Typed configuration of ``task=dataset``: your prompts, your answers, your reward.

Light on purpose (no ``datasets`` import) so the CLI can register it in Hydra's ConfigStore; the
task's own checks (files, fields, reward) live beside it in ``rlmix.tasks.dataset``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional

# OmegaConf's mandatory-value marker, spelled out: importing omegaconf (with PyYAML and ANTLR) for one
# string cost every sampler and trainer process ~0.13 core-s at start-up, since their constructor
# arguments carry these classes. tests/test_config.py checks it is OmegaConf's own.
MISSING: Any = "???"


class ChatTemplateMode(enum.Enum):
    """How prompts become token ids (rlmix.tasks.chat); every task has this switch."""

    auto = "auto"  # the tokenizer's chat template, else a plain one (bos + text)
    raw = "raw"  # no template: message contents joined by newlines


@dataclass
class DatasetTaskConfig:
    """``task=dataset``: prompts from JSONL / Parquet / a ``save_to_disk`` directory, scored by ``reward``."""

    name: str = "dataset"
    # A .jsonl/.json/.parquet file, a glob of them, a save_to_disk directory, or a list of these
    # (verl's form, `[a.jsonl,b.parquet]`: their rows in list order). Any: OmegaConf has no str | list.
    # Training requires it (rlmix.tasks.dataset.check_config); eval and probe may read eval_files alone.
    train_files: Any = None
    eval_files: Any = None  # the same forms; `rlmix eval` scores them (split=test)
    prompt_key: str = "prompt"  # column holding the prompt text
    answer_key: str = "answer"  # column holding what the reward compares against
    messages_key: Optional[str] = None  # column of chat messages [{role, content}, ...]; replaces prompt_key
    system_prompt: Optional[str] = None  # prepended as a system message to prompt_key rows
    reward: str = "exact"  # exact | math | python_tests | module:function (see rlmix/tasks/rewards.py)
    # The completion must fully match this regex, else it is a format error (reward 0, counted apart).
    # Its first capturing group, if any, is what the reward sees. None: every completion is well-formed.
    format_regex: Optional[str] = None
    python_timeout_s: float = 5.0  # reward=python_tests: wall-clock limit per sample
    # reward=python_tests: the fraction of assert statements that held, instead of 1 iff all held.
    partial_credit: bool = False
    shuffle: bool = True  # a fresh permutation of the rows each epoch, from the run seed
    epochs: Optional[int] = None  # None: cycle forever; else loop.steps must fit in this many passes
    chat_template: ChatTemplateMode = ChatTemplateMode.auto  # auto: the tokenizer's template; raw: none
    split: str = "test"  # rlmix eval: "test" (eval_files) or "train" (train_files)
