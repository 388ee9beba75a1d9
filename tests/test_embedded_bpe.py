"""The v2 embedded tokenizer: byte-level BPE trained in-process, saved as an HF directory."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from rlmix.embedded.v2.bpe import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    PAD,
    english_corpus,
    minicode_corpus,
    save_bpe_tokenizer,
    train_bpe,
)

VOCAB = 1024


def _save(out: Path) -> Path:
    save_bpe_tokenizer(VOCAB, out)
    # load_fast_tokenizer reads a model directory: a config.json naming a causal LM
    (out / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}))
    return out


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def hf_tok(bpe_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_dir)


def _printable_strings() -> list[str]:
    rng = random.Random(0)
    chars = string.printable  # letters, digits, punctuation, space, \t \n \r \x0b \x0c
    texts = ["", " ", "  two leading spaces", "trailing  ", "\n\nblank lines\n", "tab\tand\r\nCRLF",
             string.printable, "What is 1+1?", "51234>43215;90412>21409;77001>10077?", "<p>sort|add1</p>",
             "<|im_end|> typed as text", "don't 'quote' \"me\""]
    texts += ["".join(rng.choice(chars) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    return texts + english_corpus()


def test_every_printable_ascii_string_round_trips(hf_tok):
    for text in _printable_strings():
        ids = hf_tok(text, add_special_tokens=False).input_ids
        assert hf_tok.decode(ids) == text, repr(text)


def test_vocabulary_size_specials_and_digits(hf_tok):
    assert len(hf_tok) == VOCAB  # the corpus supports the full vocabulary, above score centering's K=128
    assert [hf_tok.convert_tokens_to_ids(t) for t in (PAD, IM_START, IM_END)] == [0, 1, 2]
    assert (hf_tok.pad_token_id, hf_tok.eos_token_id, hf_tok.bos_token_id, hf_tok.unk_token_id) == (0, 2, None, None)
    # every digit and symbol is one token: a minicode prompt is one token per character, as for v1
    prompt = "51234>43215;90412>21409;77001>10077?"
    assert len(hf_tok(prompt, add_special_tokens=False).input_ids) == len(prompt)
    assert len(hf_tok("12345>;54321>?", add_special_tokens=False).input_ids) == 14  # empty outputs too
    # the special tokens are atomic in text, and no BOS/EOS is added to plain text
    assert hf_tok(f"ab{IM_END}", add_special_tokens=True).input_ids[-1] == hf_tok.eos_token_id
    assert hf_tok("ab").input_ids == hf_tok("ab", add_special_tokens=False).input_ids
    # merges were learnt from the corpus: common English words are single tokens
    assert len(hf_tok(" the", add_special_tokens=False).input_ids) == 1


def test_training_is_deterministic(bpe_dir, tmp_path):
    again = _save(tmp_path / "again")
    names = sorted(p.name for p in bpe_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert "tokenizer.json" in names
    for name in names:
        assert (bpe_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_corpus_changes_the_merges():
    texts = minicode_corpus(200)
    assert train_bpe(300, texts).get_vocab() != train_bpe(300, texts + ["zebra zebra zebra quartz quartz"]).get_vocab()
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_bpe(100, texts)


def test_the_sampler_loader_and_transformers_agree(bpe_dir, hf_tok):
    """What a sampler loads (``load_fast_tokenizer``) and ``tokenizer.json`` alone encode and decode
    as ``AutoTokenizer`` does: no option outside the file changes the ids."""
    from tokenizers import Tokenizer

    from rlmix.models.tokenizer_file import load_fast_tokenizer

    sampler_tok = load_fast_tokenizer(bpe_dir)
    raw = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    for key in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id"):
        assert getattr(sampler_tok, key) == getattr(hf_tok, key), key
    assert len(sampler_tok) == len(hf_tok) == raw.get_vocab_size()
    rows = []
    for text in _printable_strings()[:80]:
        ids = hf_tok(text).input_ids
        assert sampler_tok(text).input_ids == ids == raw.encode(text).ids, repr(text)
        rows.append(ids + [hf_tok.eos_token_id, hf_tok.pad_token_id])
    for skip in (True, False):
        theirs = hf_tok.batch_decode(rows, skip_special_tokens=skip)
        assert sampler_tok.batch_decode(rows, skip_special_tokens=skip) == theirs
        assert raw.decode_batch(rows, skip_special_tokens=skip) == theirs


def test_the_chat_template_renders_and_extends_incrementally(bpe_dir, hf_tok):
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.tasks.chat import append_completion, append_message, prompt_messages, render_ids, render_text, start

    assert hf_tok.chat_template == CHAT_TEMPLATE
    sampler_tok = load_fast_tokenizer(bpe_dir)
    messages = prompt_messages("12345>54321?", system_prompt="Be brief.")
    text = render_text(sampler_tok, messages, add_generation_prompt=True)
    assert text == f"{IM_START}system\nBe brief.{IM_END}{IM_START}user\n12345>54321?{IM_END}{IM_START}assistant\n"
    enc = lambda s: hf_tok(s, add_special_tokens=False).input_ids  # noqa: E731
    expected = ([1] + enc("system\nBe brief.") + [2, 1] + enc("user\n12345>54321?") + [2, 1] + enc("assistant\n"))
    assert render_ids(sampler_tok, messages) == expected
    # a sampled turn ends with <|im_end|>; the next user turn extends the ids without re-tokenising
    conv = start(sampler_tok, messages)
    conv = append_completion(sampler_tok, conv, enc("<p>rev</p>") + [hf_tok.eos_token_id])
    conv = append_message(sampler_tok, conv, {"role": "user", "content": "again"})
    assert conv.ids == render_ids(sampler_tok, conv.messages)
