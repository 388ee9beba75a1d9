"""A tiny random-weight model with the embedded agent tokenizer (for agentic tests; no tests here).

Its actions are mostly malformed, which is what record and loss tests need: real tokens, real
log-probs, heads and supports from the torch sampler, in seconds rather than a warm start.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlmix.embedded.minicode_agent.model import build_agent_tokenizer
from rlmix.config.embedded import EmbeddedModelSpec
from rlmix.embedded.model import llama_config


def tiny_agent_model(out: Path, seed: int = 0) -> Path:
    from transformers import LlamaForCausalLM

    tokenizer = build_agent_tokenizer()
    shape = EmbeddedModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                              max_position_embeddings=512)
    special = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(shape, len(tokenizer), special))
    with torch.no_grad():  # make the stop token likely, so random episodes stay short
        model.lm_head.bias = None
        model.lm_head.weight[tokenizer.eos_token_id] *= 0
        model.lm_head.weight[tokenizer.eos_token_id] += model.model.norm.weight.detach() * 0.5
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# The embedded agent model's own recipe (tokenizer, shape, 512-token context) warm-started for 10
# steps instead of 500: seconds to build on a cold cache instead of minutes, for runs whose check
# does not depend on what the warm start taught (refusals, clean-up, an eval's bookkeeping).
BRIEF_AGENT = ["model.embedded_agent.warmup_steps=10"]
