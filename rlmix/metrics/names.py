"""Every stable metric name, once. ``metrics.jsonl``, W&B, the collapse monitor and the report use these.

Per-pool and per-staleness variants append ``/<pool>`` or ``/lag_<a>_<b>`` to a base name.
"""

from __future__ import annotations

# train/: one optimizer step
LOSS = "train/loss"
GRAD_NORM_KEY = "train/grad_norm"
ENTROPY = "train/entropy"
TOKENS = "train/tokens"
PADDING_FRAC = "train/padding_frac"  # share of the forward's positions that were padding
SKIPPED_STEPS = "train/skipped_steps"
RESPONSE_LEN = "train/response_len"
OPTIMIZER_STEPS = "train/optimizer_steps"  # optimizer steps taken on the batch (mini-batches x epochs)
KL_REF = "train/kl_ref"  # token mean of the KL estimate to the reference (correction.kl_coef > 0)
ENTROPY_BONUS = "train/entropy_bonus"  # correction.entropy_coef x token-mean entropy, taken off the loss
LR = "train/lr"  # the learning rate of the batch's optimizer steps (trainer.lr_schedule)

# sampling/: what loop.dynamic_sampling and loop.overlong did to the groups collected since the last step
UNIFORM_DROPPED_FRAC = "sampling/uniform_dropped_frac"  # groups dropped for equal rewards / groups collected
OVERLONG_FRAC = "sampling/overlong_frac"  # completions cut at max_new_tokens / completions collected

# reward/ and format/: what the task said about the batch
REWARD_KEY = "reward/mean"
PASS_RATE = "reward/pass_rate"
# groups whose samples all got one reward: a group baseline leaves them no advantage, so they add
# no gradient (a batch that fails every sample teaches nothing; loop.dynamic_sampling drops them)
UNIFORM_GROUPS_FRAC = "reward/uniform_groups_frac"
REWARD_ERRORS = "reward/errors"  # samples whose reward function raised (reward 0, out of their group)
EXPLOIT_SUSPECTED = "reward/exploit_suspected"  # samples the grader caught at a known reward hack (python_tests)
FORMAT_KEY = "format/error_rate"

# agent/: multi-turn episodes (rlmix.agentic; per pool with /<pool>). For episodes, format/error_rate
# is malformed actions / actions over the batch's episodes, not the share of rows with an error.
TURNS_MEAN = "agent/turns_mean"  # policy actions per episode
TOOL_CALLS_MEAN = "agent/tool_calls_mean"  # actions that ran a command, per episode
END_REASON = "agent/end_reason"  # + /<reason>: share of episodes that ended so
EPISODE_TOKENS_MEAN = "agent/episode_tokens_mean"  # prompt + observations + policy tokens
POLICY_TOKEN_FRAC = "agent/policy_token_frac"  # policy tokens / episode tokens
ENV_TIME_FRAC = "agent/env_time_frac"  # episode wall time not spent waiting for generation / wall time
INFRA_ERRORS = "agent/infra_errors"  # episodes left out because their sandbox failed (count)

# mismatch/: sampler-trainer disagreement (docs/math.md §6)
KL_KEY = "mismatch/kl_k3"
KL_K1 = "mismatch/kl_k1"
LOGPROB_ABS_DIFF = "mismatch/logprob_abs_diff"
RATIO_TAIL_FRAC = "mismatch/ratio_tail_frac"
MULT_ERROR = "mismatch/mult_error"
# mixture-of-experts models: share of (generated token, sparse layer) whose top-k experts differ
# between the trainer's router and the sampler's record (+ /<pool>; rlmix/trainers/routing.py)
ROUTER_FLIP = "mismatch/router_flip"

# where/: which generated tokens hold the mismatch and carry the gradient (rlmix/metrics/where.py).
# + /p<a>-<b>: tokens binned by the trainer's probability of the sampled token; each is a share of
# the step's total, so a bin's where/mismatch or where/grad above its where/tokens is where it sits.
# + /r<a>-<b> (where/tokens and where/grad): the same shares with tokens binned by the ratio p/q.
WHERE_TOKENS = "where/tokens"  # share of generated tokens
WHERE_MISMATCH = "where/mismatch"  # share of Σ |log p − log q|
WHERE_GRAD = "where/grad"  # share of Σ ‖∂loss/∂ℓ_t‖², ℓ_t the token's logits: the logit gradient's squared norm
WHERE_GRAD_TOP = "where/grad_top1pct"  # share of it held by the 1% of tokens with the largest norms
WHERE_GRAD_RATIO_TAIL = "where/grad_ratio_tail"  # share held by tokens whose p/q is outside mismatch/ratio_tail_frac's band

# correction/: what the correction did (docs/math.md §2, §3.2)
WEIGHT_MEAN = "correction/weight_mean"
MASKED_FRAC = "correction/masked_frac"
ESS = "correction/ess"
SC_TAIL_RATIO = "correction/sc_tail_ratio"
SC_HEAD_MASS = "correction/sc_head_mass"  # P_H: the trainer's mass on the sampler's head
SC_SAMPLER_HEAD_MASS = "correction/sc_sampler_head_mass"  # Q_H: the sampler's own
SC_COEF_L1 = "correction/sc_coef_l1"
# The record's alignment check (docs/math.md §3.3): the largest |log q(a)| difference between a sampled
# token's recorded log-prob and the same token's slot in its head (its support, for a truncating pool).
# 0 when the records line up; anything else means SC's head terms belong to other tokens.
ALIGNMENT_ERROR = "correction/alignment_error"
ALIGNMENT_TOLERANCE = 1e-3  # nats: a log ∘ exp round trip, not a misaligned row

# ppo/: the PPO-clip objective (docs/math.md §5), over every optimizer step of the batch
PPO_CLIP_FRAC = "ppo/clip_frac"  # tokens whose clipped branch was taken (no gradient through them)
PPO_RATIO_P05 = "ppo/ratio_p05"  # quantiles of the ratio p / pi_old
PPO_RATIO_P50 = "ppo/ratio_p50"
PPO_RATIO_P95 = "ppo/ratio_p95"
PPO_RATIO_MAX = "ppo/ratio_max"
PPO_OLD_SAMPLER_GAP = "ppo/old_sampler_gap"  # mean |log pi_old - log q|: 0 when pi_old is the sampler

# staleness/ and policy_version/: how old the batch's samples were
STALENESS_MEAN = "staleness/mean"
STALENESS_MAX = "staleness/max"
DROPPED_GROUPS = "staleness/dropped_groups"  # groups dropped over loop.max_staleness during the step
POLICY_VERSION_MIN = "policy_version/min"
POLICY_VERSION_MAX = "policy_version/max"

# time/ and loop/: where a step's wall time went (rlmix.orchestration.loop)
STEP_S = "time/step_s"
TRAINER_IDLE_FRAC = "time/trainer_idle_frac"  # the trainer waited for a batch: sampler-bound
SAMPLER_BUSY_FRAC = "time/sampler_busy_frac"  # share of the samplers' lanes with a request in flight
BUFFERED_GROUPS = "loop/buffered_groups"  # finished groups waiting when the step ended: trainer-bound if >= a batch
WEIGHT_SYNC_S = "time/weight_sync_s"  # publishing the step's weights to the samplers

# throughput/: tokens per second
TRAINER_TOKENS_PER_S = "throughput/trainer_tokens_per_s"  # train/tokens over the step's non-idle time
SAMPLER_TOKENS_PER_S = "throughput/sampler_tokens_per_s"  # + /<pool>: generated over the last few steps

# fault/: cumulative over the run (docs/reliability.md)
SAMPLER_RESTARTS = "fault/sampler_restarts"  # sampler actors Ray restarted that came back
REQUESTS_REISSUED = "fault/requests_reissued"  # requests a sampler died generating, served again
TRAINER_RESTARTS = "fault/trainer_restarts"  # trainer processes replaced after a death (trainer.max_restarts)

# Correction-library stat name -> metric name. The library's own per-micro-batch ESS is not
# reported: ``correction/ess`` is computed once over the whole step's weights (metrics/aggregate.py).
STAT_NAMES = {
    "kl_k3": KL_KEY,
    "kl_k1": KL_K1,
    "logprob_abs_diff": LOGPROB_ABS_DIFF,
    "ratio_tail_frac": RATIO_TAIL_FRAC,
    "weight_mean": WEIGHT_MEAN,
    "masked_frac": MASKED_FRAC,
    "sc_tail_ratio": SC_TAIL_RATIO,
    "sc_head_mass": SC_HEAD_MASS,
    "sc_sampler_head_mass": SC_SAMPLER_HEAD_MASS,
    "sc_coef_l1": SC_COEF_L1,
    "clip_frac": PPO_CLIP_FRAC,
    "ratio_p05": PPO_RATIO_P05,
    "ratio_p50": PPO_RATIO_P50,
    "ratio_p95": PPO_RATIO_P95,
    "ratio_max": PPO_RATIO_MAX,
    "old_sampler_gap": PPO_OLD_SAMPLER_GAP,
    "kl_ref": KL_REF,
    "entropy_bonus": ENTROPY_BONUS,
}
