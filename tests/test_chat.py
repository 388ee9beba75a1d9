"""Prompt rendering (rlmix.tasks.chat): templates, the raw switch, and incremental multi-turn ids."""

from __future__ import annotations

import pytest

from rlmix.embedded.chartok import build_char_tokenizer
from rlmix.assembly.parts import encode_prompts
from rlmix.config.dataset import ChatTemplateMode
from rlmix.tasks.chat import append_completion, append_message, prompt_messages, render_ids, start
from rlmix.embedded.minicode import ALPHABET, MiniCode
from tests.byo_model import train_bpe_tokenizer


@pytest.fixture(scope="module")
def bpe():
    return train_bpe_tokenizer()


def test_minicode_prompt_ids_unchanged_on_the_embedded_tokenizer():
    """The embedded model's warm start saw tokenizer(prompt): both modes must give exactly those ids."""
    tok = build_char_tokenizer(ALPHABET)
    problems = tuple(MiniCode().split("test")[:5])
    today = [tok(p.prompt).input_ids for p in problems]
    for mode in ChatTemplateMode:
        assert encode_prompts(tok, problems, 1, mode) == today
    assert today[0][0] == tok.bos_token_id


def test_auto_uses_the_tokenizer_template_and_raw_does_not(bpe):
    messages = prompt_messages("What is 3 plus 4?", system_prompt="Answer briefly.")
    auto = render_ids(bpe, messages, ChatTemplateMode.auto)
    assert bpe.decode(auto) == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 3 plus 4?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert auto == bpe.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    raw = render_ids(bpe, messages, ChatTemplateMode.raw)
    assert bpe.decode(raw) == "Answer briefly.\nWhat is 3 plus 4?"


@pytest.mark.parametrize("make_tok", [train_bpe_tokenizer, lambda: build_char_tokenizer(ALPHABET + "ust")])
def test_incremental_turns_equal_a_full_render_and_keep_sampled_ids(make_tok):
    tok = make_tok()
    conv = start(tok, [{"role": "user", "content": "7 pens add 5 pens?"}])
    first = list(conv.ids)
    sampled = tok("<p>12</p>", add_special_tokens=False).input_ids + [tok.eos_token_id]
    conv = append_completion(tok, conv, sampled)
    conv = append_message(tok, conv, {"role": "user", "content": "add 3 to 5?"})
    assert conv.ids[: len(first)] == first  # earlier turns are never re-tokenised
    assert conv.ids[len(first): len(first) + len(sampled)] == sampled  # the sampled ids, verbatim
    full = render_ids(tok, conv.messages, ChatTemplateMode.auto)
    assert conv.ids == full
    assert conv.prompt_lens == [len(first)]


def test_a_template_that_rewrites_history_is_refused(bpe):
    bpe = train_bpe_tokenizer()
    bpe.chat_template = (  # drops every assistant turn but the last: earlier text changes
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{% endif %}"
        "{% endfor %}"
    )
    conv = start(bpe, [{"role": "user", "content": "a"}])
    conv = append_completion(bpe, conv, bpe("b", add_special_tokens=False).input_ids)
    with pytest.raises(ValueError, match="incrementally"):
        append_message(bpe, conv, {"role": "user", "content": "c"})


@pytest.mark.parametrize("make_tok", [train_bpe_tokenizer, lambda: build_char_tokenizer(ALPHABET + "ust")])
def test_the_plain_fallback_is_the_text_its_template_renders(make_tok):
    """A tokenizer without a template: render_text's own rendering equals Jinja's of PLAIN_TEMPLATE."""
    from rlmix.tasks.chat import PLAIN_TEMPLATE, render_text

    tok = make_tok()
    tok.chat_template = None
    conversations = [prompt_messages("7 pens?"), prompt_messages("add 3?", system_prompt="be brief"),
                     [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "tool", "content": "c"}]]
    for messages in conversations:
        for generation_prompt in (True, False):
            jinja = tok.apply_chat_template(messages, chat_template=PLAIN_TEMPLATE, tokenize=False,
                                            add_generation_prompt=generation_prompt)
            assert render_text(tok, messages, generation_prompt) == jinja


@pytest.mark.parametrize("make_tok, gap", [(train_bpe_tokenizer, "\n"), (lambda: build_char_tokenizer(ALPHABET + "ust"), "")])
def test_a_task_conversation_and_an_episode_render_the_same_text(make_tok, gap):
    """Single-turn tasks (``Conversation``) and agentic episodes (``TemplateFormat.suffix``) go through
    one renderer: the same messages give the same text, turn by turn. One known difference: text a
    template puts after its end-of-turn token (ChatML's newline, ``gap``) follows a sampled turn in a
    conversation but not in an episode, whose policy turn ends with the sampled stop token."""
    from rlmix.agentic.policy import Message
    from rlmix.tasks.chat import PLAIN_TEMPLATE, TemplateFormat, appended_text

    tok = make_tok()
    if not tok.chat_template:
        tok.chat_template = PLAIN_TEMPLATE  # what a task falls back to
    episode = [Message("user", "7 pens add 5 pens?")]
    chat = TemplateFormat(tok)
    conv = start(tok, [{"role": m.role, "content": m.text} for m in episode])
    assert chat.suffix(episode, 0) == conv.text
    sampled = tok("<p>12</p>", add_special_tokens=False).input_ids + [tok.eos_token_id]
    conv = append_completion(tok, conv, sampled)
    episode.append(Message("assistant", conv.messages[-1]["content"]))
    before = conv.text
    conv = append_message(tok, conv, {"role": "user", "content": "add 3 to 5?"})
    episode.append(Message("user", "add 3 to 5?"))
    assert appended_text(before, conv.text) == gap + chat.suffix(episode, 2)
