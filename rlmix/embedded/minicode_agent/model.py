"""The embedded agent model: the embedded Llama recipe, warm-started on scripted minicode_agent episodes.

What agentic tasks start from when ``model.path`` is null. It differs from the single-turn embedded
model (``rlmix.embedded.model``) in three ways, each needed for multi-turn episodes:

* the tokenizer: one token per printable ASCII character and newline (observations are free text),
  plus role tokens ``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|tool|>``;
* its own chat template (``CHAT_TEMPLATE``): ``<s>``, then per message ``<|role|>TEXT</s>``, then
  ``<|assistant|>`` as the generation prompt, so a policy turn ends with the stop token ``</s>``;
* a longer context (512) and the warm start of ``warmstart.py`` (scripted episodes).

It has its own cache key (``agent_spec_key``: the spec, and the source of everything the weights
depend on), so building it never changes the single-turn model's key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import string
import time
from collections.abc import Callable
from pathlib import Path

from rlmix.config.embedded import AgentModelSpec
from rlmix.embedded.model import BUILD_INFO, cached_build, llama_config, save_built

ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")  # printable ASCII and "\n"


def build_agent_tokenizer():
    """Character-level fast tokenizer over ``ALPHABET`` with the role tokens and ``CHAT_TEMPLATE``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from rlmix.embedded.chartok import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + ROLE_TOKENS + tuple(sorted(set(ALPHABET))))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # newline is a token too
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
                                 additional_special_tokens=list(ROLE_TOKENS), clean_up_tokenization_spaces=False,
                                 model_max_length=1 << 20)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def agent_spec_key(spec: AgentModelSpec) -> str:
    """Hash of the spec and of the code the weights depend on: problems, tool, scripted episodes,
    observation text, incremental rendering, tokenizer and training, the shared optimiser loop
    included (not the rest of the package)."""
    from rlmix.agentic.actions import observation_text
    from rlmix.embedded import minicode, minicode_lang
    from rlmix.embedded.minicode_agent import answer_action, scripted, tool, try_action
    from rlmix.embedded.minicode_agent import warmstart as agent_warmstart
    from rlmix.embedded.warmstart import supervised_steps
    from rlmix.tasks.chat import TemplateFormat, appended_text, render_text

    h = hashlib.sha256(b"agent:" + json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
    sources = (llama_config, observation_text, TemplateFormat, render_text, appended_text, answer_action,
               try_action, build_agent_tokenizer, scripted, tool, agent_warmstart, supervised_steps, minicode,
               minicode_lang)
    for obj in sources:
        h.update(inspect.getsource(obj).encode())
    h.update(CHAT_TEMPLATE.encode() + ALPHABET.encode())
    return "agent-" + h.hexdigest()[:16]


def build_agent_model(spec: AgentModelSpec, cache_dir: Path | None = None,
                      progress: Callable[[str], None] | None = None) -> Path:
    """The model directory for ``spec``: from the cache, or built, warm-started and cached."""
    say = progress or (lambda _msg: None)
    return cached_build(agent_spec_key(spec), lambda out, key: _build(spec, out, key, say), cache_dir, say)


def _build(spec: AgentModelSpec, out: Path, key: str, say: Callable[[str], None]) -> None:
    import torch
    from transformers import LlamaForCausalLM

    from rlmix.config.embedded import EmbeddedModelSpec
    from rlmix.embedded.minicode_agent.warmstart import agent_warm_start

    start, threads = time.monotonic(), torch.get_num_threads()
    torch.set_num_threads(1)  # see rlmix.embedded.model._build_into: one thread is fastest on a busy machine
    try:
        tokenizer = build_agent_tokenizer()
        shape = EmbeddedModelSpec(hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
                                  intermediate_size=spec.intermediate_size,
                                  max_position_embeddings=spec.max_position_embeddings)
        special = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(llama_config(shape, len(tokenizer), special))
        model.generation_config.do_sample, model.generation_config.top_k = True, 0
        result = agent_warm_start(model, tokenizer, spec, say)
        save_built(model, tokenizer, out)
    finally:
        torch.set_num_threads(threads)
    info = {"key": key, "kind": "agent", "spec": dataclasses.asdict(spec),
            "parameters": sum(p.numel() for p in model.parameters()), "warmup_steps_run": result.steps,
            "final_loss": result.final_loss, "loss_history": result.history,
            "build_seconds": time.monotonic() - start}
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")  # written last: marks completeness
    say(f"embedded agent model built: {info['parameters']} parameters, loss {result.final_loss:.3f} "
        f"in {info['build_seconds']:.0f}s")
