"""The v2 embedded model: its spec and config, its cache key, its warm-start batches, its build."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlmix.commands.compose import compose_plan, compose_run_config
from rlmix.config.embedded import EmbeddedModelSpec, EmbeddedMoeSpec, EmbeddedVersion
from rlmix.embedded.model import spec_key
from rlmix.embedded.v2 import model as v2_model
from rlmix.embedded.v2.model import KEY_MODULES, v2_spec_key
from rlmix.errors import ConfigError

# head size 32: the smallest vLLM's CPU attention kernels take
TINY = EmbeddedMoeSpec(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_experts=4,
                       moe_intermediate_size=32, warmup_steps=4, eval_every=2, eval_problems=8, warmup_batch_size=8)


@pytest.fixture(scope="module")
def bpe():
    from rlmix.embedded.v2.bpe import build_bpe_tokenizer

    return build_bpe_tokenizer(EmbeddedMoeSpec().vocab_size)


def test_the_key_lists_every_module_of_the_v2_package():
    package = Path(v2_model.__file__).parent
    own = {f"rlmix.embedded.v2.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    assert own <= set(KEY_MODULES)
    assert {"rlmix.embedded.minicode", "rlmix.embedded.minicode_trace", "rlmix.embedded.warmstart",
            "rlmix.tasks.chat"} <= set(KEY_MODULES)


@pytest.mark.parametrize("module", KEY_MODULES)
def test_a_changed_source_changes_the_key(module, monkeypatch):
    before = v2_spec_key(TINY)
    source = v2_model.module_source
    monkeypatch.setattr(v2_model, "module_source",
                        lambda name: source(name) + ("# changed\n" if name == module else ""))
    assert v2_spec_key(TINY) != before


def test_the_corpus_the_spec_and_nothing_else_change_the_key(monkeypatch):
    key = v2_spec_key(TINY)
    assert key.startswith("v2-") and key == v2_spec_key(dataclasses.replace(TINY))
    assert v2_spec_key(dataclasses.replace(TINY, seed=1)) != key
    assert v2_spec_key(dataclasses.replace(TINY, vocab_size=301)) != key
    files = v2_model.corpus_files()
    assert [name for name, _ in files] == ["english.txt", "notes.txt"]
    monkeypatch.setattr(v2_model, "corpus_files", lambda: files + [("more.txt", b"more text")])
    assert v2_spec_key(TINY) != key
    assert spec_key(EmbeddedModelSpec()) != key  # v1 keeps its own key


def test_hf_config_is_what_transformers_stores():
    from transformers import Qwen3MoeConfig

    fields = EmbeddedMoeSpec().hf_config()
    stored = Qwen3MoeConfig(**{k: v for k, v in fields.items() if k not in ("architectures", "model_type")}).to_dict()
    assert stored["model_type"] == fields["model_type"] == "qwen3_moe"
    assert {k: stored[k] for k in fields if k not in ("architectures", "model_type")} == {
        k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    assert (stored["num_local_experts"], stored["num_experts_per_tok"], stored["norm_topk_prob"]) == (4, 2, True)


def test_model_embedded_v2_selects_v2_and_v1_stays_the_default():
    assert compose_run_config([]).model.embedded_version is EmbeddedVersion.v1
    cfg = compose_run_config(["model=embedded_v2"])
    assert cfg.model.embedded_version is EmbeddedVersion.v2 and cfg.model.path is None
    assert cfg.model.embedded_v2 == EmbeddedMoeSpec()


@pytest.mark.parametrize(("override", "message"), [
    ("model.embedded_v2.experts_per_token=5", "model.embedded_v2.experts_per_token=5: must be in 1..num_experts=4"),
    ("model.embedded_v2.vocab_size=100", "model.embedded_v2.vocab_size=100: must be >= 259"),
    ("model.embedded_v2.num_heads=3", "model.embedded_v2.num_heads=3: must divide hidden_size=128"),
])
def test_a_bad_v2_spec_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        compose_run_config(["model=embedded_v2", override])
    compose_run_config([override])  # v1 runs never read model.embedded_v2


def test_a_dataset_task_starts_from_v2_and_the_embedded_tasks_from_v1_unless_told():
    """model.embedded_version=auto: the user's own rows get the model that reads any text."""
    rows = Path(__file__).resolve().parents[1] / "examples" / "arith" / "train.jsonl"
    data = ["task=dataset", f"task.train_files={rows}", "task.prompt_key=question"]
    version = lambda *args: compose_run_config(list(args)).model.embedded_version  # noqa: E731
    assert version(*data) is EmbeddedVersion.v2
    assert version(*data, "model.embedded_version=v1") is EmbeddedVersion.v1
    assert version() is version("task=minicode_agent") is EmbeddedVersion.v1
    assert version("model=embedded_v2") is EmbeddedVersion.v2


def test_pool_checks_see_the_v2_config_fields(monkeypatch):
    """Validation hands every pool's platform check the config.json fields the v2 build writes
    (for v1: None, the Llama every backend serves), so a backend that cannot serve it refuses early."""
    from rlmix.config.schema import SamplerBackend
    from rlmix.samplers.checks import POOL_CHECKS

    seen = []
    monkeypatch.setitem(POOL_CHECKS, SamplerBackend.torch, lambda name, pool, model: seen.append(model) or (None, None))
    compose_run_config(["model=embedded_v2", "fleet=single_bf16"])
    assert seen and all(m == EmbeddedMoeSpec().hf_config() for m in seen)
    seen.clear()
    compose_run_config(["fleet=single_bf16"])
    assert seen and all(m is None for m in seen)


def test_warm_start_labels_are_v1s_characters_through_the_template(bpe):
    """The labelled prompt tokens spell exactly the example outputs v1 trains on (character mask),
    and the answer ends with the end-of-turn token; the prompt ids are what a sampler renders."""
    from rlmix.embedded.minicode import MiniCode
    from rlmix.embedded.v2.warmstart import chat_sft_batch
    from rlmix.embedded.warmstart import example_output_mask
    from rlmix.tasks.chat import prompt_messages, render_ids

    task = MiniCode(levels=(1, 2, 3), seed=0)
    problems = task.sample(6, seed=1)
    answers = [task.reference_answer(p) for p in problems]
    batch = chat_sft_batch(bpe, [p.prompt for p in problems], answers)
    for row, (p, answer) in enumerate(zip(problems, answers)):
        prompt_ids = render_ids(bpe, prompt_messages(p.prompt))
        n = len(prompt_ids)
        assert batch["input_ids"][row, :n].tolist() == prompt_ids
        labels = batch["labels"][row].tolist()
        expected = "".join(ch for ch, m in zip(p.prompt, example_output_mask(p.prompt)) if m)
        assert bpe.decode([t for t in labels[:n] if t != -100]) == expected
        tail = [t for t in labels[n:] if t != -100]
        assert tail[-1] == bpe.eos_token_id and bpe.decode(tail[:-1]) == answer
        assert batch["attention_mask"][row].sum() == n + len(tail)


def test_english_rows_encode_with_v2_and_are_refused_by_v1(bpe, tmp_path):
    import string

    from rlmix.config.dataset import DatasetTaskConfig
    from rlmix.embedded.chartok import build_char_tokenizer
    from rlmix.embedded.minicode import ALPHABET
    from rlmix.tasks.dataset import DatasetTask, check_encodable

    rows = [{"prompt": "What is the capital of France? Answer in one word.", "answer": "Paris"},
            {"prompt": string.printable, "answer": "x"}]
    path = tmp_path / "english.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = DatasetTask(DatasetTaskConfig(train_files=str(path)))
    check_encodable(task, bpe)
    with pytest.raises(ConfigError, match="english.jsonl: line 1: the model's tokenizer cannot encode"):
        check_encodable(task, build_char_tokenizer(ALPHABET))


@pytest.mark.slow  # builds (a tiny) model: seconds
def test_a_tiny_v2_build_is_an_hf_directory_cached_under_its_key(tmp_path, monkeypatch):
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.models.io import load_causal_lm
    from rlmix.models.tokenizer_file import load_fast_tokenizer

    monkeypatch.setenv("RLMIX_CACHE", str(tmp_path))
    fields = [f"model.embedded_v2.{f.name}={getattr(TINY, f.name)}" for f in dataclasses.fields(TINY)]
    plan = compose_plan(["model=embedded_v2", *fields])
    messages = []
    path = resolve_model_dir(plan, progress=messages.append)
    assert path == tmp_path / "embedded" / v2_spec_key(TINY)
    assert any("training the byte-level BPE" in m for m in messages)
    assert any(m.startswith("warm start step 2/4") for m in messages)
    info = json.loads((path / "rlmix_build.json").read_text())
    assert (info["kind"], info["vocab_size"], info["warmup_steps_run"]) == ("v2", 300, 4)
    assert 0.0 <= info["reward"] <= 1.0 and len(info["reward_history"]) == 2
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["architectures"] == ["Qwen3MoeForCausalLM"]
    model, tok = load_causal_lm(path), load_fast_tokenizer(path)
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and len(tok) == model.config.vocab_size == 300
    assert tok.chat_template and tok.eos_token_id == model.config.eos_token_id == 2
    messages.clear()
    assert resolve_model_dir(plan, progress=messages.append) == path and messages == []  # from the cache


@pytest.mark.slow  # builds (a tiny) model twice: seconds
def test_the_build_is_deterministic_in_the_seed(tmp_path):
    from safetensors.torch import load_file

    from rlmix.embedded.v2.model import build_v2_model

    a, b = build_v2_model(TINY, tmp_path / "a"), build_v2_model(TINY, tmp_path / "b")
    c = build_v2_model(dataclasses.replace(TINY, seed=1), tmp_path / "a")
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert wa.keys() == wb.keys() and all(torch_equal(wa[k], wb[k]) for k in wa)
    assert not all(torch_equal(wa[k], wc[k]) for k in wa)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))


@pytest.mark.slow  # the real CLI: Ray, two emulated sampler pools, the trainer
def test_an_english_jsonl_task_trains_on_v2_with_no_model_path(tmp_path):
    """The issue's check: a newcomer's English rows, the embedded v2 model, no ``model.path``, on
    emulated pools (an fp8 and a bf16 one) that serve its mixture of experts."""
    import os
    import subprocess
    import sys

    rows = [{"question": f"What is {a} plus {b}? Put the number inside <p></p>.", "answer": str(a + b)}
            for a in range(1, 5) for b in range(1, 5)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tiny = [f"model.embedded_v2.{f.name}={getattr(TINY, f.name)}" for f in dataclasses.fields(TINY)]
    args = ["+experiment=smoke", *tiny,  # no model=: a dataset task starts from v2 (model.embedded_version=auto)
            "task=dataset", f"task.train_files={data}", "task.prompt_key=question", "task.reward=math",
            "loop.steps=2", "logger=disabled", f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, "RLMIX_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([str(Path(sys.executable).with_name("rlmix")), "train", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "cache" / "embedded" / v2_spec_key(TINY) / "rlmix_build.json").is_file()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
