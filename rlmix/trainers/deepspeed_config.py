"""The DeepSpeed trainer's typed config and the DeepSpeed JSON built from it (no deepspeed import).

Users set ``trainer.deepspeed.*`` through Hydra; nobody hand-edits DeepSpeed JSON. The JSON is
built once per rank by ``deepspeed_json``; its fixed parts encode how rlmix drives the engine:

- rlmix micro-batches the step itself (rlmix/trainers/step.py) and normalises the loss by the
  GLOBAL token count, so DeepSpeed runs in unmanaged gradient accumulation: ``backward`` only
  accumulates, ``step()`` is the accumulation boundary, and nothing divides by a GAS count.
- BF16 runs with ZeRO stage >= 1: the ZeRO optimizer keeps fp32 master weights and fp32
  gradient accumulation (``data_types.grad_accum_dtype``). DeepSpeed 0.19.8's stage-0 BF16 path
  takes one optimizer step with zero gradients during ``initialize``, so it is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rlmix.errors import ConfigError


class CommBackend(enum.Enum):
    auto = "auto"  # gloo on the CPU, nccl on CUDA
    gloo = "gloo"
    nccl = "nccl"


class GradAccumDtype(enum.Enum):
    fp32 = "fp32"
    bf16 = "bf16"


@dataclass
class DeepSpeedConfig:
    """``trainer.deepspeed``: how the DeepSpeed backend shards and communicates."""

    zero_stage: int = 1  # 1 or 2 (optimizer / + gradient partitioning); 3 also partitions parameters
    ranks: int = 1  # data-parallel ranks, one Ray actor each; the batch is split across them
    grad_accum_dtype: GradAccumDtype = GradAccumDtype.fp32  # gradient accumulation over micro-batches
    comm_backend: CommBackend = CommBackend.auto
    overlap_comm: bool = False  # overlap gradient reduction with backward (useful on GPUs)
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 50_000_000  # elements per gradient-reduction bucket
    build_shm_op: bool = False  # compile DeepSpeed's CPU shared-memory comm op (~40 s once); gloo suffices


def check_deepspeed(ds: DeepSpeedConfig, bf16: bool) -> None:
    """Refuse settings DeepSpeed cannot run correctly, naming the keys to change."""
    if ds.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"trainer.deepspeed.zero_stage={ds.zero_stage}: must be 1, 2 or 3")
    if ds.zero_stage == 0 and bf16:
        raise ConfigError(
            "trainer.deepspeed.zero_stage=0 with trainer.bf16=true: DeepSpeed's stage-0 BF16 path takes a "
            "spurious first optimizer step; use zero_stage 1 or 2"
        )
    if ds.ranks < 1:
        raise ConfigError(f"trainer.deepspeed.ranks={ds.ranks}: must be >= 1")
    if ds.reduce_bucket_size < 1:
        raise ConfigError(f"trainer.deepspeed.reduce_bucket_size={ds.reduce_bucket_size}: must be >= 1")


def deepspeed_json(ds: DeepSpeedConfig, *, bf16: bool, grad_clip: float) -> dict:
    """The DeepSpeed config dict for one rank (module docstring for the fixed parts)."""
    check_deepspeed(ds, bf16)
    zero: dict = {"stage": ds.zero_stage}
    if ds.zero_stage > 0:
        zero |= {
            "overlap_comm": ds.overlap_comm,
            "contiguous_gradients": ds.contiguous_gradients,
            "reduce_bucket_size": ds.reduce_bucket_size,
        }
    return {
        # Batch sizes are bookkeeping only: rlmix splits, micro-batches and normalises itself.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": ds.ranks,
        "managed_gradient_accumulation": False,
        "gradient_clipping": grad_clip,
        "bf16": {"enabled": bf16},
        "data_types": {"grad_accum_dtype": ds.grad_accum_dtype.value},
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
