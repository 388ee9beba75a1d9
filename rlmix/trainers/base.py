"""The trainer interface. Every backend (torch, DeepSpeed) implements it and passes tests/test_trainer_contract.py."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from rlmix.rollout import Rollouts


@runtime_checkable
class Trainer(Protocol):
    """Learns from scored rollouts with the configured objective and correction.

    ``train_step`` takes one batch whose ``rewards`` and ``group_ids`` are filled, computes
    advantages, recomputes trainer log-probs, applies the correction, steps the optimizer and
    bumps ``version``. It returns plain floats keyed by the stable metric names
    (``train/loss``, ``train/grad_norm``, ``mismatch/kl_k3``, ...).
    ``published_weights`` returns the Hugging Face-named state dict (CPU tensors) for samplers.
    """

    @property
    def version(self) -> int: ...

    def train_step(self, batch: Rollouts) -> dict[str, float]: ...

    def published_weights(self) -> dict[str, torch.Tensor]: ...

    def save_checkpoint(self, path: Path) -> None: ...

    def load_checkpoint(self, path: Path) -> None: ...
