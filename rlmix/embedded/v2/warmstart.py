"""The v2 model's warm start: minicode, single-turn, rendered through the chat template.

The v1 warm start's loop (``rlmix.embedded.warmstart.minicode_warm_start``: the one optimiser loop
``supervised_steps``, half of each batch level 1, loss on the answer and on the prompt's example
outputs, stop on the sampled reward, a fresh final measurement), with two differences a BPE
vocabulary and a chat template bring:

* the prompt is the text a run's sampler continues: ``render_text`` of one user turn with the
  generation prompt (``rlmix.tasks.chat``, the renderer of ``task.chat_template=auto``), and the
  answer ends with the end-of-turn token ``<|im_end|>``;
* tokens are not characters, so the example-output labels are chosen by token offsets: a prompt
  token is trained iff every character it spans is an example output (digits, ``;`` and ``>`` are
  single tokens, so this keeps exactly v1's characters).

``answer=trace`` teaches the long-answer form instead
(``rlmix.embedded.minicode_trace``: a worked search, then the program), with the reward measured on
samples as long as the longest reference trace.

v1's functions are reused; their source is part of the v1 model's cache key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from rlmix.config.embedded import EmbeddedMoeSpec, MiniCodeAnswer
from rlmix.embedded.minicode import MiniCode
from rlmix.embedded.minicode_trace import MiniCodeTrace
from rlmix.embedded.warmstart import MAX_ANSWER_TOKENS, WarmStartResult, example_output_mask, minicode_warm_start
from rlmix.tasks.base import Problem
from rlmix.tasks.chat import prompt_messages, render_text

if TYPE_CHECKING:  # types only: transformers takes seconds to import
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def chat_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> str:
    """The text a sampler continues for a single-turn ``prompt`` (template and generation prompt)."""
    return render_text(tokenizer, prompt_messages(prompt), add_generation_prompt=True)


def chat_sft_batch(
    tokenizer: PreTrainedTokenizerFast, prompts: list[str], answers: list[str]
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels`` (B, L): labels on the answer and its
    ``<|im_end|>``, and on the prompt tokens that lie wholly inside an example output; -100 elsewhere."""
    rows, label_rows = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        text = chat_prompt(tokenizer, prompt)
        base = text.index(prompt)  # the user content; the template around it has no digits
        wanted = [False] * base + example_output_mask(prompt) + [False] * (len(text) - base - len(prompt))
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        keep = [end > start and all(wanted[start:end]) for start, end in enc["offset_mapping"]]
        p = enc["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + a)
        label_rows.append([t if k else -100 for t, k in zip(p, keep, strict=True)] + a)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "labels": torch.tensor([r + [-100] * (width - len(r)) for r in label_rows]),
    }


def as_chat(tokenizer: PreTrainedTokenizerFast, problems: list[Problem]) -> list[Problem]:
    """``problems`` with each prompt replaced by its rendered chat text, for ``measure_reward``
    (which samples a continuation of ``prompt``; the tokenizer adds no special tokens to it)."""
    return [dataclasses.replace(p, prompt=chat_prompt(tokenizer, p.prompt)) for p in problems]


def answer_task(spec: EmbeddedMoeSpec, levels: tuple[int, ...]) -> MiniCode:
    """minicode answered the way ``spec.answer`` says: the program, or a worked trace then the program."""
    if spec.answer is MiniCodeAnswer.trace:
        return MiniCodeTrace(levels=levels, seed=spec.seed, tries=tuple(spec.trace_tries))
    return MiniCode(levels=levels, seed=spec.seed)


def answer_budget(tokenizer: PreTrainedTokenizerFast, task: MiniCode) -> int:
    """New tokens a sampled answer may take: v1's fixed budget for programs; for traces the longest
    reference trace of the test split in this tokenizer's tokens, its end of turn and some slack."""
    if not isinstance(task, MiniCodeTrace):
        return MAX_ANSWER_TOKENS
    return task.longest_reference_tokens(tokenizer) + 8


def warm_start_v2(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    spec: EmbeddedMoeSpec,
    progress: Callable[[str], None],
) -> WarmStartResult:
    """Train ``model`` in place until the held-set reward reaches ``spec.target_reward_low`` or
    ``spec.warmup_steps`` have run; then measure the reward afresh on 2 x ``eval_problems`` problems."""
    task = answer_task(spec, (1, 2, 3))
    return minicode_warm_start(model, tokenizer, spec, task, answer_task(spec, (1,)), chat_sft_batch, progress,
                               render=lambda problems: as_chat(tokenizer, problems),
                               max_new_tokens=answer_budget(tokenizer, task))
