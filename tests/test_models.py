"""The embedded model: char tokenizer, cached deterministic build, warm start, HF loading."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlmix.embedded.model as embedded_model
from rlmix.config.embedded import EmbeddedModelSpec
from rlmix.embedded.chartok import build_char_tokenizer
from rlmix.embedded.minicode import ALPHABET, MiniCode
from rlmix.embedded.model import BUILD_INFO, KEY_MODULES, build_embedded_model, spec_key
from rlmix.embedded.sample import _until_eos
from rlmix.embedded.warmstart import example_output_mask, sft_batch
from rlmix.errors import ConfigError
from rlmix.models.io import load_causal_lm, load_tokenizer

TINY = EmbeddedModelSpec(
    hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=96,
    warmup_steps=4, warmup_batch_size=8, eval_every=2, eval_problems=8,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_embedded_model(TINY, cache_dir=tmp_path_factory.mktemp("cache"))


def _task_strings() -> list[str]:
    task = MiniCode()
    problems = task.sample(200, seed=0) + task.split("test") + task.split("hard51")
    return [p.prompt + task.reference_answer(p) for p in problems]


def test_tokenizer_round_trips_every_task_string(tiny_dir):
    for tok in (build_char_tokenizer(ALPHABET), load_tokenizer(tiny_dir)):
        unk = tok.unk_token_id
        for text in _task_strings() + [ALPHABET + " "]:
            ids = tok(text)["input_ids"]
            assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # one token per char
            assert unk not in ids
            assert tok.decode(ids, skip_special_tokens=True) == text
            assert tok.decode(ids[1:]) == text
        assert tok.decode([tok.encode("<p>", add_special_tokens=False)[0], tok.eos_token_id]) == "<</s>"


def test_sft_batch_trains_only_on_answer_and_eos():
    tok = build_char_tokenizer(ALPHABET)
    batch = sft_batch(tok, ["12>21?", "5>5;3>3?"], ["<p>rev</p>", "<p>sort</p>"], output_loss=False)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape == (2, 1 + 8 + 11 + 1)  # <s> prompt answer </s>
    row0 = labels[0][labels[0] != -100].tolist()
    assert row0 == tok("<p>rev</p>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert (labels[0, : 1 + 6] == -100).all() and mask[0].sum() == 1 + 6 + 10 + 1
    assert (ids[0, 1 + 6 + 10 + 1 :] == tok.pad_token_id).all() and (labels[0, 18:] == -100).all()
    assert mask[1].all()


def test_sft_batch_output_loss_adds_the_example_outputs():
    tok = build_char_tokenizer(ALPHABET)
    assert [i for i, k in enumerate(example_output_mask("12>21;5>;3>3?")) if k] == [3, 4, 5, 8, 11, 12]
    batch = sft_batch(tok, ["12>21;5>;3>3?"], ["<p>rev</p>"])
    labels, ids = batch["labels"][0], batch["input_ids"][0]
    kept = (labels != -100).nonzero().flatten().tolist()
    assert kept == [1 + i for i in (3, 4, 5, 8, 11, 12)] + list(range(1 + 13, 1 + 13 + 10 + 1))
    assert tok.decode(ids[kept[:6]]) == "21;;3?" and (labels[kept] == ids[kept]).all()


def test_until_eos_cuts_at_first_eos_only():
    assert _until_eos([5, 6, 2, 7, 0], eos_id=2) == [5, 6]
    assert _until_eos([5, 6], eos_id=2) == [5, 6]


def test_build_is_cached_and_records_the_build(tiny_dir):
    info = json.loads((tiny_dir / BUILD_INFO).read_text())
    assert info["key"] == spec_key(TINY) == tiny_dir.name
    assert info["spec"] == dataclasses.asdict(TINY)
    assert 0.0 <= info["reward"] <= 1.0 and set(info["reward_by_level"]) == {"1", "2", "3"}
    assert info["warmup_steps_run"] == 4 and len(info["reward_history"]) == 2
    messages: list[str] = []
    again = build_embedded_model(TINY, cache_dir=tiny_dir.parent.parent, progress=messages.append)
    assert again == tiny_dir and messages == []  # found in the cache, nothing rebuilt
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_key_changes_with_the_spec():
    keys = {spec_key(TINY), spec_key(dataclasses.replace(TINY, seed=1)),
            spec_key(dataclasses.replace(TINY, warmup_lr=1e-3)), spec_key(EmbeddedModelSpec())}  # fmt: skip
    assert len(keys) == 4
    assert spec_key(dataclasses.replace(TINY)) == spec_key(TINY)


def _embedded_imports(module: str) -> set[str]:
    """The top-level ``rlmix.embedded`` modules ``module`` imports, at module level or in a function."""
    import ast
    import importlib.util

    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "rlmix.embedded":
            names |= {f"rlmix.embedded.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlmix.embedded."):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("rlmix.embedded.")}
    return {n for n in names if n.count(".") == 2}  # the agent's subpackage has its own key


def test_the_key_hashes_every_module_the_build_depends_on():
    """Every module of rlmix/embedded/ the build reaches by import (model.py's imports, followed
    through the package, function-level ones included) is in the key, and nothing else: a dependency
    added to the build cannot be missed, and a module the build never imports (the trace task)
    does not rebuild the default model."""
    reached, frontier = set(), {"rlmix.embedded.model"}
    while frontier:
        reached |= frontier
        frontier = set().union(*map(_embedded_imports, frontier)) - reached
    assert set(KEY_MODULES) == reached - {"rlmix.embedded.model"}


def _change_source(monkeypatch, module: str) -> None:
    source = embedded_model.module_source
    monkeypatch.setattr(embedded_model, "module_source",
                        lambda name: source(name) + ("# changed\n" if name == module else ""))


@pytest.mark.parametrize("module", KEY_MODULES)
def test_a_changed_toy_source_changes_the_key(module, monkeypatch):
    before = spec_key(TINY)
    _change_source(monkeypatch, module)
    assert spec_key(TINY) != before


def test_a_changed_toy_source_rebuilds_the_cached_model(monkeypatch, tmp_path):
    spec = dataclasses.replace(TINY, warmup_steps=1, eval_every=1)
    cached = build_embedded_model(spec, tmp_path)
    _change_source(monkeypatch, "rlmix.embedded.warmstart")
    messages: list[str] = []
    rebuilt = build_embedded_model(spec, tmp_path, messages.append)
    assert rebuilt != cached and any(m.startswith("building") for m in messages)


def test_build_is_deterministic_in_the_seed(tiny_dir, tmp_path):
    other = build_embedded_model(TINY, cache_dir=tmp_path)
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    reseeded = build_embedded_model(dataclasses.replace(TINY, seed=1), cache_dir=tmp_path)
    c = load_file(reseeded / "model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_concurrent_builds_build_once(tmp_path):
    spec = dataclasses.replace(TINY, warmup_steps=2)
    messages: list[str] = []
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(build_embedded_model(spec, tmp_path, messages.append)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert sum(m.startswith("building") for m in messages) == 1


def test_incomplete_cache_entry_is_rebuilt(tmp_path):
    spec = dataclasses.replace(TINY, warmup_steps=2)
    stale = tmp_path / "embedded" / spec_key(spec)
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # what an interrupted copy might leave
    out = build_embedded_model(spec, cache_dir=tmp_path)
    assert out == stale and (out / BUILD_INFO).is_file()
    assert load_causal_lm(out).config.hidden_size == 32


def test_load_causal_lm_loads_the_built_model(tiny_dir):
    model = load_causal_lm(tiny_dir)
    tok = load_tokenizer(tiny_dir)
    assert not model.training and model.dtype == torch.float32
    assert model.config.vocab_size == len(tok) and model.config.eos_token_id == tok.eos_token_id
    ids = tok(["12>21?"], return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))
    assert load_causal_lm(tiny_dir, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_loaders_reject_non_model_dirs(tmp_path):
    for loader in (load_causal_lm, load_tokenizer):
        with pytest.raises(ConfigError, match="model.path=.*no config.json") as err:
            loader(tmp_path)
        assert "\n" not in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ConfigError, match="not a causal LM"):
        load_causal_lm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConfigError, match="weights do not load") as err:
        load_causal_lm(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_default_build_has_room_for_rl():
    """Builds (or finds in the default cache) the embedded default and checks its recorded reward."""
    spec = EmbeddedModelSpec()
    path = build_embedded_model(spec)  # default cache dir: later runs and other tests reuse it
    info = json.loads((path / BUILD_INFO).read_text())
    # measured on 192 fresh problems: 0.05 is over three standard errors above 0
    assert 0.05 <= info["reward"] <= 0.8, info["reward"]
    by_level = info["reward_by_level"]
    assert by_level["1"] > by_level["3"]  # easy problems solved more often than hard ones
    assert by_level["1"] < 1.0
    assert info["format_error_rate"] < 0.3  # the format is learnt; wrong answers dominate
    model = load_causal_lm(path)
    assert sum(p.numel() for p in model.parameters()) == info["parameters"]


def test_a_build_saves_without_transformers_progress_bars(tmp_path, capfd):
    """A command that builds the embedded model on a fresh machine prints rlmix's lines only (a refusal
    after the build is still one line): transformers' per-shard bar stays off, and on again after."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from rlmix.embedded.model import llama_config, save_built

    tokenizer = build_char_tokenizer(ALPHABET)
    shape = EmbeddedModelSpec(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    special = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    model = LlamaForCausalLM(llama_config(shape, len(tokenizer), special))
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # as in a user's shell (HF_HUB_DISABLE_PROGRESS_BARS unset)
    try:
        save_built(model, tokenizer, tmp_path / "built")
        out, err = capfd.readouterr()
        assert "Writing model shards" not in out + err and (tmp_path / "built" / "model.safetensors").is_file()
        assert hf_logging.is_progress_bar_enabled()
        model.save_pretrained(tmp_path / "plain")  # the check can fail: save_pretrained alone shows the bar
        assert "Writing model shards" in "".join(capfd.readouterr())
    finally:
        if not shown:
            hf_logging.disable_progress_bar()


def test_loading_a_model_draws_no_progress_bar(tiny_llama_dir, capfd):
    # transformers' "Loading weights: 100%|...|" bar was the first line `rlmix probe` printed.
    from transformers.utils import logging as hf_logging

    from rlmix.models.io import load_causal_lm

    load_causal_lm(tiny_llama_dir)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # put back for whoever else loads in this process
