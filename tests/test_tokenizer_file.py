"""The transformers-free tokenizer a sampler actor uses agrees with transformers' own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlmix.errors import ConfigError
from rlmix.models.tokenizer_file import FileTokenizer, load_fast_tokenizer

TEXTS = ["", "def f(x):", "return x + 1", "abc xyz 019", "(1,2)=[3]", "é not in the vocabulary"]


@pytest.fixture(scope="module")
def char_model_dir(tmp_path_factory) -> Path:
    """The embedded model's tokenizer (BOS post-processor, four special tokens) beside a Llama config."""
    from rlmix.models.chartok import build_char_tokenizer
    from rlmix.tasks.minicode import ALPHABET

    out = tmp_path_factory.mktemp("chartok")
    build_char_tokenizer(ALPHABET).save_pretrained(out)
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return out


@pytest.mark.parametrize("which", ["char_model_dir", "tiny_llama_dir"])
def test_file_tokenizer_matches_transformers(which, request):
    from rlmix.models.io import load_tokenizer

    path = request.getfixturevalue(which)
    ours, theirs = load_fast_tokenizer(path), load_tokenizer(path)
    assert isinstance(ours, FileTokenizer)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert len(ours) == len(theirs)
    rows = []
    for text in TEXTS:
        assert ours(text).input_ids == theirs(text).input_ids, text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        rows.append(theirs(text).input_ids + [theirs.eos_token_id, theirs.pad_token_id])
    for skip in (True, False):
        assert ours.batch_decode(rows, skip_special_tokens=skip) == theirs.batch_decode(rows, skip_special_tokens=skip)
        assert ours.decode(rows[2], skip_special_tokens=skip) == theirs.decode(rows[2], skip_special_tokens=skip)


@pytest.mark.parametrize("which", ["char_model_dir", "tiny_llama_dir"])
def test_prompts_render_to_the_same_ids_as_with_transformers(which, request):
    from rlmix.config.dataset import ChatTemplateMode
    from rlmix.models.io import load_tokenizer
    from rlmix.tasks.chat import prompt_messages, render_ids

    path = request.getfixturevalue(which)
    ours, theirs = load_fast_tokenizer(path), load_tokenizer(path)
    conversations = [prompt_messages("def f(x):"), prompt_messages("return x", system_prompt="be brief"),
                     [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "xyz"},
                      {"role": "user", "content": "(1,2)"}]]
    for messages in conversations:
        for mode in ChatTemplateMode:
            assert render_ids(ours, messages, mode) == render_ids(theirs, messages, mode), (messages, mode)


def test_options_only_transformers_applies_fall_back_to_it(char_model_dir, tmp_path):
    import shutil

    from transformers import PreTrainedTokenizerBase

    for option in ({"clean_up_tokenization_spaces": True}, {"add_eos_token": True},
                   {"chat_template": "{{ messages[0]['content'] }}"}):
        path = tmp_path / next(iter(option))
        shutil.copytree(char_model_dir, path)
        config = json.loads((path / "tokenizer_config.json").read_text()) | option
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        assert isinstance(load_fast_tokenizer(path), PreTrainedTokenizerBase), option


def test_bad_tokenizer_file_and_non_model_dir_are_config_errors(char_model_dir, tmp_path):
    import shutil

    with pytest.raises(ConfigError, match="no config.json"):
        load_fast_tokenizer(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(char_model_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="no loadable tokenizer"):
        load_fast_tokenizer(broken)


@pytest.mark.slow  # a fresh interpreter builds a sampler worker: ~14 s
def test_a_sampler_worker_never_loads_the_transformers_tokenizer(tiny_llama_dir):
    """Start-up cost: each sampler actor would pay ~3.5 core-seconds for AutoTokenizer (docs/performance.md)."""
    script = f"""
import sys
from rlmix.assembly.fleet import SamplerSpec, sampling_params
from rlmix.assembly.parts import make_task
from rlmix.config.schema import MiniCodeTaskConfig, PoolConfig, RunConfig
from rlmix.orchestration.workers import SamplerWorker, make_request
from rlmix.samplers.checks import pool_view

pool = PoolConfig(accelerator="H100", precision="fp8_e4m3")
cfg = RunConfig(task=MiniCodeTaskConfig())
cfg.loop.max_new_tokens = 4
spec = SamplerSpec("h100", 0, pool, sampling_params(pool, cfg, 2), pool_view("h100", pool))
worker = SamplerWorker(spec, {str(tiny_llama_dir)!r}, cfg.task, seed=0, threads=1)
out = worker.generate(make_request(make_task(cfg.task, 0), 0, 1, 0), 2, None, 0)
assert len(out) == 2, len(out)
print(sorted(m for m in sys.modules if m.startswith("transformers.models.auto.tokenization")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"  # AutoTokenizer never loaded
