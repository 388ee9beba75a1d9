"""Episodes as a ``rlmix.rollout.Rollouts`` batch, so evaluated episodes can be trained on.

Per episode b: ``prompt_ids[b]`` = the first prompt (system + instruction, as rendered by the model
policy); ``completion_ids[b]`` = everything after it, policy turns and environment observations
interleaved; ``mask[b]`` True only on policy tokens (environment tokens never enter the loss);
``sampler_logprobs[b]`` the sampler's log q on policy tokens, 0 elsewhere. Scripted policies produce
no tokens and give empty rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlmix.agentic.episode import END_SUBMIT, Episode


def episodes_to_rollouts(episodes: Sequence[Episode], rewards: Sequence[float], pad_id: int,
                         pool: str = "eval", temperature: float = 1.0):
    """Shapes: B = len(episodes), P = longest prompt, T = longest completion (right-padded)."""
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
    task_index = {tid: i for i, tid in enumerate(dict.fromkeys(e.task_id for e in episodes))}
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_lens=torch.tensor([e.tokens.prompt_len for e in episodes], dtype=torch.int64),
        completion_ids=completion_ids,
        mask=mask,
        sampler_logprobs=logprobs,
        policy_version=torch.tensor([e.tokens.policy_version for e in episodes], dtype=torch.int64),
        pool=(pool,) * B,
        finish_reason=tuple(FINISH_STOP if e.end_reason == END_SUBMIT else FINISH_LENGTH for e in episodes),
        temperature=temperature,
        task_ids=tuple(e.task_id for e in episodes),
        group_ids=torch.tensor([task_index[e.task_id] for e in episodes], dtype=torch.int64),
        rewards=torch.tensor(list(rewards), dtype=torch.float32),
        format_ok=torch.tensor([e.format_errors == 0 for e in episodes], dtype=torch.bool),
    )
