"""Episodes as a ``rlmix.rollout.Rollouts`` batch: the record every correction mode trains on.

Per episode b: ``prompt_ids[b]`` = the first prompt (as rendered by the model policy);
``completion_ids[b]`` = everything after it, policy turns and environment observations
interleaved; ``mask[b]`` True only on policy tokens (environment tokens never enter the loss);
``sampler_logprobs[b]`` the sampler's log q on policy tokens, 0 elsewhere; ``head_*`` / ``support_*``
the sampler's top-K head and top-p support at policy tokens (padding elsewhere), when it recorded
them; ``routed_experts[b]`` a mixture-of-experts sampler's expert choices (``_routes``); ``policy_version[b]`` the oldest weight version among its policy tokens; ``episode_stats[b]``
the columns of ``rlmix.rollout.EPISODE_STATS``. Scripted policies produce no tokens and give empty rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlmix.agentic.episode import END_MAX_TURNS, END_TIMEOUT, END_TOKENS, Episode
from rlmix.rollout import END_REASONS, EPISODE_STATS

# Padding of the optional per-token fields off policy tokens (as in rlmix.rollout.concat_rollouts).
_PAD = {"head_ids": -1, "head_logprobs": float("-inf"), "support_ids": -1, "support_probs": 0.0}

# Episodes a budget cut short: finish reason ``length``, what ``loop.overlong`` filters or penalises
# (a completion cut at max_new_tokens). A submit, or the policy's own malformed actions
# (``format_errors``), is how the policy ended it: ``stop``, and a format error keeps its reward.
CUT_ENDINGS = frozenset({END_MAX_TURNS, END_TOKENS, END_TIMEOUT})


def episode_stat_row(e: Episode, generate_s: float = 0.0, wall_s: float | None = None) -> list[float]:
    """One row of ``EPISODE_STATS`` for episode ``e`` (``wall_s``: the sample's whole wall time)."""
    wall = e.wall_s if wall_s is None else wall_s
    n_policy = sum(e.tokens.mask)
    values = {"actions": e.num_actions, "tool_calls": sum(t.action == "command" for t in e.turns),
              "format_errors": e.format_errors, "episode_tokens": len(e.tokens.ids), "policy_tokens": n_policy,
              "wall_s": wall, "env_s": max(wall - generate_s, 0.0),
              "end_reason": END_REASONS.index(e.end_reason) if e.end_reason in END_REASONS else -1}
    return [float(values[name]) for name in EPISODE_STATS]


def _extras(episodes: Sequence[Episode], T: int):
    """(B, T, K|S) tensors scattered from each episode's per-turn extras; None where no sampler recorded them."""
    import torch

    names = {n for e in episodes for turn in e.tokens.extras for n in turn}
    out = {}
    for name in names:
        width = max(turn[name].shape[1] for e in episodes for turn in e.tokens.extras if name in turn)
        dtype = next(turn[name].dtype for e in episodes for turn in e.tokens.extras if name in turn)
        full = torch.full((len(episodes), T, width), _PAD[name], dtype=dtype)
        for b, e in enumerate(episodes):
            turns = [turn[name] for turn in e.tokens.extras]
            if len(turns) != len(e.tokens.extras) or not turns:
                continue
            values = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=_PAD[name]) for t in turns])
            pos = torch.tensor(e.tokens.mask[e.tokens.prompt_len:]).nonzero().squeeze(1)
            full[b, pos] = values
        out[name] = full
    return out


def episodes_to_rollouts(episodes: Sequence[Episode], rewards: Sequence[float], pad_id: int,
                         pool: str = "eval", temperature: float = 1.0, group_ids: Sequence[int] | None = None,
                         stats: Sequence[Sequence[float]] | None = None):
    """Shapes: B = len(episodes), P = longest prompt, T = longest completion (right-padded).

    ``group_ids`` default: one group per task id. ``stats`` default: ``episode_stat_row`` of each.
    """
    import torch

    from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, Rollouts

    if len(episodes) != len(rewards) or not episodes:
        raise ValueError(f"need one reward per episode and at least one episode, got {len(episodes)}/{len(rewards)}")
    P = max(1, max(e.tokens.prompt_len for e in episodes))
    T = max(1, max(len(e.tokens.ids) - e.tokens.prompt_len for e in episodes))
    B = len(episodes)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.int64)
    completion_ids = torch.full((B, T), pad_id, dtype=torch.int64)
    mask = torch.zeros((B, T), dtype=torch.bool)
    logprobs = torch.zeros((B, T), dtype=torch.float32)
    for b, e in enumerate(episodes):
        t = e.tokens
        n = len(t.ids) - t.prompt_len
        prompt_ids[b, : t.prompt_len] = torch.tensor(t.ids[: t.prompt_len], dtype=torch.int64)
        completion_ids[b, :n] = torch.tensor(t.ids[t.prompt_len:], dtype=torch.int64)
        mask[b, :n] = torch.tensor(t.mask[t.prompt_len:], dtype=torch.bool)
        logprobs[b, :n] = torch.tensor(t.sampler_logprobs[t.prompt_len:], dtype=torch.float32)
    if group_ids is None:
        index = {tid: i for i, tid in enumerate(dict.fromkeys(e.task_id for e in episodes))}
        group_ids = [index[e.task_id] for e in episodes]
    rows = stats if stats is not None else [episode_stat_row(e) for e in episodes]
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_lens=torch.tensor([e.tokens.prompt_len for e in episodes], dtype=torch.int64),
        completion_ids=completion_ids,
        mask=mask,
        sampler_logprobs=logprobs,
        policy_version=torch.tensor([e.tokens.policy_version for e in episodes], dtype=torch.int64),
        pool=(pool,) * B,
        finish_reason=tuple(FINISH_LENGTH if e.end_reason in CUT_ENDINGS else FINISH_STOP for e in episodes),
        temperature=temperature,
        task_ids=tuple(e.task_id for e in episodes),
        group_ids=torch.tensor(list(group_ids), dtype=torch.int64),
        rewards=torch.tensor(list(rewards), dtype=torch.float32),
        format_ok=torch.tensor([e.format_errors == 0 for e in episodes], dtype=torch.bool),
        episode_stats=torch.tensor([list(r) for r in rows], dtype=torch.float32),
        routed_experts=_routes(episodes, P + T),
        **_extras(episodes, T),
    )


def _routes(episodes: Sequence[Episode], width: int):
    """(B, width, M, k) int16, -1 where unrecorded, indexed by position in the episode's tokens (as
    ``Rollouts.routed_experts``); None when no turn recorded experts.

    Each turn's sampler call fed the whole episode so far, so a position is covered by every later
    call. A position that gave a policy token its log-prob keeps the route of the call that drew the
    token; every other position (prompt, observations) the route of the last call that fed it, whose
    KV the episode's last tokens attended to."""
    import torch

    recorded = [r for e in episodes for _, r in e.tokens.routes]
    if not recorded:
        return None
    out = torch.full((len(episodes), width, *recorded[0].shape[1:]), -1, dtype=recorded[0].dtype)
    for b, e in enumerate(episodes):
        for _, routes in e.tokens.routes:  # later calls overwrite the context they share
            out[b, : routes.shape[0]] = routes
        for start, routes in e.tokens.routes:  # each turn's own tokens: the call that drew them
            out[b, start - 1 : routes.shape[0]] = routes[start - 1 :]
    return out
