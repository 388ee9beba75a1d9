"""The learning-rate schedule: linear warm-up, then constant, linear or cosine decay.

Counted in TRAINER steps (rollout batches, the trainer's ``version``), not optimizer steps:
every optimizer step of one batch (``trainer.ppo_mini_batch_size``, ``trainer.ppo_epochs``) uses
that batch's rate. The rate is a function of the version alone, and the version is saved with
the optimizer state, so a resumed run continues the schedule where the checkpoint left it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlmix.config.schema import LRSchedule, TrainerConfig


def _constant(progress: float) -> float:
    return 1.0


def _linear(progress: float) -> float:
    return 1.0 - progress


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


# Each decay as the share of (1 - min_lr_ratio) left at ``progress`` in [0, 1].
DECAYS: dict[LRSchedule, Callable[[float], float]] = {
    LRSchedule.constant: _constant,
    LRSchedule.linear: _linear,
    LRSchedule.cosine: _cosine,
}


def lr_factor(step: int, schedule: LRSchedule, warmup_steps: int, decay_steps: int, min_lr_ratio: float) -> float:
    """The multiplier of ``trainer.lr`` for trainer step ``step`` (0-based: the batch about to be trained).

    Warm-up: (step + 1) / warmup_steps for step < warmup_steps. Then, with
    progress = min((step - warmup_steps) / (decay_steps - warmup_steps), 1):
    min_lr_ratio + (1 - min_lr_ratio) x decay(progress); constant is exactly 1.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule is LRSchedule.constant:
        return 1.0
    progress = min((step - warmup_steps) / max(decay_steps - warmup_steps, 1), 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * DECAYS[schedule](progress)


def scheduled_lr(cfg: TrainerConfig, step: int) -> float:
    """``cfg.lr`` (a ``TrainerConfig``) scheduled for trainer step ``step``; exactly ``cfg.lr`` when the factor is 1."""
    decay = cfg.lr_decay_steps
    if decay is None and cfg.lr_schedule is not LRSchedule.constant:  # the runner resolves null to loop.steps
        raise ValueError("trainer.lr_decay_steps is null: resolve it to loop.steps before building the trainer")
    factor = lr_factor(step, cfg.lr_schedule, cfg.lr_warmup_steps, decay or 0, cfg.min_lr_ratio)
    return cfg.lr if factor == 1.0 else cfg.lr * factor
