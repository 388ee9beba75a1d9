"""The embedded default model: a small Llama built, warm-started and cached by rlmix itself.

``build_embedded_model(spec)`` returns a Hugging Face model directory (config.json,
model.safetensors, tokenizer files, ``rlmix_build.json``) that ``rlmix.models.io`` loads like any
other HF causal LM. Nothing is downloaded. The directory is cached under
``<cache_dir>/embedded/<key>`` where ``key`` hashes the spec, the vocabulary and the source of the
modules that define the task, tokenizer, sampling and warm start (``KEY_MODULES``: every module of
this package but this one and the agent's), so any change to them builds afresh.

Concurrency and crashes: the build holds an exclusive file lock ``<key>.lock`` (a second process
waits, then finds the finished directory), writes into a temporary directory and renames it into
place only when complete, so an interrupted build never leaves a directory a later run would trust.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from rlmix.config.embedded import EmbeddedModelSpec

BUILD_INFO = "rlmix_build.json"


def default_cache_dir() -> Path:
    """``$RLMIX_CACHE`` if set, else ``~/.cache/rlmix``."""
    env = os.environ.get("RLMIX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rlmix"


def spec_key(spec: EmbeddedModelSpec) -> str:
    """Hash of everything the built weights depend on: the spec, the alphabet, and the source
    code of the task, tokenizer, sampling and build modules."""
    from rlmix.embedded import minicode

    h = hashlib.sha256(json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
    h.update(minicode.ALPHABET.encode())
    h.update(_llama_config_source().encode())
    for name in KEY_MODULES:
        h.update(module_source(name).encode())
    return h.hexdigest()[:16]


# Read as files, not imported: chartok imports transformers, which a run that finds its model in
# the cache never needs (about 3.5 core-seconds of its start-up).
# tests/test_models.py checks that these are every module of the package the build can depend on.
KEY_MODULES = ("rlmix.embedded.minicode", "rlmix.embedded.minicode_lang", "rlmix.embedded.chartok",
               "rlmix.embedded.sample", "rlmix.embedded.warmstart")


def module_source(name: str) -> str:
    """The text ``inspect.getsource`` returns for module ``name``, without importing it."""
    import importlib.util
    import tokenize

    with tokenize.open(importlib.util.find_spec(name).origin) as f:  # the encoding linecache uses
        return f.read()


def _llama_config_source() -> str:
    return inspect.getsource(llama_config)


def llama_config(spec: EmbeddedModelSpec, vocab_size: int, special_ids: dict[str, int]):
    """The ``LlamaConfig`` of the embedded model (untied embeddings: with ~30 tokens they cost
    nothing, and an untied output layer is what larger checkpoints have)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=special_ids["pad"],
        bos_token_id=special_ids["bos"],
        eos_token_id=special_ids["eos"],
        torch_dtype="float32",
    )


def build_embedded_model(
    spec: EmbeddedModelSpec,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The model directory for ``spec``: from the cache, or built, warm-started and cached."""
    say = progress or (lambda _msg: None)
    return cached_build(spec_key(spec), lambda out, key: _build_into(spec, out, key, say), cache_dir, say)


def cached_build(key: str, build: Callable[[Path, str], None], cache_dir: Path | None = None,
                 say: Callable[[str], None] = lambda _msg: None) -> Path:
    """``<cache>/embedded/<key>``, built by ``build(tmp_dir, key)`` under a file lock if absent.

    ``build`` must write ``BUILD_INFO`` last: its presence marks a complete directory.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = root / "embedded"
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if (final / BUILD_INFO).is_file():
        return final
    with FileLock(root / f"{key}.lock"):  # an OS lock: released if this process dies
        if (final / BUILD_INFO).is_file():  # another process built it while we waited
            return final
        say(f"building the embedded model {key} in {root}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            build(tmp, key)
            tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is shared like any HF dir
            if final.exists():  # an entry without its build record is incomplete: never trusted
                shutil.rmtree(final)
            os.replace(tmp, final)  # atomic: the directory appears complete or not at all
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_into(spec: EmbeddedModelSpec, out: Path, key: str, say: Callable[[str], None]) -> None:
    """Initialise from the seed, warm-start, and save model, tokenizer and build record to ``out``."""
    start = time.monotonic()
    threads = torch.get_num_threads()
    # One thread: at this size a second thread gains little on an idle 2-core machine, and when
    # other processes compete for the cores (a test suite, a Ray cluster) two spinning threads
    # made each step ~4x slower in measurements here.
    torch.set_num_threads(1)
    try:
        _init_train_save(spec, out, key, say, start)
    finally:
        torch.set_num_threads(threads)


def _init_train_save(spec: EmbeddedModelSpec, out: Path, key: str, say: Callable[[str], None], start: float) -> None:
    """The build proper (see ``_build_into``); ``start`` is when the build began."""
    from transformers import LlamaForCausalLM

    from rlmix.embedded.chartok import build_char_tokenizer
    from rlmix.embedded.minicode import ALPHABET
    from rlmix.embedded.warmstart import warm_start

    tokenizer = build_char_tokenizer(ALPHABET)
    special = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(llama_config(spec, len(tokenizer), special))
    model.generation_config.do_sample = True  # RL samples at temperature 1 over the full vocabulary
    model.generation_config.top_k = 0
    result = warm_start(model, tokenizer, spec, say)
    save_built(model, tokenizer, out)
    n_params = sum(p.numel() for p in model.parameters())
    low, high = spec.target_reward_low, spec.target_reward_high
    info = {
        "key": key,
        "spec": dataclasses.asdict(spec),
        "parameters": n_params,
        "warmup_steps_run": result.steps,
        "final_loss": result.final_loss,
        "reward": result.report.reward,
        "reward_by_level": {str(k): v for k, v in result.report.reward_by_level.items()},
        "format_error_rate": result.report.format_error_rate,
        "in_target_band": low <= result.report.reward <= high,
        "reward_history": result.history,
        "build_seconds": time.monotonic() - start,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "versions": {"torch": torch.__version__, "transformers": _transformers_version()},
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")  # written last: marks completeness
    say(f"embedded model built: {n_params} parameters, reward {info['reward']:.3f} in {info['build_seconds']:.0f}s")


def save_built(model, tokenizer, out: Path) -> None:
    """A built model and its tokenizer saved to ``out`` without transformers' progress bar per shard:
    the build reports its own progress, and a command's console holds rlmix's lines only."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
