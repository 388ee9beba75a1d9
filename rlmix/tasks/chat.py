"""Prompt rendering: messages -> token ids, for single-turn tasks and multi-turn episodes alike.

Two modes (``task.chat_template``):

- ``auto``: the tokenizer's own chat template when it has one (``apply_chat_template`` semantics:
  the rendered text, tokenised without adding special tokens, generation prompt appended). A
  tokenizer without a template gets ``PLAIN_TEMPLATE``: ``bos`` then each message's content, an
  ``eos`` after each assistant turn. For one user turn that is exactly ``tokenizer(prompt)`` of a
  tokenizer that prepends ``bos`` — so the embedded model (whose warm start saw raw prompts) sees the
  same token ids whichever mode is chosen.
- ``raw``: no template. The message contents joined by newlines, tokenised as plain text (the
  tokenizer adds its usual special tokens). For one user turn: ``tokenizer(prompt)``.

Multi-turn: ``Conversation`` holds the ids rendered so far and the text they stand for.
``append_message`` tokenises only the new text the template adds (never the earlier turns again),
and ``append_completion`` appends the sampler's own ids verbatim, so the trainer scores exactly the
tokens that were sampled. A template that rewrites earlier turns when a new one arrives (some strip
reasoning from past assistant turns) cannot be extended incrementally: ``append_message`` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rlmix.config.dataset import ChatTemplateMode

Message = dict[str, str]  # {"role": "system"|"user"|"assistant"|"tool", "content": "..."}

PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


def prompt_messages(prompt: str, system_prompt: str | None = None) -> list[Message]:
    """The message list of a single-turn prompt."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + [{"role": "user", "content": prompt}]


def template_of(tokenizer) -> str:
    return getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE


def render_text(tokenizer, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    """The template's text for ``messages`` (auto mode)."""
    return tokenizer.apply_chat_template(
        list(messages), chat_template=template_of(tokenizer), tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def render_ids(tokenizer, messages: Sequence[Message], mode: ChatTemplateMode = ChatTemplateMode.auto) -> list[int]:
    """Token ids of ``messages`` ready for the model to continue (generation prompt included)."""
    if mode is ChatTemplateMode.raw:
        return list(tokenizer("\n".join(m["content"] for m in messages)).input_ids)
    text = render_text(tokenizer, messages, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


@dataclass
class Conversation:
    """A conversation rendered incrementally: ``ids`` encode ``text`` (auto mode)."""

    messages: list[Message]
    ids: list[int]
    text: str
    prompt_lens: list[int] = field(default_factory=list)  # len(ids) before each sampled turn


def start(tokenizer, messages: Sequence[Message]) -> Conversation:
    """A conversation whose ids end with the generation prompt for the first assistant turn."""
    text = render_text(tokenizer, messages, add_generation_prompt=True)
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    return Conversation(list(messages), ids, text)


def append_completion(tokenizer, conv: Conversation, completion_ids: Sequence[int]) -> Conversation:
    """Append a sampled assistant turn as its own ids (no re-tokenisation)."""
    content = tokenizer.decode(list(completion_ids), skip_special_tokens=True)
    verbatim = tokenizer.decode(list(completion_ids), skip_special_tokens=False)
    return Conversation(
        conv.messages + [{"role": "assistant", "content": content}],
        conv.ids + list(completion_ids),
        conv.text + verbatim,
        conv.prompt_lens + [len(conv.ids)],
    )


def append_message(
    tokenizer, conv: Conversation, message: Message, add_generation_prompt: bool = True
) -> Conversation:
    """Append a user/tool turn: only the text the template adds after ``conv.text`` is tokenised."""
    messages = conv.messages + [message]
    text = render_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    if not text.startswith(conv.text):
        raise ValueError(
            "the chat template renders earlier turns differently once a new turn is added; "
            "it cannot be extended incrementally (use task.chat_template=raw or a template without history rewriting)"
        )
    delta = list(tokenizer(text[len(conv.text):], add_special_tokens=False).input_ids)
    return Conversation(messages, conv.ids + delta, text, list(conv.prompt_lens))
