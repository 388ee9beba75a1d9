"""Inputs refused before any process starts: a model directory whose tokenizer does not fit the
model, prompts a tokenizer cannot encode or that render to no token (training and eval rows alike),
and an eval or probe of ``task.eval_files`` without ``task.train_files``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmix.assembly.task_kinds import task_kind
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.embedded.chartok import build_char_tokenizer
from rlmix.embedded.minicode import ALPHABET
from rlmix.errors import ConfigError
from rlmix.models.tokenizer_file import load_fast_tokenizer
from rlmix.tasks.chat import prompt_messages, render_ids, render_text
from rlmix.tasks.dataset import DatasetTask
from tests.byo_model import train_bpe_tokenizer


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def model_dir(path: Path, tokenizer, **config) -> Path:
    path.mkdir()
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  **config}))
    return path


@pytest.fixture(scope="module")
def no_template():
    """A byte-level BPE without a chat template or a beginning-of-sequence token."""
    tok = train_bpe_tokenizer()
    tok.chat_template = None
    assert tok.bos_token is None and render_ids(tok, prompt_messages("")) == []
    return tok


def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused(tmp_path):
    tok = build_char_tokenizer(ALPHABET)
    n = len(tok)
    with pytest.raises(ConfigError, match=rf"tokenizer has {n} token ids but config.json's vocab_size is {n - 1}"):
        load_fast_tokenizer(model_dir(tmp_path / "small", tok, vocab_size=n - 1))
    with pytest.raises(ConfigError, match=rf"vocab_size is 8\b"):
        load_fast_tokenizer(model_dir(tmp_path / "text", tok, text_config={"vocab_size": 8}))
    assert len(load_fast_tokenizer(model_dir(tmp_path / "padded", tok, vocab_size=n + 64))) == n  # padding: fine
    assert len(load_fast_tokenizer(model_dir(tmp_path / "equal", tok, vocab_size=n))) == n


def test_a_model_directory_without_tokenizer_files_is_refused(tmp_path):
    from rlmix.models.io import load_tokenizer

    bare = model_dir(tmp_path / "bare", None, vocab_size=64, model_type="qwen2")  # transformers 5: a 1-token tokenizer
    (bare / "generation_config.json").write_text("{}")
    for load in (load_fast_tokenizer, load_tokenizer):
        with pytest.raises(ConfigError, match=r"the directory has no tokenizer \(none of tokenizer.json, "):
            load(bare)


def test_an_empty_prompt_is_refused_naming_its_file_and_line(tmp_path, no_template):
    """Whatever the tokenizer adds (a beginning-of-sequence token, a system prompt): tests/test_dataset_rows.py."""
    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "", "answer": "1"}, {"prompt": " ", "answer": "0"}]
    cfg = DatasetTaskConfig(train_files=write_jsonl(tmp_path / "train.jsonl", rows),
                            eval_files=write_jsonl(tmp_path / "test.jsonl", rows[1:]))
    kind = task_kind(cfg)
    with pytest.raises(ConfigError, match=r"^task.train_files=\S*/train.jsonl: line 2: the prompt is empty"):
        kind.check_run(DatasetTask(cfg), no_template, tmp_path)
    evals = DatasetTask(DatasetTaskConfig(eval_files=cfg.eval_files))
    with pytest.raises(ConfigError, match=r"^task.eval_files=\S*/test.jsonl: line 1: the prompt is empty"):
        kind.check_prompts(evals.split("test"), no_template, tmp_path, 8, "eval.max_new_tokens", "task.split=test")


def test_a_prompt_of_empty_messages_is_refused(tmp_path, no_template):
    rows = [{"messages": [{"role": "user", "content": "hi"}], "answer": "1"},
            {"messages": [{"role": "user", "content": ""}, {"role": "tool", "content": ""}], "answer": "1"}]
    cfg = DatasetTaskConfig(train_files=write_jsonl(tmp_path / "m.jsonl", rows), messages_key="messages")
    with pytest.raises(ConfigError, match=r"^task.train_files=\S*/m.jsonl: line 2: the prompt is empty"):
        task_kind(cfg).check_run(DatasetTask(cfg), no_template, tmp_path)


def test_eval_rows_the_tokenizer_cannot_encode_are_named(tmp_path):
    rows = [{"prompt": "1 add 1?", "answer": "2"}, {"prompt": "What is 1+1?", "answer": "2"}]
    cfg = DatasetTaskConfig(train_files=write_jsonl(tmp_path / "train.jsonl", rows[:1]),
                            eval_files=write_jsonl(tmp_path / "test.jsonl", rows))
    kind = task_kind(cfg)
    tok = build_char_tokenizer(ALPHABET)
    task = kind.build(0, tok)  # the training rows encode
    with pytest.raises(ConfigError,
                       match=r"^task.eval_files=\S*/test.jsonl: line 2: the model's tokenizer cannot encode '\+Whi'"):
        kind.check_prompts(task.split("test"), tok, tmp_path, 8, "eval.max_new_tokens", "task.split=test")


def test_eval_and_probe_read_eval_files_without_train_files(tmp_path):
    from rlmix.commands.compose import compose_plan

    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "1 add 1?", "answer": "2"}])
    args = ["task=dataset", f"task.eval_files={test}"]
    plan = compose_plan(args, for_training=False)
    assert [p.prompt for p in plan.task.make(plan.cfg.seed).split("test")] == ["1 add 1?"]
    with pytest.raises(ConfigError, match=r"^task.train_files: not set"):
        compose_plan(args)  # training still needs it
    with pytest.raises(ConfigError, match=r"^task.split=train: set task.train_files"):
        plan.task.make(plan.cfg.seed).split("train")


def test_the_plain_template_separates_a_system_prompt_as_raw_does(no_template):
    messages = prompt_messages("1+1?", system_prompt="be brief")
    assert render_text(no_template, messages, add_generation_prompt=True) == "be brief\n1+1?"
    assert render_text(no_template, prompt_messages("1+1?"), add_generation_prompt=True) == "1+1?"
