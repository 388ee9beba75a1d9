"""Rendering an episode's messages to tokens, one turn at a time (never re-tokenising earlier turns).

With a tokenizer that has a chat template (``tokenizer.chat_template``), the text added by the
environment between two policy turns is the template's rendering of all messages (with the
generation prompt) minus its rendering of the messages already in the token stream: the policy's
own tokens stay exactly as sampled and only the suffix is tokenised. Without a template, fixed
``<|role|>`` headers (``HeaderFormat``) are the fallback.

The suffix rule needs a template that renders a prefix of the messages as a prefix of the text
(every common template does); one that does not is refused with a one-line error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class ChatMessage(Protocol):
    role: str
    text: str


@dataclass(frozen=True)
class HeaderFormat:
    """The fallback: role headers and a turn terminator, rendered as plain text."""

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
    """``tokenizer.apply_chat_template`` as an incremental renderer (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def _render(self, messages: Sequence[ChatMessage], generation_prompt: bool) -> str:
        if not messages:
            return ""
        dicts = [{"role": m.role, "content": m.text} for m in messages]
        return self.tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=generation_prompt)

    def suffix(self, messages: Sequence[ChatMessage], rendered: int) -> str:
        before = self._render(messages[:rendered], generation_prompt=False)
        after = self._render(messages, generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the tokenizer's chat template does not render a prefix of the messages as a "
                             "prefix of the text, so turns cannot be appended incrementally")
        return after[len(before):]


ChatRenderer = HeaderFormat | TemplateFormat


def chat_renderer(tokenizer) -> ChatRenderer:
    """The tokenizer's own template when it has one, else the fixed headers."""
    return TemplateFormat(tokenizer) if getattr(tokenizer, "chat_template", None) else HeaderFormat()
