"""The plain-torch trainer: fp32 master weights, BF16 (or FP16, loss-scaled) autocast forward, AdamW."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from rlmix.config.schema import TrainerConfig, TrainerPrecision
from rlmix.correction import Correction
from rlmix.rollout import Rollouts
from rlmix.trainers.attention import set_attention_backward
from rlmix.trainers.precision import autocast_dtype, published_dtype
from rlmix.trainers.schedule import scheduled_lr
from rlmix.trainers.step import (
    advantages_for,
    batch_metrics,
    checkpoint_activations,
    count_sequences,
    forward_backward,
    needs_trainer_logprobs,
    optimizer_step_rows,
    reference_model,
    trainer_logprobs,
    with_ref_logprobs,
)

STATE_FILE = "trainer_state.pt"


class TorchTrainer:
    """Implements ``rlmix.trainers.base.Trainer`` in one process."""

    def __init__(self, model_dir: str | Path, cfg: TrainerConfig, correction: Correction, seed: int):
        from rlmix.models.io import load_tokenizer, load_trainable_lm

        torch.manual_seed(seed)
        self.cfg, self.correction = cfg, correction
        self.model = load_trainable_lm(model_dir, dtype=torch.float32)
        set_attention_backward(self.model, cfg.attention_backward)  # on the CPU, dense: a faster backward
        checkpoint_activations(self.model, cfg.activation_checkpointing)
        self.reference = reference_model(model_dir, correction, "cpu" if cfg.ref_on_cpu else self.model.device)
        self.tokenizer = load_tokenizer(model_dir)
        self.pad_id = self.tokenizer.pad_token_id
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        # FP16 gradients underflow without loss scaling; an overflowing step is skipped (and counted)
        # while the scale settles.
        fp16 = cfg.precision is TrainerPrecision.fp16
        self.scaler = torch.amp.GradScaler(self.model.device.type, init_scale=2.0**10) if fp16 else None
        self._version = 0
        self.skipped_steps = 0

    @property
    def version(self) -> int:
        return self._version

    def train_step(self, batch: Rollouts) -> dict[str, float]:
        """One rollout batch: ``trainer.ppo_epochs`` passes of one optimizer step per mini-batch."""
        advantages = advantages_for(batch, self.correction)  # whole groups, once per batch
        passes = optimizer_step_rows(batch, self.cfg)
        micro = dict(pad_id=self.pad_id, micro_batch_size=self.cfg.micro_batch_size,
                     max_tokens=self.cfg.max_tokens_per_micro_batch, autocast=autocast_dtype(self.cfg.precision))
        if needs_trainer_logprobs(passes, self.correction):
            batch = batch.replace(trainer_logprobs=trainer_logprobs(self.model, batch, self.correction, **micro))
        batch = with_ref_logprobs(self.reference, batch, self.correction, **micro)
        lr = scheduled_lr(self.cfg, self._version)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        results, grad_norms = [], []
        for rows in passes:
            mini = batch if len(passes) == 1 else batch.rows(rows)
            result = forward_backward(self.model, mini, advantages[rows], self.correction, backward=self._backward,
                                      num_tokens=mini.num_tokens, num_sequences=count_sequences(mini), **micro)
            grad_norms.append(self._apply(result.loss))
            results.append(result)
        metrics = batch_metrics(batch, passes, results, grad_norms, self._version, self.skipped_steps, lr)
        self._version += 1
        return metrics

    def _apply(self, loss: float) -> float:
        """Clip, then step the optimizer on the accumulated gradients; the pre-clip norm."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip))
        skipped = not (torch.isfinite(torch.tensor([loss, grad_norm])).all())
        if skipped:  # NaN/inf never reaches the optimizer: drop the step and say so
            self.skipped_steps += 1
        else:
            self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update()  # halves the scale after an overflow, grows it after a quiet stretch
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def published_weights(self) -> dict[str, torch.Tensor]:
        # The trainer's 16-bit view: what a BF16 (FP16) trainer hands to its samplers.
        dtype = published_dtype(self.cfg.precision)
        return {name: p.detach().to(dtype).clone() for name, p in self.model.state_dict().items()}

    def save_checkpoint(self, path: Path) -> None:
        """An HF model dir (loadable by any sampler or ``rlmix eval``) plus optimizer, RNG and version."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "version": self._version,
                "skipped_steps": self.skipped_steps,
                "loss_scale": None if self.scaler is None else self.scaler.state_dict(),
                "rng_torch": torch.get_rng_state(),
                "rng_python": random.getstate(),
            },
            path / STATE_FILE,
        )

    def load_checkpoint(self, path: Path) -> None:
        from rlmix.models.io import load_causal_lm

        path = Path(path)
        self.model.load_state_dict(load_causal_lm(path, dtype=torch.float32).state_dict())
        state = torch.load(path / STATE_FILE, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self._version = state["version"]
        self.skipped_steps = state["skipped_steps"]
        if self.scaler is not None and state.get("loss_scale"):
            self.scaler.load_state_dict(state["loss_scale"])
        torch.set_rng_state(state["rng_torch"])
        random.setstate(state["rng_python"])
