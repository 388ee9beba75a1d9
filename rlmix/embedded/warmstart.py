"""The warm starts: a short supervised phase so RL starts from a reward in (0, 1).

``supervised_steps`` is the one optimiser loop, shared by the single-turn model (``warm_start``
here) and the agent model (``rlmix.embedded.minicode_agent.warmstart``): AdamW, gradients clipped
to norm 1, a schedule per step; what differs (the batches, the schedule, what happens after a
step and when to stop) is passed in.

The single-turn warm start on minicode. Loss: token-level cross-entropy on the answer
``<p>PROGRAM</p></s>`` given the prompt (prompt tokens are not trained). Every ``eval_every``
steps the reward of sampled completions (temperature 1.0, the RL sampling temperature) is measured
on a held set of problems, and training stops as soon as it is at least ``target_reward_low`` —
the policy then solves easy problems often and hard ones rarely, leaving room for RL — or after
``warmup_steps``. The reward it reports is then measured afresh on new problems. Deterministic in
the seed on one machine (problem draws, initial weights and sampling all derive from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

import torch

from rlmix.config.embedded import EmbeddedModelSpec, WarmStartSpec
from rlmix.embedded.minicode import MiniCode
from rlmix.embedded.sample import sample_completions
from rlmix.tasks.base import Problem

if TYPE_CHECKING:  # types only: transformers takes seconds to import, a cache hit never needs it
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

MAX_ANSWER_TOKENS = 28  # longest reference answer (24 chars) + EOS, with a little slack
_HELD_SEED = -1  # training batches use seeds 1, 2, ...; held sets never collide with them
_FINAL_SEED = -2


@dataclass
class RewardReport:
    """Sampled reward on the held set: overall, per difficulty level, and the format-error rate."""

    reward: float
    format_error_rate: float
    reward_by_level: dict[int, float] = field(default_factory=dict)


@dataclass
class WarmStartResult:
    steps: int
    seconds: float
    final_loss: float
    history: list[dict[str, float]] = field(default_factory=list)  # one row per evaluation or log line
    report: RewardReport | None = None  # the single-turn warm start's fresh measurement


def supervised_steps(
    model: PreTrainedModel,
    steps: int,
    lr: float,
    lr_factor: Callable[[int], float],
    batch: Callable[[int], dict[str, torch.Tensor]],
    after_step: Callable[[int, float], bool],
) -> tuple[int, float]:
    """Train ``model`` in place on ``batch(step)`` for steps 1..``steps``; returns (last step, its loss).

    AdamW (betas 0.9/0.98, no weight decay) at ``lr * lr_factor(i)`` for optimiser step i (from 0),
    gradients clipped to norm 1. ``after_step(step, loss)`` may evaluate (it may leave the model in
    eval mode: each step sets train mode again) and returns True to stop early. The model is left in
    eval mode. The order of the calls is fixed: the warm-started weights depend on it.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    step, loss = 0, float("nan")
    for step in range(1, steps + 1):
        model.train()
        out = model(**batch(step))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss = out.loss.item()
        if after_step(step, loss):
            break
    model.eval()
    return step, loss


def example_output_mask(prompt: str) -> list[bool]:
    """Per prompt character: True on the example outputs and the separator after each
    (``12>21;`` -> the ``21;``), i.e. the characters a model can infer from the examples so far."""
    mask, in_output = [], False
    for ch in prompt:
        in_output = in_output or ch == ">"
        mask.append(in_output and ch != ">")
        in_output = in_output and ch not in ";?"
    return mask


def sft_batch(
    tokenizer: PreTrainedTokenizerFast, prompts: list[str], answers: list[str], output_loss: bool = True
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` (B, L) and ``labels`` (B, L); labels are -100
    except on the answer and its EOS and, with ``output_loss``, on the prompt's example outputs
    (predicting them is the in-context inference the answer needs, and gives the short warm start
    several times more signal per problem). The model shifts labels by one internally."""
    rows, label_rows = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        p = tokenizer(prompt)["input_ids"]  # <s> + one token per prompt character
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        keep = [False] + (example_output_mask(prompt) if output_loss else [False] * len(prompt))
        rows.append(p + a)
        label_rows.append([t if k else -100 for t, k in zip(p, keep, strict=True)] + a)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in label_rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def measure_reward(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    task: MiniCode,
    problems: list[Problem],
    seed: int,
    temperature: float = 1.0,
    max_new_tokens: int = MAX_ANSWER_TOKENS,
) -> RewardReport:
    """Mean reward of one sampled completion (at most ``max_new_tokens``) per problem."""
    completions = sample_completions(
        model, tokenizer, [p.prompt for p in problems], max_new_tokens, temperature, seed
    )
    scores = [task.score(p, c) for p, c in zip(problems, completions, strict=True)]
    by_level: dict[int, list[float]] = {}
    for p, s in zip(problems, scores, strict=True):
        by_level.setdefault(p.difficulty, []).append(s.reward)
    return RewardReport(
        reward=sum(s.reward for s in scores) / len(scores),
        format_error_rate=sum(not s.format_ok for s in scores) / len(scores),
        reward_by_level={lv: sum(r) / len(r) for lv, r in sorted(by_level.items())},
    )


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    spec: EmbeddedModelSpec,
    progress: Callable[[str], None],
) -> WarmStartResult:
    """Train ``model`` in place until the held-set reward reaches the target band (see module doc)."""
    task, easy = MiniCode(levels=(1, 2, 3), seed=spec.seed), MiniCode(levels=(1,), seed=spec.seed)
    return minicode_warm_start(model, tokenizer, spec, task, easy, sft_batch, progress)


def minicode_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    spec: WarmStartSpec,
    task: MiniCode,
    easy: MiniCode,
    sft: Callable[[PreTrainedTokenizerFast, list[str], list[str]], dict[str, torch.Tensor]],
    progress: Callable[[str], None],
    render: Callable[[list[Problem]], list[Problem]] = list,
    max_new_tokens: int = MAX_ANSWER_TOKENS,
) -> WarmStartResult:
    """The single-turn warm start of either embedded model: batches of ``task``'s reference answers
    (half of each from ``easy``) made by ``sft``, the reward measured every ``spec.eval_every`` steps
    on held problems as ``render`` presents them to a sampler, with at most ``max_new_tokens``."""
    held = render(task.sample(spec.eval_problems, seed=_HELD_SEED))
    start, history = time.monotonic(), []

    def batch(step: int) -> dict[str, torch.Tensor]:
        # half of each batch is level 1: single ops are learnt first and carry the early reward
        half = spec.warmup_batch_size // 2
        problems = easy.sample(half, seed=step) + task.sample(spec.warmup_batch_size - half, seed=step)
        return sft(tokenizer, [p.prompt for p in problems], [task.reference_answer(p) for p in problems])

    def evaluate(step: int, loss: float) -> bool:
        if step % spec.eval_every and step != spec.warmup_steps:
            return False
        model.eval()
        report = measure_reward(model, tokenizer, task, held, seed=spec.seed * 7919 + step,
                                max_new_tokens=max_new_tokens)
        history.append({"step": step, "loss": loss, "reward": report.reward, "seconds": time.monotonic() - start})
        levels = " ".join(f"L{lv}={r:.2f}" for lv, r in report.reward_by_level.items())
        progress(f"warm start step {step}/{spec.warmup_steps}: loss {loss:.3f}, reward {report.reward:.3f} "
                 f"({levels}), format errors {report.format_error_rate:.2f}, {time.monotonic() - start:.0f}s")
        return report.reward >= spec.target_reward_low

    ramp = max(1, spec.warmup_steps // 10)  # linear LR ramp, then constant: stopping is by reward
    step, loss = supervised_steps(model, spec.warmup_steps, spec.warmup_lr, lambda s: min(1.0, (s + 1) / ramp),
                                  batch, evaluate)
    # The stopping measurement is biased upwards (training stops on a lucky draw): report a fresh
    # one on twice as many new problems.
    final_set = render(task.sample(2 * spec.eval_problems, seed=_FINAL_SEED))
    report = measure_reward(model, tokenizer, task, final_set, seed=spec.seed * 7919 - 1,
                            max_new_tokens=max_new_tokens)
    progress(f"warm start done after {step} steps: reward {report.reward:.3f} on {len(final_set)} fresh problems")
    return WarmStartResult(step, time.monotonic() - start, loss, history, report)
