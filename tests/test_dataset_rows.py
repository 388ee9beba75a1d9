"""task=dataset: a bad row is named by its file and line, a blank prompt is refused whatever the chat
template, and a prompt far too long for the model is refused without encoding it."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from rlmix.assembly.task_kinds import task_kind
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.embedded.chartok import build_char_tokenizer
from rlmix.embedded.minicode import ALPHABET
from rlmix.errors import ConfigError
from rlmix.tasks import chat
from rlmix.tasks import dataset as dataset_module
from rlmix.tasks.dataset import DatasetTask
from tests.byo_model import train_bpe_tokenizer


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def model_dir(path: Path, positions: int) -> Path:
    """A model directory stating its context (all ``room_for_prompts`` reads)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "max_position_embeddings": positions}))
    return path


@pytest.fixture(scope="module")
def chatml():
    """A byte-level BPE with a chat template: every prompt, a blank one too, renders to tokens."""
    return train_bpe_tokenizer()


def numbers(n: int) -> list[dict]:
    return [{"prompt": f"{i} add 1?", "answer": str(i + 1)} for i in range(n)]


@pytest.mark.parametrize("blank", ["", "   ", "\n\t"], ids=["empty", "spaces", "whitespace"])
def test_a_blank_prompt_is_refused_for_training_whatever_the_template(tmp_path, chatml, blank):
    cfg = DatasetTaskConfig(train_files=write_jsonl(tmp_path / "empty.jsonl", numbers(2) + [
        {"prompt": blank, "answer": "5"}]), system_prompt="Be brief.")
    assert chat.render_ids(chatml, [{"role": "user", "content": blank}])  # the template renders tokens
    with pytest.raises(ConfigError, match=r"^task.train_files=\S*/empty.jsonl: line 3: the prompt is empty "
                                          r"\(task.prompt_key='prompt' holds no text but whitespace\)"):
        task_kind(cfg).check_run(DatasetTask(cfg), chatml, tmp_path)


def test_a_blank_eval_prompt_is_refused_before_sampling(tmp_path, chatml):
    """``rlmix eval`` and ``rlmix probe`` read the split, then ``check_prompts``: either refuses."""
    rows = numbers(1) + [{"prompt": " ", "answer": "5"}]
    cfg = DatasetTaskConfig(eval_files=write_jsonl(tmp_path / "test.jsonl", rows))
    kind, model = task_kind(cfg), model_dir(tmp_path / "model", 4096)
    with pytest.raises(ConfigError, match=r"^task.eval_files=\S*/test.jsonl: line 2: the prompt is empty"):
        kind.check_prompts(DatasetTask(cfg).split("test"), chatml, model, 8, "eval.max_new_tokens", "task.split=test")
    problems = DatasetTask(DatasetTaskConfig(eval_files=write_jsonl(tmp_path / "ok.jsonl", numbers(2)))).split("test")
    blank = replace(problems[1], messages=({"role": "user", "content": "\t"},))
    with pytest.raises(ConfigError, match=r"^task.eval_files=\S*/ok.jsonl: line 2: the prompt is empty"):
        kind.check_prompts([problems[0], blank], chatml, model, 8, "eval.max_new_tokens", "task.split=test")


@pytest.mark.parametrize("turns, refused", [
    ([("system", "Be brief."), ("user", " ")], True),  # a system message asks nothing
    ([("user", ""), ("assistant", "I see."), ("user", "\n")], True),
    ([("system", "")], True),  # no user turn: every message counts
    ([("system", "Name a prime."), ("user", "")], True),
    ([("user", ""), ("assistant", "2"), ("user", "and then?")], False),
    ([("system", "Name a prime.")], False),
])
def test_a_conversation_whose_user_turns_are_blank_is_refused(tmp_path, chatml, turns, refused):
    rows = [{"chat": [{"role": "user", "content": "1+1?"}], "answer": "2"},
            {"chat": [{"role": r, "content": c} for r, c in turns], "answer": "2"}]
    cfg = DatasetTaskConfig(train_files=write_jsonl(tmp_path / "m.jsonl", rows), messages_key="chat")
    if not refused:
        task_kind(cfg).check_run(DatasetTask(cfg), chatml, tmp_path)
        return
    with pytest.raises(ConfigError, match=r"^task.train_files=\S*/m.jsonl: line 2: the prompt is empty "
                                          r"\(task.messages_key='chat': its user turns hold no text"):
        task_kind(cfg).check_run(DatasetTask(cfg), chatml, tmp_path)


@pytest.mark.parametrize("bad, message", [
    ({"answer": "1"}, "no value for task.prompt_key='prompt'"),
    ({"prompt": 7, "answer": "1"}, "task.prompt_key='prompt' holds int, not text"),
])
def test_a_bad_row_of_a_file_list_is_named_by_its_file_and_line(tmp_path, monkeypatch, bad, message):
    """A row of the second file was ``row 7 of task.train_files`` (an index into all files' rows)."""
    write_jsonl(tmp_path / "train.jsonl", numbers(6))
    (tmp_path / "missing.jsonl").write_text(json.dumps(numbers(1)[0]) + "\n\n" + json.dumps(bad) + "\n")
    monkeypatch.chdir(tmp_path)
    for key in ("train_files", "eval_files"):
        cfg = DatasetTaskConfig(**{key: ["train.jsonl", "missing.jsonl"]})
        with pytest.raises(ConfigError, match=rf"^task.{key}=missing.jsonl: line 3: {message}$"):
            DatasetTask(cfg).split("train" if key == "train_files" else "test")


def test_an_overlong_row_is_named_by_its_file_and_line_in_train_eval_and_probe(tmp_path, monkeypatch, chatml):
    write_jsonl(tmp_path / "train.jsonl", numbers(6))
    write_jsonl(tmp_path / "long.jsonl", numbers(1) + [{"prompt": "the fox " * 40, "answer": "1"}])
    monkeypatch.chdir(tmp_path)
    files = ["train.jsonl", "long.jsonl"]
    cfg = DatasetTaskConfig(train_files=files, eval_files=files)
    kind, task, model = task_kind(cfg), DatasetTask(cfg), model_dir(tmp_path / "model", 64)
    with pytest.raises(ConfigError, match=r"^task.train_files: 1 of 8 prompts .* the longest, "
                                          r"task.train_files=long.jsonl: line 2, takes \d+: "):
        kind.check_run(task, chatml, model, 8)
    for key, source in (("eval.max_new_tokens", "task.split=test"), ("loop.max_new_tokens", "the probe's prompts")):
        with pytest.raises(ConfigError, match=rf"^{source}: 1 of 8 prompts .* the longest, "
                                              r"task.eval_files=long.jsonl: line 2, takes \d+: "):
            kind.check_prompts(task.split("test"), chatml, model, 8, key, source)


def test_a_huge_prompt_is_refused_without_encoding_it(tmp_path, monkeypatch, chatml):
    """A prompt of a megabyte took seconds and a gigabyte of memory to encode, only to be refused."""
    huge = "the quick brown fox jumps over the lazy dog. " * 25_000
    rows = numbers(3) + [{"prompt": huge, "answer": "1"}]
    cfg = DatasetTaskConfig(train_files=write_jsonl(tmp_path / "d.jsonl", rows),
                            eval_files=write_jsonl(tmp_path / "e.jsonl", rows))
    kind, task, model = task_kind(cfg), DatasetTask(cfg), model_dir(tmp_path / "model", 4096)
    longest = []  # the longest text any encoding was asked for
    real = chat.render_ids

    def spy(tokenizer, messages, mode=chat.ChatTemplateMode.auto):
        longest.append(max(len(m["content"]) for m in messages))
        return real(tokenizer, messages, mode)

    monkeypatch.setattr(chat, "render_ids", spy)
    monkeypatch.setattr(dataset_module, "render_ids", spy)
    for check, key in ((lambda: kind.check_run(task, chatml, model, 8), "train_files"),
                       (lambda: kind.check_prompts(task.split("test"), chatml, model, 8, "eval.max_new_tokens",
                                                   "task.split=test"), "eval_files")):
        with pytest.raises(ConfigError, match=rf"the longest, task.{key}=\S*/[de].jsonl: line 4, takes at least "
                                              r"(\d+): shorten") as refused:
            check()
        assert int(refused.value.args[0].split("takes at least ")[1].split(":")[0]) > 4096 - 8
    assert max(longest) < len(huge)


def hf_tokenizer(model, pre=None, normalizer=None):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(model)
    if pre is not None:
        tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_the_token_floor_never_exceeds_the_tokens_and_is_absent_where_unsound(tmp_path):
    """Random texts (specials, line breaks, multi-byte characters) through each tokenizer rlmix
    builds or loads: the floor never passes the count; tokenizers that may drop or fuse text have none."""
    from tokenizers import models, normalizers, pre_tokenizers

    from rlmix.embedded.v2.bpe import build_bpe_tokenizer
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.tasks.dataset import token_floor

    chatml = train_bpe_tokenizer()
    saved = tmp_path / "model"
    chatml.save_pretrained(saved)
    (saved / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    from_file = load_fast_tokenizer(saved)
    tokenizers = [build_char_tokenizer(ALPHABET), build_bpe_tokenizer(400), chatml, from_file]
    assert type(from_file) is not type(chatml)  # the file reader rlmix serves a model directory with
    rng = random.Random(0)
    pieces = ["the ", "fox", "<s>", "<pad>", "<|im_start|>", "\n", "\n\n\n", "é", "😀", "  ", "a", "7"]
    for tok in tokenizers:
        floor = token_floor(tok)
        assert floor is not None
        for _ in range(200):
            text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 60)))
            assert floor(text) <= len(tok(text, add_special_tokens=False).input_ids), (tok, text)
    unsound = [
        hf_tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"), pre_tokenizers.Whitespace()),
        hf_tokenizer(models.BPE({"a": 0, "b": 1}, merges=[]), pre_tokenizers.Split(" ", behavior="isolated")),
        hf_tokenizer(models.BPE(), pre_tokenizers.ByteLevel(), normalizers.NFKC()),
        hf_tokenizer(models.BPE(), pre_tokenizers.ByteLevel()),  # bytes missing from its vocabulary drop
    ]
    assert [token_floor(tok) for tok in unsound] == [None] * len(unsound)
