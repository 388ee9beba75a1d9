"""One DeepSpeed data-parallel rank: a process group member holding one engine.

Used in-process for one rank and as a Ray actor (one per rank) for several. The coordinator
(rlmix/trainers/deepspeed_trainer.py) splits each batch into contiguous row shards and tells
every rank how many backward passes to run, so ranks issue the same collectives: ZeRO-2/3
reduce gradients inside every backward, and a rank whose shard has fewer non-empty
micro-batches pads with zero-loss backwards (a 1-token forward times 0: zero gradients, same
hooks and collectives).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from rlmix.rollout import Rollouts
from rlmix.config.deepspeed import CommBackend
from rlmix.trainers.attention import set_attention_backward
from rlmix.trainers.deepspeed_config import deepspeed_json
from rlmix.metrics.aggregate import StepResult
from rlmix.trainers.precision import autocast_dtype, published_dtype
from rlmix.trainers.step import (
    checkpoint_activations,
    forward_backward,
    reference_model,
    trainer_logprobs,
    with_ref_logprobs,
)

DS_DIR = "deepspeed"  # DeepSpeed's own checkpoint (fp32 master weights, optimizer partitions)
DS_TAG = "step"  # not "latest": DeepSpeed writes a file of that name beside the tag dir


@dataclass(frozen=True)
class RankSetup:
    """What every rank needs to join the process group and build its engine."""

    rank: int
    world_size: int
    master_addr: str  # rank 0's node, reachable from every rank's node
    master_port: int
    own_device: bool  # each rank sees exactly one accelerator (Ray num_gpus=1): LOCAL_RANK is 0


@dataclass
class RankStep:
    result: StepResult
    grad_norm: float
    applied: bool  # False when DeepSpeed found inf/NaN gradients and skipped the update


def comm_backend(choice: CommBackend) -> str:
    if choice is CommBackend.auto:
        return "nccl" if torch.cuda.is_available() else "gloo"
    return choice.value


def init_process_group(setup: RankSetup, backend: str, build_shm_op: bool) -> None:
    """Join the group without a launcher: DeepSpeed reads these variables (else it looks for MPI)."""
    os.environ.update(
        MASTER_ADDR=setup.master_addr,
        MASTER_PORT=str(setup.master_port),
        RANK=str(setup.rank),
        WORLD_SIZE=str(setup.world_size),
        LOCAL_RANK="0" if setup.own_device else str(setup.rank),
    )
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401  (so the module is in sys.modules)

    if not build_shm_op:
        # The shm op only speeds up CPU collectives; compiling it costs ~40 s per environment.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    if not torch.distributed.is_initialized():
        # DeepSpeed caches a clone of the world group. A clone of an earlier process group that
        # another engine in this process destroyed (vLLM's in-process one does) is stale: drop it.
        from deepspeed.utils import groups

        groups._WORLD_GROUP = None
    deepspeed.init_distributed(dist_backend=backend)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class DeepSpeedRank:
    """One rank's engine; every method that communicates must be called on all ranks.

    Two phases, so that rank 0's actor can report an address before anyone joins the group:
    construct (cheap), then ``start`` with the shared ``RankSetup``.
    """

    def __init__(self, model_dir: str, cfg, correction, seed: int) -> None:
        self.model_dir, self.cfg, self.correction, self.seed = model_dir, cfg, correction, seed

    def endpoint(self) -> tuple[str, int]:
        """This process's node address and a free port on it (asked of rank 0)."""
        import ray

        return (ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"), free_port()

    def start(self, setup: RankSetup) -> None:
        """Join the process group and build the engine (BF16 module, ZeRO optimizer over AdamW)."""
        import deepspeed

        from rlmix.models.io import load_tokenizer, load_trainable_lm

        cfg = self.cfg
        if setup.world_size > 1:
            torch.set_num_threads(max(1, (cfg.num_threads or torch.get_num_threads()) // setup.world_size))
        init_process_group(setup, comm_backend(cfg.deepspeed.comm_backend), cfg.deepspeed.build_shm_op)
        torch.manual_seed(self.seed)
        self.rank, self.world_size = setup.rank, setup.world_size
        self.pad_id = load_tokenizer(self.model_dir).pad_token_id
        model = load_trainable_lm(self.model_dir, dtype=torch.float32)
        set_attention_backward(model, cfg.attention_backward)  # on the CPU, dense: a faster backward
        checkpoint_activations(model, cfg.activation_checkpointing)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
                                      weight_decay=cfg.weight_decay)
        config = deepspeed_json(cfg.deepspeed, precision=cfg.precision, grad_clip=cfg.grad_clip)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self._reduced_grad_norm: float | None = None
        if not hasattr(self.engine.optimizer, "_global_grad_norm"):
            self._measure_reduced_grad_norm()
        self.reference = reference_model(self.model_dir, self.correction,
                                         "cpu" if cfg.ref_on_cpu else self.engine.device,
                                         dtype=next(self.engine.module.parameters()).dtype)
        self.zero_stage = cfg.deepspeed.zero_stage
        self.published = published_dtype(cfg.precision)

    def trainer_logprobs(self, shard: Rollouts | None) -> torch.Tensor | None:
        """(rows, T) log p(a) of this shard at the engine's current weights: PPO's π_old (step.py)."""
        if shard is None:
            return None
        device = self.engine.device
        with torch.device(device) if device.type != "cpu" else contextlib.nullcontext():
            out = trainer_logprobs(self.engine, shard.to(device), self.correction, pad_id=self.pad_id,
                                   micro_batch_size=self.cfg.micro_batch_size,
                                   max_tokens=self.cfg.max_tokens_per_micro_batch,
                                   autocast=autocast_dtype(self.cfg.precision))
        return out.cpu()

    def train_shard(self, shard: Rollouts | None, advantages: torch.Tensor | None, num_tokens: int,
                    num_sequences: int, backwards: int, lr: float) -> RankStep:
        """Accumulate this shard's gradients (loss over the GLOBAL ``num_tokens`` / ``num_sequences``
        of the optimizer step), pad to ``backwards``, step at learning rate ``lr``."""
        calls = 0
        for group in self.engine.optimizer.param_groups:  # ZeRO's wrapper shares its inner groups
            group["lr"] = lr

        def backward(loss: torch.Tensor) -> None:
            nonlocal calls
            # The loss is already normalised by the GLOBAL token count, so the true gradient is the
            # SUM over ranks; DeepSpeed averages over data-parallel ranks, hence the factor.
            self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
            calls += 1

        device = self.engine.device
        if shard is None:
            result = StepResult(loss=0.0, stats={}, token_stats={}, entropy=0.0, num_tokens=0)
        else:
            # The shared loss builds its index tensors on the default device: make it the engine's
            # (on the CPU skip the device mode: it intercepts every torch call).
            # π_ref first, outside the engine's device mode: the reference may live in host memory.
            shard = with_ref_logprobs(self.reference, shard.to(device), self.correction, pad_id=self.pad_id,
                                      micro_batch_size=self.cfg.micro_batch_size,
                                      max_tokens=self.cfg.max_tokens_per_micro_batch,
                                      autocast=autocast_dtype(self.cfg.precision))
            with torch.device(device) if device.type != "cpu" else contextlib.nullcontext():
                result = forward_backward(self.engine, shard, advantages.to(device),
                                          self.correction, pad_id=self.pad_id,
                                          micro_batch_size=self.cfg.micro_batch_size,
                                          autocast=autocast_dtype(self.cfg.precision),
                                          max_tokens=self.cfg.max_tokens_per_micro_batch,
                                          num_tokens=num_tokens, num_sequences=num_sequences,
                                          backward=backward)
            result.token_stats = {k: v.cpu() for k, v in result.token_stats.items()}
        for _ in range(backwards - calls):
            backward(self._zero_loss())
        self._reduced_grad_norm = None
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is None:  # stage 0 without fp16: the norm measured inside step() (_measure_reduced_grad_norm)
            grad_norm = self._reduced_grad_norm
        grad_norm = float("nan") if grad_norm is None else float(grad_norm)
        return RankStep(result, grad_norm, bool(self.engine.was_step_applied()))

    def _measure_reduced_grad_norm(self) -> None:
        """Record the pre-clip global gradient norm where DeepSpeed keeps none (its optimizer is the
        plain torch one: ZeRO stage 0 without fp16).

        The torch trainer's definition (torch.nn.utils.clip_grad_norm_, L2 over all parameters'
        gradients), taken at the one point where it is global and not yet clipped: in unmanaged
        accumulation stage 0 all-reduces the accumulated gradients inside ``step()`` (its
        ``allreduce_gradients`` at the boundary), then clips and steps. After that reduction every
        rank holds the same full gradient, so the local norm is the global one (no further
        collective). Outside ``step()`` (backward's epilogue) the call reduces nothing: skipped.
        """
        engine = self.engine
        reduce = engine.allreduce_gradients

        def allreduce_gradients(*args, **kwargs):
            reduce(*args, **kwargs)
            if engine.is_gradient_accumulation_boundary():
                grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
                self._reduced_grad_norm = float(torch.nn.utils.get_total_norm(grads, 2.0)) if grads else 0.0

        engine.allreduce_gradients = allreduce_gradients

    def _zero_loss(self) -> torch.Tensor:
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.engine.device)
        return self.engine(input_ids=ids).logits.float().sum() * 0.0

    def export_weights(self) -> dict[str, torch.Tensor] | None:
        """HF-named CPU tensors in the trainer's 16-bit format on rank 0 (None elsewhere).

        ZeRO 1/2 replicate the (BF16) module parameters on every rank, so rank 0 copies its own
        and nothing is communicated. ZeRO 3 partitions them: all ranks gather one tensor at a
        time (peak extra memory: the largest tensor), and rank 0 keeps a copy.
        """
        module = self.engine.module
        if self.zero_stage < 3:
            if self.rank != 0:
                return None
            return {k: v.detach().to("cpu", self.published).clone() for k, v in module.state_dict().items()}
        import deepspeed

        out: dict[str, torch.Tensor] = {}
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if self.rank == 0:
                    out[name] = param.detach().to("cpu", self.published).clone()
        if self.rank == 0 and getattr(module.config, "tie_word_embeddings", False) and "lm_head.weight" not in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
        return out if self.rank == 0 else None

    def save_checkpoint(self, path: str, client_state: dict) -> None:
        """DeepSpeed's sharded checkpoint (all ranks) with this rank's RNG states."""
        # Nested: DeepSpeed drops its own key names (e.g. "skipped_steps") from the client state.
        state = {"rlmix": client_state, "rng_torch": torch.get_rng_state(), "rng_python": random.getstate()}
        self.engine.save_checkpoint(str(Path(path) / DS_DIR), tag=DS_TAG, client_state=state)

    def load_checkpoint(self, path: str) -> dict:
        """Restore weights, optimizer and this rank's RNG; returns the saved client state."""
        load_path, state = self.engine.load_checkpoint(str(Path(path) / DS_DIR), tag=DS_TAG)
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {Path(path) / DS_DIR}")
        torch.set_rng_state(state["rng_torch"])
        random.setstate(state["rng_python"])
        return state["rlmix"]
