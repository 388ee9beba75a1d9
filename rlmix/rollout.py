"""The rollout record: what crosses from a sampler to the trainer.

Everything per token is a tensor; nothing per token is a Python object (rendering 128
candidates per token as objects is what makes some systems 3x slower). Shapes:

    B  sequences in the batch
    P  longest prompt            (prompts right-padded with ``pad_id``)
    T  longest completion        (completions right-padded; ``mask`` marks real tokens)
    K  top-K candidate slots     (-1 / -inf padding)
    S  recorded sampling-support slots (-1 / 0.0 padding)
    M  sparse (mixture-of-experts) layers of the model, k experts chosen per token

Log-prob semantics (docs/math.md §4): ``sampler_logprobs[b, t]`` is log q(a) under the
distribution the token was actually drawn from (temperature applied, and renormalised over
the kept set when top-p/top-k truncated it). ``head_logprobs`` are log-probs under the
sampler's FULL-vocabulary softmax at the same temperature (not renormalised over the head).
``support_probs`` are post-filter probabilities over the kept set (each row sums to 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from rlmix.transport import TensorDict

FINISH_STOP = "stop"
FINISH_LENGTH = "length"

# Multi-turn episodes (rlmix.agentic): why an episode ended, and the columns of ``episode_stats``.
END_REASONS = ("submit", "max_turns", "token_budget", "agent_timeout", "format_errors")
EPISODE_STATS = (
    "actions",  # policy turns
    "tool_calls",  # actions that ran a command
    "format_errors",  # malformed actions
    "episode_tokens",  # prompt + observations + policy tokens
    "policy_tokens",  # tokens under the loss mask
    "wall_s",  # the sample's wall time: sandbox, episode and grading
    "env_s",  # wall_s not spent waiting for generation
    "end_reason",  # index into END_REASONS
)


@dataclass(frozen=True)
class SamplingParams:
    """How a sampler draws tokens. One instance per pool; constant for the whole run."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 32
    num_candidates: int = 0  # K: record the top-K candidates per token (0 = none)
    support_slots: int = 0  # S: record up to S support slots when top_p < 1 or top_k > 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    # One seed per prompt of a generate call: row i draws from its own stream, so its tokens do not
    # depend on what else shares the call (rlmix.agentic.batching batches unrelated episodes' turns).
    row_seeds: tuple[int, ...] | None = None

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0


@dataclass
class Rollouts:
    """B sampled completions with everything the trainer needs to correct for the sampler."""

    prompt_ids: torch.Tensor  # (B, P) int64, right-padded
    prompt_lens: torch.Tensor  # (B,) int64
    completion_ids: torch.Tensor  # (B, T) int64, right-padded
    mask: torch.Tensor  # (B, T) bool: tokens the sampler generated (the loss mask)
    sampler_logprobs: torch.Tensor  # (B, T) float32, 0 where ~mask
    policy_version: torch.Tensor  # (B,) int64: weight version that generated each sequence
    pool: tuple[str, ...]  # (B,) pool name of the sampler that produced each sequence
    finish_reason: tuple[str, ...]  # (B,) FINISH_STOP | FINISH_LENGTH
    temperature: float = 1.0
    head_ids: torch.Tensor | None = None  # (B, T, K) int64, -1 padding
    head_logprobs: torch.Tensor | None = None  # (B, T, K) float32, -inf padding
    support_ids: torch.Tensor | None = None  # (B, T, S) int64, -1 padding
    support_probs: torch.Tensor | None = None  # (B, T, S) float32, 0 padding
    # Mixture-of-experts models only: (B, P + T, M, k) int16, -1 padding. The experts each sparse
    # layer chose at each position of the row's sequence, indexed as ``sequence_input_ids`` lays it
    # out (prompt tokens at 0..prompt_len-1, completion token t at prompt_len + t); the last generated
    # token, never fed back, has none. Completion token t's log-prob was drawn from position
    # prompt_len + t - 1.
    routed_experts: torch.Tensor | None = None
    # Filled in by the task after scoring; the sampler leaves the defaults.
    task_ids: tuple[str, ...] = ()
    group_ids: torch.Tensor | None = None  # (B,) int64: samples of one prompt share a group
    rewards: torch.Tensor | None = None  # (B,) float32
    format_ok: torch.Tensor | None = None  # (B,) bool
    reward_errors: torch.Tensor | None = None  # (B,) bool: the reward function raised (reward 0, own group)
    exploit_suspected: torch.Tensor | None = None  # (B,) bool: the grader caught a known reward hack (reward 0)
    gen_time_s: float = 0.0
    tags: dict[str, str] = field(default_factory=dict)  # accelerator, precision, kernel, backend
    # Episodes only (rlmix.agentic.records): (B, len(EPISODE_STATS)) float32, and the episodes of the
    # producing requests left out because their sandbox failed (never scored, never trained).
    episode_stats: torch.Tensor | None = None
    infra_errors: int = 0
    # Filled in by the trainer when PPO takes several optimizer steps on the batch against its own
    # log-probs: (B, T) float32 log pi_old(a) at the weights that took the batch's first update.
    trainer_logprobs: torch.Tensor | None = None
    # Filled in by the trainer when correction.kl_coef > 0: (B, T) float32 log pi_ref(a) under the
    # frozen reference (the start weights).
    ref_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    def replace(self, **changes) -> Rollouts:
        return dataclasses.replace(self, **changes)

    def __reduce_ex__(self, protocol: int):
        """Pickled with its tensors in one buffer (``rlmix.transport``): how a sampler's rows reach
        the driver and a batch the trainer."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        tensors = TensorDict((name, v) for name, v in values.items() if isinstance(v, torch.Tensor))
        rest = {name: v for name, v in values.items() if name not in tensors}
        return _rebuild_rollouts, (rest, tensors)

    def rows(self, rows: slice | torch.Tensor) -> Rollouts:
        """The sequences ``rows`` (a slice or an index tensor): every per-sequence tensor and tuple is cut along dim 0."""
        n, changes = len(self), {}
        picked = None if isinstance(rows, slice) else rows.tolist()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (isinstance(value, torch.Tensor) and value.dim() >= 1 or isinstance(value, tuple)) and len(value) == n:
                if isinstance(value, tuple) and picked is not None:
                    changes[f.name] = tuple(value[i] for i in picked)
                else:
                    changes[f.name] = value[rows]
        return self.replace(**changes)

    def to(self, device: torch.device | str) -> Rollouts:
        """Every tensor field on ``device`` (the trainer's), the rest unchanged."""
        moved = {
            f.name: value.to(device)
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), torch.Tensor)
        }
        return self.replace(**moved)


def sequence_input_ids(batch: Rollouts, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and completion of each row laid end to end, right-padded.

    Returns ``input_ids`` (B, L) and ``target_pos`` (B, T): the position whose logits predict
    completion token t, i.e. prompt_len + t − 1. Right padding keeps every real token's
    causal context free of padding, so no attention mask is needed for the positions we read.
    """
    B, T = batch.completion_ids.shape
    lens = batch.prompt_lens  # (B,)
    device = batch.completion_ids.device
    L = int(lens.max()) + T
    input_ids = torch.full((B, L), pad_id, dtype=torch.long, device=device)
    P = batch.prompt_ids.shape[1]
    input_ids[:, :P] = batch.prompt_ids
    completion_pos = lens[:, None] + torch.arange(T, device=device)[None, :]  # (B, T)
    input_ids.scatter_(1, completion_pos, batch.completion_ids)
    return input_ids, completion_pos - 1


def _rebuild_rollouts(rest: dict, tensors: dict[str, torch.Tensor]) -> Rollouts:
    return Rollouts(**rest, **tensors)


def _pad_cat(tensors: list[torch.Tensor | None], value: float | int) -> torch.Tensor | None:
    """Concatenate along dim 0, right-padding every other dim to the largest size."""
    if any(t is None for t in tensors):
        if all(t is None for t in tensors):
            return None
        raise ValueError("cannot concatenate rollouts where only some carry an optional field")
    if tensors[0].dim() == 1:
        return torch.cat(tensors)
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    out = []
    for t in tensors:
        pad: list[int] = []
        for d in reversed(range(1, t.dim())):
            pad += [0, shape[d - 1] - t.shape[d]]
        out.append(torch.nn.functional.pad(t, pad, value=value))
    return torch.cat(out)


def _routes_or_none(parts: list[Rollouts]) -> list[torch.Tensor | None]:
    """Each part's ``routed_experts``; a part from a pool that records none (vLLM) gets an all -1 one,
    so a mixed fleet's batch still carries the torch pools' records."""
    shapes = [p.routed_experts.shape[2:] for p in parts if p.routed_experts is not None]
    if not shapes:
        return [None] * len(parts)
    return [
        p.routed_experts if p.routed_experts is not None else torch.full(
            (len(p), p.prompt_ids.shape[1] + p.completion_ids.shape[1], *shapes[0]), -1, dtype=torch.int16)
        for p in parts
    ]


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Concatenate rollouts from several requests (and pools) into one training batch."""
    if not parts:
        raise ValueError("nothing to concatenate")
    temps = {p.temperature for p in parts}
    if len(temps) != 1:
        raise ValueError(f"rollouts sampled at different temperatures {sorted(temps)} cannot share a batch")

    def cat(name: str, value: float | int) -> torch.Tensor | None:
        return _pad_cat([getattr(p, name) for p in parts], value)

    return Rollouts(
        prompt_ids=cat("prompt_ids", pad_id),
        prompt_lens=cat("prompt_lens", 0),
        completion_ids=cat("completion_ids", pad_id),
        mask=cat("mask", False),
        sampler_logprobs=cat("sampler_logprobs", 0.0),
        policy_version=cat("policy_version", 0),
        pool=sum((p.pool for p in parts), ()),
        finish_reason=sum((p.finish_reason for p in parts), ()),
        temperature=parts[0].temperature,
        head_ids=cat("head_ids", -1),
        head_logprobs=cat("head_logprobs", float("-inf")),
        support_ids=cat("support_ids", -1),
        support_probs=cat("support_probs", 0.0),
        routed_experts=_pad_cat(_routes_or_none(parts), -1),
        task_ids=sum((p.task_ids for p in parts), ()),
        group_ids=cat("group_ids", 0),
        rewards=cat("rewards", 0.0),
        format_ok=cat("format_ok", False),
        reward_errors=cat("reward_errors", False),
        exploit_suspected=cat("exploit_suspected", False),
        gen_time_s=sum(p.gen_time_s for p in parts),
        episode_stats=cat("episode_stats", 0.0),
        infra_errors=sum(p.infra_errors for p in parts),
    )
