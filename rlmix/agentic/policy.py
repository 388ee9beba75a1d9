"""The agent policy interface and the model-backed adapter.

A policy sees a ``Transcript`` and answers with one ``PolicyTurn``. The token view of an episode is
built incrementally and never re-tokenised: ``Transcript.token_ids`` holds every token so far; a
model policy renders only the messages after ``Transcript.rendered``, appends them (its
``context_ids``, environment tokens: loss mask False) and generates its own tokens (``token_ids``,
mask True, with the sampler's log-probs). So the record of an episode is exactly what the model saw
and produced, and can be trained on (``rlmix.agentic.records.episodes_to_rollouts``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from rlmix.seeds import derive_seed
from rlmix.tasks.chat import ChatRenderer, chat_renderer

if TYPE_CHECKING:  # torch-free at import time
    from rlmix.rollout import Rollouts, SamplingParams
    from rlmix.samplers.base import Sampler

# The per-token record fields a sampler may add beyond log q (rlmix/rollout.py): the top-K head and
# the top-p/top-k support, each (n, K) or (n, S) for the n tokens of one turn.
TOKEN_EXTRAS = ("head_ids", "head_logprobs", "support_ids", "support_probs")

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
    extras: dict = field(default_factory=dict)  # TOKEN_EXTRAS name -> (n, K|S) tensor, n = len(token_ids)
    # Mixture-of-experts samplers only: (C + n - 1, M, k) int16, the experts each sparse layer chose at
    # every position the turn's sampler call fed (its C context tokens, then its own tokens but the last).
    routes: object = None


class AgentPolicy(Protocol):
    def act(self, transcript: Transcript) -> PolicyTurn: ...


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the adapter uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...




class ModelPolicy:
    """Any ``rlmix.samplers.base.Sampler`` as an agent policy (one sequence per call).

    ``sampler`` only needs ``generate``: a ``TurnBatcher`` (rlmix.agentic.batching) in its place
    serves the turns of many concurrent episodes with one sampler. ``chat=None`` renders with the
    tokenizer's chat template when it has one, else the fixed headers (rlmix.tasks.chat).

    With ``params.seed`` set, each turn is drawn with a seed of its own (``turn_seed``): the same
    episode and turn draw the same tokens again, and no two turns or samples share their draws.
    """

    def __init__(self, tokenizer: Tokenizer, sampler: Sampler, params: SamplingParams,
                 chat: ChatRenderer | None = None):
        self.tokenizer, self.sampler, self.params = tokenizer, sampler, params
        self.chat = chat if chat is not None else chat_renderer(tokenizer)
        self.generate_s = 0.0  # wall time spent waiting for generation (the rest of an episode is environment)

    def act(self, transcript: Transcript) -> PolicyTurn:
        # The policy's own earlier turns are already tokens; render only what the environment added.
        text = self.chat.suffix(transcript.messages, transcript.rendered)
        context = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        budget = min(self.params.max_new_tokens, transcript.tokens_left - len(context))
        if budget <= 0:  # the prompt alone exhausts the episode's token budget
            return PolicyTurn(text="", context_ids=context, finish_reason="length")
        start = time.monotonic()
        prompt = list(transcript.token_ids) + list(context)
        rollouts = self.sampler.generate([prompt],
                                         replace(self.params, max_new_tokens=budget,
                                                 seed=turn_seed(self.params.seed, transcript)))
        self.generate_s += time.monotonic() - start
        n = int(rollouts.mask[0].sum())
        ids = tuple(int(t) for t in rollouts.completion_ids[0, :n])
        logprobs = tuple(float(x) for x in rollouts.sampler_logprobs[0, :n])
        return PolicyTurn(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                          logprobs=logprobs, context_ids=context,
                          policy_version=int(rollouts.policy_version[0]),
                          finish_reason=rollouts.finish_reason[0], extras=turn_extras(rollouts, n),
                          routes=turn_routes(rollouts, len(prompt), n))


def turn_seed(seed: int | None, transcript: Transcript) -> int | None:
    """The seed of the turn ``transcript`` asks for: from the run's ``seed``, the task, the sample and
    the turn. One seed for every call would draw every turn of every episode with the same random
    numbers: the same first action on every task, the same action again after each observation,
    and identical samples of one task (pass@k with k > 1 would count one episode k times)."""
    if seed is None:
        return None
    return derive_seed(seed, "turn", transcript.task_id, transcript.sample, len(transcript.messages))


def turn_routes(rollouts: Rollouts, context: int, n: int):
    """Row 0's recorded experts at the positions its call fed (``context`` + ``n`` - 1), or None."""
    if rollouts.routed_experts is None or n < 1:
        return None
    return rollouts.routed_experts[0, :context + n - 1].clone()


def turn_extras(rollouts: Rollouts, n: int) -> dict:
    """Row 0's head and support for its first n tokens, for the fields the sampler recorded."""
    return {name: getattr(rollouts, name)[0, :n].clone() for name in TOKEN_EXTRAS
            if getattr(rollouts, name) is not None}
