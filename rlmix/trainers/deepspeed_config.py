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

from rlmix.config.schema import TrainerPrecision
from rlmix.config.deepspeed import DeepSpeedConfig, check_deepspeed


def deepspeed_json(ds: DeepSpeedConfig, *, precision: TrainerPrecision, grad_clip: float) -> dict:
    """The DeepSpeed config dict for one rank (module docstring for the fixed parts)."""
    check_deepspeed(ds, bf16=precision is TrainerPrecision.bf16)
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
        "bf16": {"enabled": precision is TrainerPrecision.bf16},
        # FP16: dynamic loss scaling from 2^10 (DeepSpeed skips an overflowing step and halves it).
        "fp16": {"enabled": precision is TrainerPrecision.fp16, "loss_scale": 0, "initial_scale_power": 10},
        "data_types": {"grad_accum_dtype": ds.grad_accum_dtype.value},
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
