"""The DeepSpeed trainer on the CPU (gloo): same loss and update as plain torch, 1 and 2 ranks, checkpoints.

The oracle is a plain torch computation on the same fixed batch: the shared loss
(rlmix/trainers/step.py) on the model cast to BF16 — DeepSpeed's BF16 module — then global-norm
clipping and AdamW on fp32 master weights, which is what ZeRO's BF16 optimizer does.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from rlmix.assembly.checkpoints import zero_stage_of
from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
from rlmix.correction import Correction, CorrectionMode
from rlmix.errors import ConfigError
from rlmix.rollout import Rollouts
from rlmix.config.deepspeed import DeepSpeedConfig, GradAccumDtype, check_deepspeed
from rlmix.trainers.deepspeed_config import deepspeed_json
from rlmix.trainers.deepspeed_rank import DS_DIR, DS_TAG
from rlmix.trainers.step import advantages_for, forward_backward

pytest.importorskip("deepspeed")

LR = 1e-2  # large enough that one Adam step moves BF16 weights by many ulps


def fixed_batch(model_dir: Path, b: int = 6, t: int = 7, k: int = 8, seed: int = 0) -> Rollouts:
    """A scored batch with uneven lengths, a head of K candidates and sampler log-probs off the model's."""
    from rlmix.models.io import load_causal_lm
    from rlmix.rollout import sequence_input_ids

    g = torch.Generator().manual_seed(seed)
    model = load_causal_lm(model_dir, dtype=torch.float32)
    vocab = model.config.vocab_size
    prompt_lens = torch.randint(2, 5, (b,), generator=g)
    prompts = torch.randint(3, vocab, (b, int(prompt_lens.max())), generator=g)
    prompts[torch.arange(prompts.shape[1])[None] >= prompt_lens[:, None]] = 0
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None] < lengths[:, None]
    completion = torch.randint(3, vocab, (b, t), generator=g).masked_fill(~mask, 0)
    batch = Rollouts(prompt_ids=prompts, prompt_lens=prompt_lens, completion_ids=completion, mask=mask,
                     sampler_logprobs=torch.zeros(b, t), policy_version=torch.zeros(b, dtype=torch.long),
                     pool=("p",) * b, finish_reason=("length",) * b, temperature=0.9)
    ids, pos = sequence_input_ids(batch, pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.gather(1, pos.clamp(min=0)[..., None].expand(-1, -1, vocab))
    q = torch.log_softmax(logits / 0.9 + 0.3 * torch.randn(logits.shape, generator=g), dim=-1)  # (B, T, V)
    head = torch.topk(q, k, dim=-1)
    return batch.replace(
        sampler_logprobs=q.gather(-1, completion[..., None])[..., 0].masked_fill(~mask, 0.0),
        head_ids=head.indices.masked_fill(~mask[..., None], -1),
        head_logprobs=head.values.masked_fill(~mask[..., None], float("-inf")),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1][:b]),
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0][:b]),
        format_ok=torch.ones(b, dtype=torch.bool),
    )


def trainer_cfg(ranks: int = 1, stage: int = 1, micro: int = 4) -> TrainerConfig:
    return TrainerConfig(lr=LR, micro_batch_size=micro, grad_clip=1.0,
                         deepspeed=DeepSpeedConfig(zero_stage=stage, ranks=ranks))


def torch_reference(model_dir: Path, batch: Rollouts, cfg: TrainerConfig, corr: Correction, ranks: int = 1):
    """(loss, grad_norm, updated BF16 weights) of one step computed with plain torch.

    The batch is cut into the ranks' row shards and each shard into the same micro-batches, so
    every BF16 matrix product has the shape it has on the ranks (a CPU's BF16 GEMM rounds by
    shape: without AVX512-BF16 two layouts of the same rows differ by ~1e-3 in the loss); the
    GLOBAL token count ties the shards' losses and gradients into the one step's.
    """
    from rlmix.models.io import load_causal_lm
    from rlmix.trainers.attention import use_dense_backward
    from rlmix.trainers.deepspeed_trainer import shard_rows

    master = load_causal_lm(model_dir, dtype=torch.float32)
    model = load_causal_lm(model_dir, dtype=torch.float32).train()
    use_dense_backward(model)  # the attention backward both trainers run on the CPU (rlmix/trainers/attention.py)
    for p in model.parameters():  # parameters only: buffers such as RoPE's inv_freq stay fp32, as in DeepSpeed
        p.data = p.data.to(torch.bfloat16)
    advantages = advantages_for(batch, corr)
    loss = 0.0
    for shard, rows in (s for s in shard_rows(batch, ranks) if s is not None):
        loss += forward_backward(model, shard, advantages[rows], corr, pad_id=0, micro_batch_size=cfg.micro_batch_size,
                                 autocast=torch.bfloat16, num_tokens=batch.num_tokens,
                                 backward=torch.Tensor.backward).loss
    for p, m in zip(model.parameters(), master.parameters()):
        m.grad = p.grad.float()
    norm = float(torch.nn.utils.clip_grad_norm_(master.parameters(), cfg.grad_clip))
    torch.optim.AdamW(master.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay).step()
    return loss, norm, {k: v.to(torch.bfloat16) for k, v in master.state_dict().items()}


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir) -> Path:
    return tiny_llama_dir


@pytest.fixture(scope="module")
def corr() -> Correction:
    return resolve_correction(CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=8))


@pytest.fixture(scope="module")
def one_rank(model_dir, corr):
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    trainer = DeepSpeedTrainer(model_dir, trainer_cfg(), corr, seed=0)
    yield trainer
    trainer.close()
    gc.collect()


def assert_same_update(weights: dict, reference: dict, original: dict) -> None:
    """Every tensor matches the oracle's update up to BF16 rounding (one ulp + a tenth of a step),
    except a few elements whose gradient is ~0: Adam's first step g/(|g|+eps) then takes the sign
    of summation noise, so they may sit up to 2 steps apart. A missing or wrong update fails most."""
    bad = total = moved = 0
    for name, ref in reference.items():
        got, ref = weights[name].float(), ref.float()
        diff = (got - ref).abs()
        bad += int((diff > LR / 10 + 2**-7 * ref.abs()).sum())
        total += ref.numel()
        assert float(diff.max()) <= 2.5 * LR, name
        moved += int((got != original[name].to(torch.bfloat16).float()).sum())
    assert bad <= 0.002 * total and moved > 0.5 * total


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_one_rank_same_loss_and_update_as_plain_torch(one_rank, model_dir, corr):
    from safetensors.torch import load_file

    batch = fixed_batch(model_dir)
    loss, norm, reference = torch_reference(model_dir, batch, one_rank.cfg, corr)
    original = load_file(model_dir / "model.safetensors")
    metrics = one_rank.train_step(batch)
    assert metrics["train/loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert metrics["train/grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert metrics["train/tokens"] == batch.num_tokens and one_rank.version == 1
    assert_same_update(one_rank.published_weights(), reference, original)


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_zero3_partitions_and_still_matches(model_dir, corr, tmp_path):
    """ZeRO 3 on one rank: parameters partitioned, export gathers them one tensor at a time."""
    from safetensors.torch import load_file

    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    cfg = trainer_cfg(stage=3)
    batch = fixed_batch(model_dir)
    loss, norm, reference = torch_reference(model_dir, batch, cfg, corr)
    trainer = DeepSpeedTrainer(model_dir, cfg, corr, seed=0)
    try:
        metrics = trainer.train_step(batch)
        assert metrics["train/loss"] == pytest.approx(loss, rel=1e-5)
        assert metrics["train/grad_norm"] == pytest.approx(norm, rel=1e-4)
        weights = trainer.published_weights()
        assert_same_update(weights, reference, load_file(model_dir / "model.safetensors"))
        trainer.save_checkpoint(tmp_path)
        assert zero_stage_of(tmp_path / DS_DIR / DS_TAG) == 3
        trainer.train_step(batch)
        trainer.load_checkpoint(tmp_path)
        assert trainer.version == 1
        assert all(torch.equal(trainer.published_weights()[k], v) for k, v in weights.items())
    finally:
        trainer.close()


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_checkpoint_round_trip(one_rank, model_dir, tmp_path):
    from rlmix.models.io import load_causal_lm

    batch = fixed_batch(model_dir, seed=1)
    one_rank.save_checkpoint(tmp_path / "ckpt")
    assert zero_stage_of(tmp_path / "ckpt" / DS_DIR / DS_TAG) == 1  # as DeepSpeed saved it: what resume= reads
    saved = one_rank.published_weights()
    first = one_rank.train_step(batch)
    moved = one_rank.published_weights()
    one_rank.load_checkpoint(tmp_path / "ckpt")
    assert one_rank.version == 1  # the version saved, not the one after
    assert all(torch.equal(one_rank.published_weights()[k], v) for k, v in saved.items())
    again = one_rank.train_step(batch)  # same optimizer state and weights: the same step again
    assert again["train/loss"] == first["train/loss"]
    assert all(torch.equal(one_rank.published_weights()[k], v) for k, v in moved.items())
    # The HF dir holds the exported weights for samplers and eval.
    hf = load_causal_lm(tmp_path / "ckpt", dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(hf[k], v) for k, v in saved.items())


@pytest.mark.slow
def test_two_ranks_same_loss_and_update_as_plain_torch(model_dir, corr, ray_local):
    from safetensors.torch import load_file

    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    # micro 2 over shards of 3 rows: rank 0 runs 2 backwards; rank 1's shard has one near-empty
    # micro-batch layout too, and the global token count ties them together.
    cfg = trainer_cfg(ranks=2, stage=2, micro=2)
    batch = fixed_batch(model_dir)
    loss, norm, reference = torch_reference(model_dir, batch, cfg, corr, ranks=2)
    trainer = DeepSpeedTrainer(model_dir, cfg, corr, seed=0)
    try:
        metrics = trainer.train_step(batch)
        weights = trainer.published_weights()
    finally:
        trainer.close()
    assert metrics["train/loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["train/grad_norm"] == pytest.approx(norm, rel=1e-3)
    assert_same_update(weights, reference, load_file(model_dir / "model.safetensors"))


def fp32_reference_norm(model_dir: Path, batch: Rollouts, cfg: TrainerConfig, corr: Correction, ranks: int = 1):
    """(loss, pre-clip global grad norm) of one fp32 step in plain torch, as the torch trainer logs it."""
    from rlmix.models.io import load_causal_lm
    from rlmix.trainers.attention import use_dense_backward
    from rlmix.trainers.deepspeed_trainer import shard_rows

    model = load_causal_lm(model_dir, dtype=torch.float32).train()
    use_dense_backward(model)
    advantages = advantages_for(batch, corr)
    loss = 0.0
    for shard, rows in (s for s in shard_rows(batch, ranks) if s is not None):
        loss += forward_backward(model, shard, advantages[rows], corr, pad_id=0, micro_batch_size=cfg.micro_batch_size,
                                 autocast=None, num_tokens=batch.num_tokens, backward=torch.Tensor.backward).loss
    return loss, float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_stage0_fp32_logs_the_pre_clip_grad_norm(model_dir, corr):
    """Stage 0 with fp32 steps a plain torch optimizer, for which DeepSpeed keeps no norm: the rank
    measures it after the all-reduce and before clipping (grad_clip 1.0 is well below it here)."""
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    cfg = trainer_cfg(stage=0)
    cfg.precision = TrainerPrecision.fp32
    batch = fixed_batch(model_dir)
    loss, norm = fp32_reference_norm(model_dir, batch, cfg, corr)
    assert norm > 2 * cfg.grad_clip  # so a post-clip norm would not pass
    trainer = DeepSpeedTrainer(model_dir, cfg, corr, seed=0)
    try:
        first = trainer.train_step(batch)
        second = trainer.train_step(fixed_batch(model_dir, seed=1))
    finally:
        trainer.close()
    assert first["train/loss"] == pytest.approx(loss, rel=1e-5)
    assert first["train/grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert second["train/grad_norm"] > 0 and second["train/grad_norm"] != first["train/grad_norm"]


@pytest.mark.slow
def test_two_ranks_stage0_fp32_log_the_norm_of_the_reduced_gradient(model_dir, corr, ray_local):
    """Two stage-0 ranks: the norm is that of the all-reduced (whole-batch) gradient, not of a shard's."""
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    cfg = trainer_cfg(ranks=2, stage=0, micro=2)
    cfg.precision = TrainerPrecision.fp32
    batch = fixed_batch(model_dir)
    loss, norm = fp32_reference_norm(model_dir, batch, cfg, corr, ranks=2)
    trainer = DeepSpeedTrainer(model_dir, cfg, corr, seed=0)
    try:
        metrics = trainer.train_step(batch)
    finally:
        trainer.close()
    assert metrics["train/loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["train/grad_norm"] == pytest.approx(norm, rel=1e-4)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_json_follows_the_typed_config():
    ds = DeepSpeedConfig(zero_stage=2, ranks=4, grad_accum_dtype=GradAccumDtype.bf16, overlap_comm=True,
                         reduce_bucket_size=1000)
    js = deepspeed_json(ds, precision=TrainerPrecision.bf16, grad_clip=0.5)
    assert js["zero_optimization"] == {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                       "reduce_bucket_size": 1000}
    assert js["bf16"] == {"enabled": True} and js["gradient_clipping"] == 0.5
    assert js["data_types"] == {"grad_accum_dtype": "bf16"} and js["train_batch_size"] == 4
    assert js["managed_gradient_accumulation"] is False and js["gradient_accumulation_steps"] == 1
    with pytest.raises(ConfigError, match="trainer.deepspeed.zero_stage=0 with trainer.precision=bf16"):
        check_deepspeed(DeepSpeedConfig(zero_stage=0), bf16=True)
    check_deepspeed(DeepSpeedConfig(zero_stage=0), bf16=False)
    for bad, key in [(DeepSpeedConfig(zero_stage=4), "zero_stage=4"), (DeepSpeedConfig(ranks=0), "ranks=0")]:
        with pytest.raises(ConfigError, match=f"trainer.deepspeed.{key}"):
            check_deepspeed(bad, bf16=True)


def test_stage_messages_name_every_stage_that_runs():
    """The refusals list what check_deepspeed accepts: stage 0 (not with bf16) and 1, 2, 3."""
    with pytest.raises(ConfigError,
                       match=r"zero_stage=4: must be 0 \(trainer.precision fp32 or fp16 only\), 1, 2 or 3$"):
        check_deepspeed(DeepSpeedConfig(zero_stage=4), bf16=False)
    with pytest.raises(ConfigError, match=r"zero_stage=0 with trainer.precision=bf16: .*use zero_stage 1, 2 or 3$"):
        check_deepspeed(DeepSpeedConfig(zero_stage=0), bf16=True)
    for stage in (1, 2, 3):
        check_deepspeed(DeepSpeedConfig(zero_stage=stage), bf16=True)


def test_overlap_comm_needs_gradient_partitioning_before_ray_starts():
    for stage in (0, 1):
        with pytest.raises(ConfigError, match=rf"^trainer.deepspeed.overlap_comm=true with zero_stage={stage}: .*"
                                              r"zero_stage 2 or 3[^\n]*$"):
            check_deepspeed(DeepSpeedConfig(zero_stage=stage, overlap_comm=True), bf16=False)
    for stage in (2, 3):
        check_deepspeed(DeepSpeedConfig(zero_stage=stage, overlap_comm=True), bf16=True)
    from rlmix.commands.compose import compose_run_config

    with pytest.raises(ConfigError, match="trainer.deepspeed.overlap_comm=true with zero_stage=1"):
        compose_run_config(["+experiment=smoke", "trainer=deepspeed", "trainer.deepspeed.overlap_comm=true"])


OVERLAP_PROBE = """
import json
import torch
from rlmix.config.deepspeed import DeepSpeedConfig
from rlmix.config.schema import TrainerPrecision
from rlmix.trainers.deepspeed_config import deepspeed_json
from rlmix.trainers.deepspeed_rank import RankSetup, free_port, init_process_group

init_process_group(RankSetup(0, 1, "127.0.0.1", free_port(), own_device=False), "gloo", False)
import deepspeed
seen = {}
for stage in (1, 2):
    js = deepspeed_json(DeepSpeedConfig(zero_stage=2, overlap_comm=True), precision=TrainerPrecision.bf16,
                        grad_clip=1.0)
    js["zero_optimization"]["stage"] = stage  # what the JSON would be without the refusal
    model = torch.nn.Linear(4, 4)
    try:
        deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=js)
        seen[stage] = "ok"
    except AssertionError as err:
        seen[stage] = str(err)
print(json.dumps(seen))
"""


@pytest.mark.slow  # a DeepSpeed engine in a fresh process: seconds
def test_the_refused_overlap_is_the_one_deepspeed_rejects(tmp_path):
    """Stage 1 with overlap_comm fails DeepSpeed's initialize under rlmix's JSON; stage 2 starts."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", OVERLAP_PROBE], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "overlap_comm only with ZeRO stage 2" in seen["1"] and seen["2"] == "ok"


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_the_warm_up_rate_reaches_every_rank(model_dir, corr):
    """lr 2xLR halved by a 2-step warm-up: the first update is plain torch's at LR; train/lr says so."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from rlmix.config.schema import LRSchedule
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    batch = fixed_batch(model_dir)
    _, _, reference = torch_reference(model_dir, batch, trainer_cfg(), corr)
    cfg = replace(trainer_cfg(), lr=2 * LR, lr_warmup_steps=2, lr_schedule=LRSchedule.linear, lr_decay_steps=4)
    trainer = DeepSpeedTrainer(model_dir, cfg, corr, seed=0)
    try:
        metrics = trainer.train_step(batch)
        assert metrics["train/lr"] == LR
        assert_same_update(trainer.published_weights(), reference, load_file(model_dir / "model.safetensors"))
        later = [trainer.train_step(batch)["train/lr"] for _ in range(3)]
        assert later == pytest.approx([2 * LR, 2 * LR, LR])  # warmed up, then halfway down the linear decay
    finally:
        trainer.close()


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_the_kl_term_on_a_rank_with_its_reference_in_host_memory(model_dir, corr):
    """k3 to the start weights: 0 on the first batch (the reference's own weights), > 0 after."""
    from dataclasses import replace

    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    cfg = replace(trainer_cfg(), ref_on_cpu=True)
    trainer = DeepSpeedTrainer(model_dir, cfg, replace(corr, kl_coef=0.5), seed=0)
    try:
        batch = fixed_batch(model_dir)
        kls = [trainer.train_step(batch)["train/kl_ref"] for _ in range(2)]
        assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 1e-5
        assert next(trainer._local.reference.parameters()).device.type == "cpu"
    finally:
        trainer.close()


@pytest.mark.slow  # a DeepSpeed engine: seconds to set up
def test_activation_checkpointing_leaves_the_update_alone(model_dir, corr):
    """One rank with checkpointing and one without: the same loss, norm and weights after a step."""
    from dataclasses import replace

    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    batch = fixed_batch(model_dir, seed=2)
    trainer = DeepSpeedTrainer(model_dir, replace(trainer_cfg(), activation_checkpointing=True), corr, seed=0)
    plain = DeepSpeedTrainer(model_dir, trainer_cfg(), corr, seed=0)
    try:
        assert trainer._local.engine.module.is_gradient_checkpointing
        got, want = trainer.train_step(batch), plain.train_step(batch)
        assert got["train/loss"] == want["train/loss"] and got["train/grad_norm"] == want["train/grad_norm"]
        weights, reference = trainer.published_weights(), plain.published_weights()
        assert all(torch.equal(weights[k], v) for k, v in reference.items())
    finally:
        trainer.close()
        plain.close()
