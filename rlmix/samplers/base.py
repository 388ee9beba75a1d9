"""The sampler interface. Every backend (torch, vLLM) implements it and passes tests/test_sampler_contract.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from rlmix.rollout import Rollouts, SamplingParams


@runtime_checkable
class Sampler(Protocol):
    """Generates completions with one precision view of the trainer's weights.

    ``load_weights`` receives the trainer's published state dict (Hugging Face Llama parameter
    names, BF16 or FP32 tensors) and applies this sampler's own precision view to it.
    ``generate`` returns a ``Rollouts`` whose ``policy_version`` is the version last loaded.
    """

    pool: str

    @property
    def version(self) -> int: ...

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None: ...

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts: ...

    def close(self) -> None: ...
