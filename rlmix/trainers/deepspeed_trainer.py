"""The DeepSpeed BF16 trainer: ZeRO 1/2 (3 where it works), one or several data-parallel ranks.

``DeepSpeedTrainer`` implements ``rlmix.trainers.base.Trainer``. With ``ranks=1`` the engine
lives in this process; with several, each rank is a Ray actor (rlmix/trainers/deepspeed_rank.py)
joined by torch.distributed (gloo on the CPU, NCCL on GPUs). Per step this coordinator computes
the group advantages on the whole batch, splits it into contiguous row shards (one per rank),
passes every rank the GLOBAL token count (docs/math.md §3.2) and the number of backward passes
to run, and merges the ranks' results into one set of metrics — the same loss
(rlmix/trainers/loss.py via step.py) and the same metrics as the torch trainer.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from rlmix.config.schema import TrainerConfig, TrainerPrecision
from rlmix.correction import Correction
from rlmix.rollout import Rollouts
from rlmix.config.deepspeed import check_deepspeed, check_deepspeed_fp16
from rlmix.trainers.deepspeed_rank import DeepSpeedRank, RankSetup, RankStep, comm_backend, free_port
from rlmix.trainers.step import (
    advantages_for,
    batch_metrics,
    count_sequences,
    merge_step_results,
    micro_batches,
    needs_trainer_logprobs,
    optimizer_step_rows,
    plan_micro_batches,
)
from rlmix.trainers.schedule import scheduled_lr

STATE_FILE = "trainer_state.json"


def shard_rows(batch: Rollouts, ranks: int) -> list[tuple[Rollouts, slice] | None]:
    """Contiguous row shards, one per rank (None for a rank left without rows)."""
    size = max(1, math.ceil(len(batch) / ranks))
    shards: list[tuple[Rollouts, slice] | None] = list(micro_batches(batch, size))
    return shards + [None] * (ranks - len(shards))


def backward_count(shard: Rollouts | None, micro_batch_size: int, max_tokens: int | None = None) -> int:
    """Backward passes ``step.forward_backward`` runs on ``shard``: its micro-batches with tokens."""
    if shard is None:
        return 0
    return sum(bool(shard.mask[rows].any()) for rows in plan_micro_batches(shard, micro_batch_size, max_tokens))


class DeepSpeedTrainer:
    """Implements ``rlmix.trainers.base.Trainer`` on DeepSpeed (module docstring)."""

    def __init__(self, model_dir: str | Path, cfg: TrainerConfig, correction: Correction, seed: int):
        from rlmix.models.io import load_tokenizer

        check_deepspeed(cfg.deepspeed, bf16=cfg.precision is TrainerPrecision.bf16)
        if cfg.precision is TrainerPrecision.fp16:
            check_deepspeed_fp16(cuda_ranks=comm_backend(cfg.deepspeed.comm_backend) == "nccl")
        self.cfg, self.correction = cfg, correction
        self.model_dir = Path(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.ranks_n = cfg.deepspeed.ranks
        if self.ranks_n == 1:
            self._local = DeepSpeedRank(str(model_dir), cfg, correction, seed)
            self._local.start(RankSetup(0, 1, "127.0.0.1", free_port(), own_device=False))
            self._actors = []
        else:
            import ray

            gpus = 1 if comm_backend(cfg.deepspeed.comm_backend) == "nccl" else 0
            from rlmix.metrics.quiet import inherited_runtime_env

            # The ranks write where this trainer writes (the run's workers.log).
            actor = ray.remote(num_cpus=0, num_gpus=gpus, runtime_env=inherited_runtime_env())(DeepSpeedRank)
            self._local = None
            self._actors = [actor.remote(str(model_dir), cfg, correction, seed) for _ in range(self.ranks_n)]
            addr, port = ray.get(self._actors[0].endpoint.remote())
            ray.get([a.start.remote(RankSetup(r, self.ranks_n, addr, port, own_device=gpus == 1))
                     for r, a in enumerate(self._actors)])
        self._version = 0
        self.skipped_steps = 0

    @property
    def version(self) -> int:
        return self._version

    def _on_all(self, method: str, *per_rank_args: list) -> list:
        """Call ``method`` on every rank (arguments given per rank) and wait for all results."""
        if self._local is not None:
            return [getattr(self._local, method)(*(a[0] for a in per_rank_args))]
        import ray

        refs = [getattr(a, method).remote(*(args[r] for args in per_rank_args)) for r, a in enumerate(self._actors)]
        return ray.get(refs)

    def train_step(self, batch: Rollouts) -> dict[str, float]:
        """One rollout batch: ``trainer.ppo_epochs`` passes of one optimizer step per mini-batch,
        each step's mini-batch split into row shards over the ranks."""
        advantages = advantages_for(batch, self.correction)  # whole groups, before splitting
        passes = optimizer_step_rows(batch, self.cfg)
        if needs_trainer_logprobs(passes, self.correction):
            shards = shard_rows(batch, self.ranks_n)
            logprobs = self._on_all("trainer_logprobs", [s and s[0] for s in shards])
            width = batch.mask.shape[1]
            batch = batch.replace(trainer_logprobs=torch.cat([
                torch.nn.functional.pad(lp, (0, width - lp.shape[1])) for lp in logprobs if lp is not None]))
        lr = scheduled_lr(self.cfg, self._version)
        results, grad_norms = [], []
        for rows in passes:
            mini = batch if len(passes) == 1 else batch.rows(rows)
            mini_adv = advantages[rows]
            shards = shard_rows(mini, self.ranks_n)
            backwards = max(backward_count(s and s[0], self.cfg.micro_batch_size, self.cfg.max_tokens_per_micro_batch)
                            for s in shards)
            steps: list[RankStep] = self._on_all(
                "train_shard",
                [s and s[0] for s in shards],
                [s and mini_adv[s[1]] for s in shards],
                [mini.num_tokens] * self.ranks_n,
                [count_sequences(mini)] * self.ranks_n,
                [backwards] * self.ranks_n,
                [lr] * self.ranks_n,
            )
            result = merge_step_results([s.result for s in steps])  # shards in row order: row-major
            if not steps[0].applied or not math.isfinite(result.loss):
                self.skipped_steps += 1  # DeepSpeed dropped the update (inf/NaN gradients)
            results.append(result)
            grad_norms.append(steps[0].grad_norm)  # the global norm: the same on every rank
        metrics = batch_metrics(batch, passes, results, grad_norms, self._version, self.skipped_steps, lr)
        self._version += 1
        return metrics

    def published_weights(self) -> dict[str, torch.Tensor]:
        """The BF16 weights, HF names, from rank 0 (ZeRO 3: gathered one tensor at a time)."""
        return self._export()

    def _export(self) -> dict[str, torch.Tensor]:
        if self._local is not None:
            return self._local.export_weights()
        import ray

        if self.cfg.deepspeed.zero_stage < 3:  # replicated parameters: ask rank 0 only
            return ray.get(self._actors[0].export_weights.remote())
        return ray.get([a.export_weights.remote() for a in self._actors])[0]

    def save_checkpoint(self, path: Path) -> None:
        """An HF model dir (BF16 weights, loadable by any sampler or ``rlmix eval``) plus DeepSpeed's
        sharded checkpoint (fp32 master weights, optimizer, per-rank RNG) and the trainer state."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {"version": self._version, "skipped_steps": self.skipped_steps}
        self._on_all("save_checkpoint", [str(path)] * self.ranks_n, [state] * self.ranks_n)
        self._save_hf(path, self._export())
        (path / STATE_FILE).write_text(json.dumps(state))

    def _save_hf(self, path: Path, weights: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        for name in ("config.json", "generation_config.json"):
            if (self.model_dir / name).is_file():
                shutil.copyfile(self.model_dir / name, path / name)
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"),
                  metadata={"format": "pt"})
        self.tokenizer.save_pretrained(path)

    def load_checkpoint(self, path: Path) -> None:
        path = Path(path)
        states = self._on_all("load_checkpoint", [str(path)] * self.ranks_n)
        self._version = int(states[0]["version"])
        self.skipped_steps = int(states[0]["skipped_steps"])

    def close(self) -> None:
        if self._actors:
            import ray

            for a in self._actors:
                ray.kill(a)
        self._actors = []
