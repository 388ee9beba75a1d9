"""Schema of ``trainer.deepspeed.*`` and the rules DeepSpeed needs (the JSON is built in rlmix/trainers)."""

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

    # 1 or 2 (optimizer / + gradient partitioning); 3 also partitions parameters; 0: none (not with bf16)
    zero_stage: int = 1
    ranks: int = 1  # data-parallel ranks, one Ray actor each; the batch is split across them
    grad_accum_dtype: GradAccumDtype = GradAccumDtype.fp32  # gradient accumulation over micro-batches
    comm_backend: CommBackend = CommBackend.auto
    overlap_comm: bool = False  # overlap gradient reduction with backward (GPUs; zero_stage 2 or 3 only)
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 50_000_000  # elements per gradient-reduction bucket
    build_shm_op: bool = False  # compile DeepSpeed's CPU shared-memory comm op (~40 s once); gloo suffices


def check_deepspeed(ds: DeepSpeedConfig, bf16: bool) -> None:
    """Refuse settings DeepSpeed cannot run correctly, naming the keys to change."""
    if ds.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"trainer.deepspeed.zero_stage={ds.zero_stage}: must be 0 (trainer.precision fp32 or "
                          "fp16 only), 1, 2 or 3")
    if ds.zero_stage == 0 and bf16:
        raise ConfigError(
            "trainer.deepspeed.zero_stage=0 with trainer.precision=bf16: DeepSpeed's stage-0 BF16 path takes a "
            "spurious first optimizer step; use zero_stage 1, 2 or 3"
        )
    if ds.overlap_comm and ds.zero_stage < 2:
        # rlmix runs DeepSpeed with managed_gradient_accumulation=False (rlmix/trainers/deepspeed_config.py),
        # where DeepSpeed asserts at initialize that overlap_comm comes with gradient partitioning.
        raise ConfigError(f"trainer.deepspeed.overlap_comm=true with zero_stage={ds.zero_stage}: DeepSpeed overlaps "
                          "gradient reduction only with zero_stage 2 or 3; raise zero_stage or set overlap_comm false")
    if ds.ranks < 1:
        raise ConfigError(f"trainer.deepspeed.ranks={ds.ranks}: must be >= 1")
    if ds.reduce_bucket_size < 1:
        raise ConfigError(f"trainer.deepspeed.reduce_bucket_size={ds.reduce_bucket_size}: must be >= 1")


def check_deepspeed_fp16(cuda_ranks: bool) -> None:
    """trainer.precision=fp16 on DeepSpeed needs CUDA ranks: DeepSpeed's CPU accelerator has no fp16."""
    if not cuda_ranks:
        raise ConfigError("trainer.precision=fp16 with trainer.backend=deepspeed needs CUDA ranks (DeepSpeed's CPU "
                          "accelerator has no fp16); on the CPU use trainer.backend=torch or trainer.precision=bf16")
