"""Plain Hugging Face sampling, used only to measure the warm start's reward.

The training run's samplers (with precision emulation) live in ``rlmix.samplers``; this helper is
deliberately minimal: full-vocabulary sampling at a temperature, no top-p/top-k, KV cache via
``model.generate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # types only: transformers takes seconds to import, a cache hit never needs it
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


@torch.no_grad()
def sample_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[str]:
    """One sampled completion per prompt, decoded without the prompt, cut at the first EOS."""
    tokenizer.padding_side = "left"  # generation continues every row from its last real token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=temperature,
            top_k=0,  # the model's generation defaults may truncate; the reward is measured untruncated
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    new_tokens = out[:, batch["input_ids"].shape[1] :].tolist()  # (B, <= max_new_tokens)
    return [tokenizer.decode(_until_eos(row, tokenizer.eos_token_id)) for row in new_tokens]


def _until_eos(ids: list[int], eos_id: int) -> list[int]:
    """Tokens before the first EOS (generate pads finished rows after it). Other special tokens
    are kept, so a stray ``<s>`` shows up in the text and fails the task's format check."""
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
