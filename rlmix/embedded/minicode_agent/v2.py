"""The v2 agent model: the v2 Qwen3-MoE and its byte-level BPE, warm-started on scripted episodes.

What agentic tasks start from with ``model=embedded_v2`` and no ``model.path``. It is the v2 model
(``rlmix.embedded.v2``: ``qwen3_moe``, the BPE tokenizer and its ChatML template) with the agent
model's warm start (``rlmix.embedded.minicode_agent.warmstart``: cross-entropy on the policy tokens
of scripted minicode_agent episodes, tokenised as a run tokenises them). The specs split the work:

* ``model.embedded_v2`` gives the tokenizer and the shapes (vocabulary, width, layers, heads,
  experts, top-k, expert width) and nothing else: its warm-start fields are for single-turn minicode;
* ``model.embedded_agent`` gives the context (``max_position_embeddings``, 512: an episode is about
  as many BPE tokens as characters, since commands and digits are single tokens) and the warm start
  (seed, steps, learning rate, batch, levels).

Its cache key (``v2_agent_key``) hashes both specs with the v2 key (corpus and v2 sources), the v1
agent key (the episode and warm-start sources) and this module, so it changes with any of them and
building it changes neither of theirs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from rlmix.config.embedded import AgentModelSpec, EmbeddedMoeSpec, check_moe_spec, v2_agent_hf_config
from rlmix.embedded.model import BUILD_INFO, cached_build, module_source, save_built


def v2_agent_key(moe: EmbeddedMoeSpec, agent: AgentModelSpec) -> str:
    """``agent-v2-`` and a hash of the v2 key, the agent key and this module's source."""
    from rlmix.embedded.minicode_agent.model import agent_spec_key
    from rlmix.embedded.v2.model import v2_spec_key

    h = hashlib.sha256(b"agent-v2:")
    for part in (v2_spec_key(moe), agent_spec_key(agent), module_source(__name__)):
        h.update(part.encode() + b"\0")
    return "agent-v2-" + h.hexdigest()[:16]


def build_v2_agent_model(moe: EmbeddedMoeSpec, agent: AgentModelSpec, cache_dir: Path | None = None,
                         progress: Callable[[str], None] | None = None) -> Path:
    """The model directory for the two specs: from the cache, or built, warm-started and cached."""
    check_moe_spec(moe)
    say = progress or (lambda _msg: None)
    return cached_build(v2_agent_key(moe, agent), lambda out, key: _build(moe, agent, out, key, say), cache_dir, say)


def _build(moe: EmbeddedMoeSpec, agent: AgentModelSpec, out: Path, key: str, say: Callable[[str], None]) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rlmix.embedded.minicode_agent.warmstart import agent_warm_start
    from rlmix.embedded.v2.bpe import build_bpe_tokenizer

    start, threads = time.monotonic(), torch.get_num_threads()
    torch.set_num_threads(1)  # see rlmix.embedded.model._build_into: one thread is fastest on a busy machine
    try:
        say(f"training the byte-level BPE tokenizer ({moe.vocab_size} tokens)")
        tokenizer = build_bpe_tokenizer(moe.vocab_size)
        fields = {k: v for k, v in v2_agent_hf_config(moe, agent).items() if k not in ("architectures", "model_type")}
        torch.manual_seed(agent.seed)
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**fields))
        model.generation_config.do_sample, model.generation_config.top_k = True, 0
        n_params = sum(p.numel() for p in model.parameters())
        say(f"warm-starting a Qwen3-MoE agent of {n_params} parameters on scripted episodes "
            f"({agent.warmup_steps} steps)")
        result = agent_warm_start(model, tokenizer, agent, say)
        save_built(model, tokenizer, out)
    finally:
        torch.set_num_threads(threads)
    info = {"key": key, "kind": "agent-v2", "spec": dataclasses.asdict(moe), "agent_spec": dataclasses.asdict(agent),
            "parameters": n_params, "vocab_size": len(tokenizer), "warmup_steps_run": result.steps,
            "final_loss": result.final_loss, "loss_history": result.history,
            "build_seconds": time.monotonic() - start, "cpu_count": os.cpu_count()}
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")  # written last: marks completeness
    say(f"embedded v2 agent model built: {n_params} parameters, loss {result.final_loss:.3f} "
        f"in {info['build_seconds']:.0f}s")
