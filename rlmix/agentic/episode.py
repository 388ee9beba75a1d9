"""One multi-turn agent episode: policy action -> sandbox -> observation, until submit or a limit.

Limits (first hit ends the episode, ``Episode.end_reason``): ``submit``, ``max_turns``,
``token_budget`` (context + policy tokens reach ``max_total_tokens``), ``agent_timeout`` (wall clock
of the whole agent phase), ``format_errors`` (``max_format_errors`` malformed actions). A command
that outlives ``turn_timeout_s`` is killed and reported to the policy; the episode goes on.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from rlmix.agentic.actions import (SYSTEM_PROMPT, Command, FormatError, Submit, format_error_text,
                                   observation_text, parse_action)
from rlmix.agentic.harbor import HarborTask
from rlmix.agentic.policy import AgentPolicy, Message, Transcript
from rlmix.agentic.sandbox import Sandbox

from rlmix.rollout import END_REASONS

END_SUBMIT, END_MAX_TURNS, END_TOKENS, END_TIMEOUT, END_FORMAT = END_REASONS


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    turn_timeout_s: float
    agent_timeout_s: float
    max_total_tokens: int
    max_format_errors: int
    max_output_chars: int


@dataclass(frozen=True)
class TurnLog:
    """One line of ``episodes/<id>/<sample>.jsonl``."""

    turn: int
    action: str  # "command" | "submit" | "format_error"
    policy_text: str
    command: str | None
    observation: str | None
    exit_code: int | None
    timed_out: bool
    duration_s: float
    policy_tokens: int


@dataclass
class EpisodeTokens:
    """The token record: ``ids[:prompt_len]`` is the first prompt; after it, ``mask`` marks policy tokens.

    Shapes (lists of length L = len(ids)): ``mask`` True where the policy generated the token,
    ``sampler_logprobs`` its log q (0.0 where ~mask), ``versions`` the weight version that generated
    it (-1 where ~mask: an episode may span weight updates). ``extras``: per policy turn, the
    sampler's top-K head / top-p support for its tokens (``rlmix.agentic.policy.TOKEN_EXTRAS``), in
    order; ``records.episodes_to_rollouts`` scatters them to the masked positions. ``routes``: per
    policy turn of a mixture-of-experts sampler, (start of its tokens in ``ids``, the experts its call
    chose at each position it fed: ``rlmix.agentic.policy.PolicyTurn.routes``).
    ``policy_version`` is the oldest version among the policy tokens (what staleness is measured on).
    """

    ids: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    policy_version: int = 0
    extras: list[dict] = field(default_factory=list, repr=False)
    routes: list[tuple[int, object]] = field(default_factory=list, repr=False)

    def add(self, ids: tuple[int, ...], policy: bool, logprobs: tuple[float, ...] = (), version: int = -1,
            extras: dict | None = None, routes=None) -> None:
        if policy and len(logprobs) != len(ids):
            raise ValueError(f"a policy turn has {len(ids)} tokens but {len(logprobs)} log-probs")
        if policy and ids:
            self.policy_version = version if not any(self.mask) else min(self.policy_version, version)
            self.extras.append(extras or {})
            if routes is not None:
                self.routes.append((len(self.ids), routes))
        self.ids += ids
        self.mask += [policy] * len(ids)
        self.sampler_logprobs += list(logprobs) if policy else [0.0] * len(ids)
        self.versions += [version if policy else -1] * len(ids)

    def json_fields(self) -> dict:
        """What ``results.write_episode`` stores (the head and support stay in memory)."""
        return {"ids": self.ids, "mask": self.mask, "sampler_logprobs": self.sampler_logprobs,
                "versions": self.versions, "prompt_len": self.prompt_len, "policy_version": self.policy_version}


@dataclass
class Episode:
    task_id: str
    sample: int
    end_reason: str = ""
    turns: list[TurnLog] = field(default_factory=list)
    format_errors: int = 0
    tokens: EpisodeTokens = field(default_factory=EpisodeTokens)
    wall_s: float = 0.0

    @property
    def num_actions(self) -> int:
        return len(self.turns)


def _unrun(turn: int, action, out, episode: Episode) -> TurnLog:
    """The log of a last turn the token budget leaves no room to run: a malformed one counts as the
    format error it is; a command is logged without an observation."""
    if isinstance(action, FormatError):
        episode.format_errors += 1
        return TurnLog(turn, "format_error", out.text, None, None, None, False, 0.0, len(out.token_ids))
    return TurnLog(turn, "command", out.text, action.command, None, None, False, 0.0, len(out.token_ids))


def _step(action, sandbox: Sandbox, limits: EpisodeLimits, episode: Episode,
          time_left_s: float) -> tuple[str, dict]:
    """Execute one parsed action; returns (observation text, TurnLog fields)."""
    if isinstance(action, FormatError):
        episode.format_errors += 1
        obs = format_error_text(action, episode.format_errors, limits.max_format_errors)
        return obs, dict(action="format_error", command=None, exit_code=None, timed_out=False, duration_s=0.0)
    # A command may not outlive the agent phase either.
    timeout_s = max(1.0, min(limits.turn_timeout_s, time_left_s))
    res = sandbox.run(action.command, timeout_s=timeout_s)
    obs = observation_text(res.exit_code, res.output, res.timed_out, timeout_s, limits.max_output_chars)
    return obs, dict(action="command", command=action.command, exit_code=res.exit_code,
                     timed_out=res.timed_out, duration_s=res.duration_s)


def run_episode(task: HarborTask, sample: int, policy: AgentPolicy, sandbox: Sandbox,
                limits: EpisodeLimits, system_prompt: str = SYSTEM_PROMPT) -> Episode:
    """Run the agent phase in ``sandbox`` (already holding a clean repository); the caller grades it.

    ``system_prompt=""`` sends no system message (the embedded task's model never saw one).
    """
    start = time.monotonic()
    episode = Episode(task_id=task.task_id, sample=sample)
    first = [Message("system", system_prompt)] if system_prompt else []
    transcript = Transcript(task.task_id, sample, first + [Message("user", task.instruction)],
                            tokens_left=limits.max_total_tokens)
    for turn in range(limits.max_turns):
        if time.monotonic() - start >= limits.agent_timeout_s:
            episode.end_reason = END_TIMEOUT
            break
        out = policy.act(transcript)
        if out.finish_reason == "length" and not out.token_ids and out.context_ids:
            # The rendered observation left no room to generate: the model never saw it, so drop it.
            episode.end_reason = END_TOKENS
            break
        if turn == 0:
            episode.tokens.prompt_len = len(out.context_ids)
        episode.tokens.add(out.context_ids, policy=False)
        episode.tokens.add(out.token_ids, policy=True, logprobs=out.logprobs, version=out.policy_version,
                           extras=out.extras, routes=out.routes)
        transcript.messages.append(Message("assistant", out.text))
        transcript.token_ids += [*out.context_ids, *out.token_ids]
        transcript.rendered = len(transcript.messages)
        transcript.tokens_left = limits.max_total_tokens - len(transcript.token_ids)
        action = parse_action(out.text)
        if isinstance(action, Submit):
            episode.turns.append(TurnLog(turn, "submit", out.text, None, None, None, False, 0.0, len(out.token_ids)))
            episode.end_reason = END_SUBMIT
            break
        if transcript.tokens_left <= 0:
            # No room for the observation and another turn: running the command would be wasted. The
            # turn is still an action of the episode (its tokens are trained): logged and counted.
            episode.turns.append(_unrun(turn, action, out, episode))
            episode.end_reason = END_TOKENS
            break
        obs, fields = _step(action, sandbox, limits, episode, limits.agent_timeout_s - (time.monotonic() - start))
        episode.turns.append(TurnLog(turn=turn, policy_text=out.text, observation=obs,
                                     policy_tokens=len(out.token_ids), **fields))
        transcript.messages.append(Message("tool", obs))
        if episode.format_errors >= limits.max_format_errors:
            episode.end_reason = END_FORMAT
            break
    else:
        episode.end_reason = END_MAX_TURNS
    episode.wall_s = time.monotonic() - start
    return episode


def turn_dicts(episode: Episode) -> list[dict]:
    return [asdict(t) for t in episode.turns]
