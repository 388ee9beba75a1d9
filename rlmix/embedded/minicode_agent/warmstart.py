"""The agent model's warm start: supervised training on scripted minicode_agent episodes.

Each batch is fresh problems (levels ``spec.levels``) played by ``scripted_episode``, tokenised
exactly as an episode is at run time (``rlmix.tasks.chat.TemplateFormat``: the environment's text
is the template's suffix, the policy's turn is its text plus ``</s>``), so the warm-started model
sees the same tokens it will produce. Loss: cross-entropy on the policy tokens only. The optimiser
loop is the single-turn warm start's (``rlmix.embedded.warmstart.supervised_steps``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from rlmix.agentic.policy import Message
from rlmix.embedded.minicode import MiniCode
from rlmix.embedded.minicode_agent.scripted import scripted_episode
from rlmix.embedded.warmstart import WarmStartResult, supervised_steps
from rlmix.tasks.chat import TemplateFormat

LOG_EVERY = 50


def episode_tokens(tokenizer, messages: list[Message]) -> tuple[list[int], list[bool]]:
    """(ids, mask): the episode as the runtime tokenises it; mask True on policy tokens."""
    chat = TemplateFormat(tokenizer)
    ids: list[int] = []
    mask: list[bool] = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        context = tokenizer.encode(chat.suffix(messages[:i], rendered=_rendered(messages[:i])),
                                   add_special_tokens=False)
        policy = tokenizer.encode(m.text, add_special_tokens=False) + [tokenizer.eos_token_id]
        ids += context + policy
        mask += [False] * len(context) + [True] * len(policy)
    return ids, mask


def _rendered(messages: list[Message]) -> int:
    """Messages up to and including the last policy turn are already tokens."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return last + 1


def sft_batch(tokenizer, episodes: list[list[Message]]) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels`` (B, L); labels -100 off policy tokens."""
    rows = [episode_tokens(tokenizer, e) for e in episodes]
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask)] + [-100] * (width - len(ids))
                           for ids, mask in rows])
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def agent_warm_start(model, tokenizer, spec, progress: Callable[[str], None]) -> WarmStartResult:
    """Train ``model`` in place for ``spec.warmup_steps`` steps (deterministic in ``spec.seed``)."""
    levels = tuple(spec.levels)
    task = MiniCode(levels=levels, seed=spec.seed)
    rng = random.Random(f"agent-warmstart:{spec.seed}")  # drawn from in step order: batch(1), batch(2), ...
    start, history = time.monotonic(), []

    def batch(step: int) -> dict[str, torch.Tensor]:
        problems = task.sample(spec.warmup_batch_size, seed=step)
        return sft_batch(tokenizer, [scripted_episode(p, levels, rng) for p in problems])

    def log(step: int, loss: float) -> bool:
        if step % LOG_EVERY == 0 or step == spec.warmup_steps:
            history.append({"step": step, "loss": loss, "seconds": time.monotonic() - start})
            progress(f"agent warm start step {step}/{spec.warmup_steps}: loss {loss:.3f}")
        return False  # the scripted data is unlimited: the schedule sets the length

    ramp = max(1, spec.warmup_steps // 10)

    def lr_factor(s: int) -> float:
        """Linear ramp, then cosine decay to 10%."""
        return min(1.0, (s + 1) / ramp) * (
            0.1 + 0.45 * (1 + torch.cos(torch.tensor(torch.pi * s / spec.warmup_steps)).item()))

    steps, loss = supervised_steps(model, spec.warmup_steps, spec.warmup_lr, lr_factor, batch, log)
    return WarmStartResult(steps, time.monotonic() - start, loss, history)
