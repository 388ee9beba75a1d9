"""The agent policy interface and the model-backed adapter.

A policy sees a ``Transcript`` and answers with one ``PolicyTurn``. The token view of an episode is
built incrementally and never re-tokenised: ``Transcript.token_ids`` holds every token so far; a
model policy renders only the messages after ``Transcript.rendered``, appends them (its
``context_ids``, environment tokens: loss mask False) and generates its own tokens (``token_ids``,
mask True, with the sampler's log-probs). So the record of an episode is exactly what the model saw
and produced, and can be trained on (``rlmix.agentic.records.episodes_to_rollouts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # torch-free at import time
    from rlmix.rollout import SamplingParams
    from rlmix.samplers.base import Sampler

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    role: str  # one of ROLES; "tool" carries command output and format errors
    text: str


@dataclass
class Transcript:
    task_id: str
    sample: int
    messages: list[Message]
    token_ids: list[int] = field(default_factory=list)  # every token so far (context and policy)
    rendered: int = 0  # messages[:rendered] are already in token_ids
    tokens_left: int = 0  # of the episode's max_total_tokens


@dataclass(frozen=True)
class PolicyTurn:
    text: str
    token_ids: tuple[int, ...] = ()  # tokens the policy generated (loss mask True)
    logprobs: tuple[float, ...] = ()  # sampler_logprobs, one per token_ids entry
    context_ids: tuple[int, ...] = ()  # environment tokens appended before generating (mask False)
    policy_version: int = 0
    finish_reason: str = "stop"


class AgentPolicy(Protocol):
    def act(self, transcript: Transcript) -> PolicyTurn: ...


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the adapter uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class ChatFormat:
    """Role headers and the turn terminator used to render messages as plain text."""

    headers: tuple[tuple[str, str], ...] = (("system", "<|system|>\n"), ("user", "<|user|>\n"),
                                            ("assistant", "<|assistant|>\n"), ("tool", "<|tool|>\n"))
    end: str = "\n"

    def header(self, role: str) -> str:
        return dict(self.headers)[role]

    def render(self, messages: Sequence[Message]) -> str:
        return "".join(f"{self.header(m.role)}{m.text}{self.end}" for m in messages)


class ModelPolicy:
    """Any ``rlmix.samplers.base.Sampler`` as an agent policy (one sequence per call)."""

    def __init__(self, tokenizer: Tokenizer, sampler: Sampler, params: SamplingParams,
                 chat: ChatFormat = ChatFormat()):
        self.tokenizer, self.sampler, self.params, self.chat = tokenizer, sampler, params, chat

    def act(self, transcript: Transcript) -> PolicyTurn:
        # The policy's own earlier turns are already tokens; render only what the environment added.
        new = [m for m in transcript.messages[transcript.rendered:] if m.role != "assistant"]
        text = self.chat.render(new) + self.chat.header("assistant")
        context = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        budget = min(self.params.max_new_tokens, transcript.tokens_left - len(context))
        if budget <= 0:  # the prompt alone exhausts the episode's token budget
            return PolicyTurn(text="", context_ids=context, finish_reason="length")
        rollouts = self.sampler.generate([list(transcript.token_ids) + list(context)],
                                         replace(self.params, max_new_tokens=budget))
        n = int(rollouts.mask[0].sum())
        ids = tuple(int(t) for t in rollouts.completion_ids[0, :n])
        logprobs = tuple(float(x) for x in rollouts.sampler_logprobs[0, :n])
        return PolicyTurn(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                          logprobs=logprobs, context_ids=context,
                          policy_version=int(rollouts.policy_version[0]),
                          finish_reason=rollouts.finish_reason[0])
