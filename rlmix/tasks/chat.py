"""Prompt rendering: messages -> token ids, for single-turn tasks and multi-turn episodes alike.

Two modes (``task.chat_template``):

- ``auto``: the tokenizer's own chat template when it has one (``apply_chat_template`` semantics:
  the rendered text, tokenised without adding special tokens, generation prompt appended). A
  tokenizer without a template gets ``PLAIN_TEMPLATE``: ``bos`` then each message's content, an
  ``eos`` after each assistant turn and a newline after a system message, as ``raw`` separates it
  (without one, "be brief" and "1+1?" read "be brief1+1?"). For one user turn that is exactly
  ``tokenizer(prompt)`` of a tokenizer that prepends ``bos`` — so the embedded model (whose warm start
  saw raw prompts) sees the same token ids whichever mode is chosen.
- ``raw``: no template. The message contents joined by newlines, tokenised as plain text (the
  tokenizer adds its usual special tokens). For one user turn: ``tokenizer(prompt)``.

Multi-turn: ``Conversation`` holds the ids rendered so far and the text they stand for.
``append_message`` tokenises only the new text the template adds (never the earlier turns again),
and ``append_completion`` appends the sampler's own ids verbatim, so the trainer scores exactly the
tokens that were sampled. A template that rewrites earlier turns when a new one arrives (some strip
reasoning from past assistant turns) cannot be extended incrementally: ``append_message`` says so.

Agentic episodes render through the same template text (``TemplateFormat``: the suffix the
environment adds between two policy turns), or, for a tokenizer without a template, fixed
``<|role|>`` headers (``HeaderFormat``); ``chat_renderer`` picks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rlmix.config.dataset import ChatTemplateMode

Message = dict[str, str]  # {"role": "system"|"user"|"assistant"|"tool", "content": "..."}

PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% elif message['role'] == 'system' %}{{ '\\n' }}"
    "{% endif %}{% endfor %}"
)


def prompt_messages(prompt: str, system_prompt: str | None = None) -> list[Message]:
    """The message list of a single-turn prompt."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + [{"role": "user", "content": prompt}]


def render_text(tokenizer, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    """The template's text for ``messages`` (auto mode).

    ``PLAIN_TEMPLATE`` is rendered here, in Python, to exactly the text its Jinja gives (tests/test_chat.py
    checks): a sampler's transformers-free tokenizer (``rlmix.models.tokenizer_file``) then never needs
    a template engine, and need not know this template.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        bos, eos = tokenizer.bos_token or "", tokenizer.eos_token or ""  # an unset token renders as ""
        return bos + "".join(m["content"] + {"assistant": eos, "system": "\n"}.get(m["role"], "") for m in messages)
    return tokenizer.apply_chat_template(
        # Named templates ({name: template}, which only transformers reads) pick their default there.
        list(messages), chat_template=template if isinstance(template, str) else None, tokenize=False,
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
    delta = list(tokenizer(appended_text(conv.text, text), add_special_tokens=False).input_ids)
    return Conversation(messages, conv.ids + delta, text, list(conv.prompt_lens))


def appended_text(before: str, after: str) -> str:
    """What ``after`` adds to ``before``; ValueError if the template rewrote ``before`` meanwhile."""
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders earlier turns differently once a new turn is added; it cannot be "
            "extended incrementally (use task.chat_template=raw or a template without history rewriting)"
        )
    return after[len(before):]


class ChatMessage(Protocol):
    role: str
    text: str


@dataclass(frozen=True)
class HeaderFormat:
    """An episode's fallback for a tokenizer without a template: role headers and a turn terminator."""

    headers: tuple[tuple[str, str], ...] = (("system", "<|system|>\n"), ("user", "<|user|>\n"),
                                            ("assistant", "<|assistant|>\n"), ("tool", "<|tool|>\n"))
    end: str = "\n"

    def header(self, role: str) -> str:
        return dict(self.headers)[role]

    def render(self, messages: Sequence[ChatMessage]) -> str:
        return "".join(f"{self.header(m.role)}{m.text}{self.end}" for m in messages)

    def suffix(self, messages: Sequence[ChatMessage], rendered: int) -> str:
        # The policy's own turns are already tokens (and end with its stop token): render the rest.
        new = [m for m in messages[rendered:] if m.role != "assistant"]
        return self.render(new) + self.header("assistant")


class TemplateFormat:
    """An episode's messages through the tokenizer's template (``render_text``), one suffix at a time:
    the text of all messages (with the generation prompt) minus that of the first ``rendered``, which
    are already in the token stream, so the policy's own tokens stay exactly as sampled."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def _render(self, messages: Sequence[ChatMessage], generation_prompt: bool) -> str:
        if not messages:
            return ""
        return render_text(self.tokenizer, [{"role": m.role, "content": m.text} for m in messages], generation_prompt)

    def suffix(self, messages: Sequence[ChatMessage], rendered: int) -> str:
        before = self._render(messages[:rendered], generation_prompt=False)
        return appended_text(before, self._render(messages, generation_prompt=True))


ChatRenderer = HeaderFormat | TemplateFormat


def chat_renderer(tokenizer) -> ChatRenderer:
    """The tokenizer's own template when it has one, else the fixed headers."""
    return TemplateFormat(tokenizer) if getattr(tokenizer, "chat_template", None) else HeaderFormat()
