"""The trainer's view of sampled tokens, for code that measures against it without training.

``TrainerView`` holds the model in fp32 and computes, for a batch of sampled sequences, the
logits training would compute on them (``token_batch`` under the trainer's autocast), so that a
measurement (``rlmix probe``) reports the mismatch the correction actually sees.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlmix.config.schema import TrainerPrecision
from rlmix.models.io import load_causal_lm
from rlmix.rollout import Rollouts
from rlmix.trainers.precision import autocast_dtype
from rlmix.trainers.tokens import TokenBatch, token_batch


class TrainerView:
    """The trainer's fp32 model under its ``trainer.precision`` autocast, read-only."""

    def __init__(self, model_dir: str | Path, precision: TrainerPrecision, pad_id: int, replay_support: bool,
                 replay_routes: bool = False):
        self.pad_id, self.replay_support, self.replay_routes = pad_id, replay_support, replay_routes
        self.autocast = autocast_dtype(precision)
        self.model = load_causal_lm(model_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def tokens(self, batch: Rollouts) -> TokenBatch:
        """The batch's generated tokens with the trainer's dense logits, exactly as training computes them."""
        return token_batch(self.model, batch, pad_id=self.pad_id, autocast=self.autocast,
                           replay_support=self.replay_support, replay_routes=self.replay_routes)
