"""The v2 embedded model: a small Qwen3-MoE with a byte-level BPE tokenizer, built, warm-started
and cached by rlmix itself (``model=embedded_v2``; docs/embedded.md).

``build_v2_model(spec)`` returns a Hugging Face directory (config.json of a ``qwen3_moe``,
model.safetensors, tokenizer.json and its config with the chat template, ``rlmix_build.json``).
It shares the cache plumbing of the v1 model (``rlmix.embedded.model.cached_build``: file lock,
temporary directory, atomic rename) under its own key, ``v2_spec_key``: the spec, the tokenizer
corpus and the source of every module the weights depend on (``KEY_MODULES``), so building v2 never
changes v1's key and any change to the corpus or the code builds afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from rlmix.config.embedded import EmbeddedMoeSpec, check_moe_spec
from rlmix.embedded.model import BUILD_INFO, cached_build, module_source, save_built
from rlmix.errors import ConfigError

# tests/test_embedded_v2.py checks that every module of rlmix.embedded.v2 is listed.
KEY_MODULES = ("rlmix.config.embedded", "rlmix.embedded.minicode", "rlmix.embedded.minicode_lang",
               "rlmix.embedded.minicode_trace", "rlmix.embedded.sample", "rlmix.embedded.warmstart", "rlmix.tasks.chat",
               "rlmix.embedded.v2.bpe", "rlmix.embedded.v2.model", "rlmix.embedded.v2.warmstart")


def corpus_files() -> list[tuple[str, bytes]]:
    """(name, bytes) of every file under ``rlmix/embedded/v2/corpus``, in name order."""
    folder = resources.files("rlmix.embedded.v2") / "corpus"
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir(), key=lambda p: p.name) if p.is_file()]


def v2_spec_key(spec: EmbeddedMoeSpec) -> str:
    """``v2-`` and a hash of the spec, the tokenizer corpus and the source of ``KEY_MODULES``."""
    h = hashlib.sha256(b"v2:" + json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
    for name in KEY_MODULES:
        h.update(name.encode() + b"\0" + module_source(name).encode())
    for name, data in corpus_files():
        h.update(name.encode() + b"\0" + data)
    return "v2-" + h.hexdigest()[:16]


def build_v2_model(spec: EmbeddedMoeSpec, cache_dir: Path | None = None,
                   progress: Callable[[str], None] | None = None) -> Path:
    """The model directory for ``spec``: from the cache, or built, warm-started and cached."""
    check_moe_spec(spec)  # validation checked it already; a direct call gets the same line
    say = progress or (lambda _msg: None)
    return cached_build(v2_spec_key(spec), lambda out, key: _build(spec, out, key, say), cache_dir, say)


def _build(spec: EmbeddedMoeSpec, out: Path, key: str, say: Callable[[str], None]) -> None:
    import torch

    start, threads = time.monotonic(), torch.get_num_threads()
    torch.set_num_threads(1)  # see rlmix.embedded.model._build_into: one thread is fastest on a busy machine
    try:
        info = _init_train_save(spec, out, say)
    finally:
        torch.set_num_threads(threads)
    info = {"key": key, "kind": "v2", **info, "build_seconds": time.monotonic() - start, "cpu_count": os.cpu_count()}
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")  # written last: marks completeness
    say(f"embedded v2 model built: {info['parameters']} parameters, reward {info['reward']:.3f} "
        f"in {info['build_seconds']:.0f}s")


def _init_train_save(spec: EmbeddedMoeSpec, out: Path, say: Callable[[str], None]) -> dict:
    """Tokenizer, initial weights from the seed, warm start, save; the build record's fields."""
    import torch
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rlmix.embedded.v2.bpe import build_bpe_tokenizer
    from rlmix.embedded.v2.warmstart import warm_start_v2

    say(f"training the byte-level BPE tokenizer ({spec.vocab_size} tokens)")
    tokenizer = build_bpe_tokenizer(spec.vocab_size)
    if len(tokenizer) != spec.vocab_size:
        raise ConfigError(f"model.embedded_v2.vocab_size={spec.vocab_size}: the tokenizer corpus yields only "
                          f"{len(tokenizer)} tokens; use a vocab_size of at most {len(tokenizer)}")
    fields = {k: v for k, v in spec.hf_config().items() if k not in ("architectures", "model_type")}
    torch.manual_seed(spec.seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**fields))
    model.generation_config.do_sample = True  # RL samples at temperature 1 over the full vocabulary
    model.generation_config.top_k = 0
    n_params = sum(p.numel() for p in model.parameters())
    say(f"warm-starting a Qwen3-MoE of {n_params} parameters on minicode (up to {spec.warmup_steps} steps)")
    result = warm_start_v2(model, tokenizer, spec, say)
    save_built(model, tokenizer, out)
    report = result.report
    return {
        "spec": dataclasses.asdict(spec),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "warmup_steps_run": result.steps,
        "final_loss": result.final_loss,
        "reward": report.reward,
        "reward_by_level": {str(k): v for k, v in report.reward_by_level.items()},
        "format_error_rate": report.format_error_rate,
        "in_target_band": spec.target_reward_low <= report.reward <= spec.target_reward_high,
        "reward_history": result.history,
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
