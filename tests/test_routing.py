"""Expert routing on the trainer's side against the sampler's record: the router-flip rate per pool,
and routing replay checked against an independent forward of the same HF weights with the experts
forced (the test's own sparse block, not the hook under test)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
from rlmix.correction import CorrectionMode
from rlmix.metrics import names as m
from rlmix.rollout import Rollouts, SamplingParams, concat_rollouts, sequence_input_ids
from rlmix.samplers.accelerators import PrecisionView, resolve_view
from rlmix.samplers.torch_sampler import TorchSampler
from rlmix.trainers.routing import sparse_routers
from rlmix.trainers.tokens import token_batch
from tests.conftest import save_tiny_decoder

PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 11], [1, 20, 21, 22, 23], [1, 30, 31]]
CASES = {
    "qwen3_moe_norm": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "norm_topk_prob": True}),
    "qwen3_moe_plain": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing")
    return {name: save_tiny_decoder(root / name, t, seed=i, **o) for i, (name, (t, o)) in enumerate(CASES.items())}


def _hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _rollouts(model_dir, view: PrecisionView, pool: str, seed: int = 0) -> Rollouts:
    r = TorchSampler(model_dir, view, pool).generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=seed))
    return r.replace(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_ids=torch.tensor([0, 0, 1, 1]),
                     format_ok=torch.ones(4, dtype=torch.bool))


def _forced_logits(model, batch: Rollouts, pad_id: int) -> torch.Tensor:
    """Logits (N, V) at the positions predicting each generated token, every sparse layer using the
    recorded experts (positions without a record, which no read logit sees, take experts 0..k-1),
    weighted by the router's softmax probability (renormalised over them where the model does)."""
    input_ids, target_pos = sequence_input_ids(batch, pad_id)
    b, n = input_ids.shape
    blocks = [mod for name, mod in model.named_modules() if name.endswith(".mlp") and hasattr(mod, "experts")]
    recorded = batch.routed_experts.long()
    saved = []
    for i, block in enumerate(blocks):
        forced = torch.full((b, n, recorded.shape[-1]), -1, dtype=torch.long)
        forced[:, : recorded.shape[1]] = recorded[:, :n, i]
        forced = torch.where(forced >= 0, forced, torch.arange(recorded.shape[-1])).view(b * n, -1)  # (N', k)

        def forward(hidden, block=block, forced=forced):
            x = hidden.reshape(-1, hidden.shape[-1])
            probs = torch.softmax(x @ block.gate.weight.T, dim=-1).gather(-1, forced)
            if getattr(block.gate, "norm_topk_prob", True):
                probs = probs / probs.sum(-1, keepdim=True)
            gate, up = torch.einsum("nkoh,nh->nko", block.experts.gate_up_proj[forced], x).chunk(2, dim=-1)
            y = torch.einsum("nkhi,nki->nkh", block.experts.down_proj[forced], F.silu(gate) * up)
            return (y * probs[..., None]).sum(1).view(hidden.shape)

        saved.append((block, block.forward))
        block.forward = forward
    try:
        logits = model(input_ids=input_ids).logits
    finally:
        for block, original in saved:
            block.forward = original
    return logits.gather(1, target_pos[..., None].expand(-1, -1, logits.shape[-1]))[batch.mask]


@pytest.mark.parametrize("case", list(CASES))
def test_replay_runs_the_samplers_experts_and_flips_count_where_they_differ(case, model_dirs):
    model = _hf(model_dirs[case])
    batch = _rollouts(model_dirs[case], resolve_view("B200", "nvfp4"), "b200_nvfp4")
    common = dict(pad_id=0, autocast=None, replay_support=False, columns_for=None)
    with torch.no_grad():
        own = token_batch(model, batch, **common)
        replayed = token_batch(model, batch, replay_routes=True, **common)
        oracle = _forced_logits(model, batch, pad_id=0)
    assert own.router_flip.shape == (batch.num_tokens,) and 0 < float(own.router_flip.mean()) < 1
    torch.testing.assert_close(replayed.logits, oracle, atol=1e-4, rtol=1e-5)
    flipped = own.router_flip > 0
    assert float((replayed.logits - own.logits)[flipped].abs().max()) > 1e-3  # replay changed something
    # under replay the flips are still the trainer's own top-k, on the replayed forward's hidden states
    assert replayed.router_flip.shape == own.router_flip.shape and float(replayed.router_flip.mean()) > 0


def test_an_exact_pool_routes_as_the_fp32_trainer_and_replay_changes_nothing(model_dirs):
    model = _hf(model_dirs["qwen3_moe_norm"])
    batch = _rollouts(model_dirs["qwen3_moe_norm"], PrecisionView.exact(), "exact")
    common = dict(pad_id=0, autocast=None, replay_support=False, columns_for=None)
    with torch.no_grad():
        own = token_batch(model, batch, **common)
        replayed = token_batch(model, batch, replay_routes=True, **common)
    assert float(own.router_flip.max()) == 0.0
    torch.testing.assert_close(replayed.logits, own.logits, atol=1e-5, rtol=0)


def test_replay_keeps_the_routers_gradient(model_dirs):
    model = _hf(model_dirs["mixtral"])
    batch = _rollouts(model_dirs["mixtral"], resolve_view("B200", "nvfp4"), "b200_nvfp4")
    tokens = token_batch(model, batch, pad_id=0, autocast=None, replay_support=False, columns_for=None,
                         replay_routes=True)
    torch.log_softmax(tokens.logits, -1).gather(1, tokens.sampled_ids[:, None]).sum().backward()
    routers = sparse_routers(model)
    assert len(routers) == 2 and all(float(r.weight.grad.abs().sum()) > 0 for r in routers)


def test_a_dense_model_has_no_flips(tiny_llama_dir):
    model = _hf(tiny_llama_dir)
    batch = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "x").generate(PROMPTS, SamplingParams(max_new_tokens=4))
    with torch.no_grad():
        tokens = token_batch(model, batch, pad_id=0, autocast=None, replay_support=False, columns_for=None)
    assert tokens.router_flip is None and batch.routed_experts is None


def test_the_trainer_logs_the_flip_rate_per_pool(model_dirs):
    """A torch trainer step on a batch from three pools: the fp32-exact one routes as the fp32 trainer
    (0), nvfp4 flips some, and a pool that records no experts (as vLLM) gets no key."""
    from rlmix.trainers.torch_trainer import TorchTrainer

    model_dir = model_dirs["qwen3_moe_norm"]
    parts = [_rollouts(model_dir, PrecisionView.exact(), "exact", seed=1),
             _rollouts(model_dir, resolve_view("B200", "nvfp4"), "b200_nvfp4", seed=2),
             _rollouts(model_dir, PrecisionView.exact(), "unrecorded", seed=3).replace(routed_experts=None)]
    parts[1] = parts[1].replace(group_ids=parts[1].group_ids + 2)
    parts[2] = parts[2].replace(group_ids=parts[2].group_ids + 4)
    batch = concat_rollouts(parts, pad_id=0)
    assert bool((batch.routed_experts[8:] == -1).all())
    correction = resolve_correction(CorrectionConfig(mode=CorrectionMode.mis))
    trainer = TorchTrainer(model_dir, TrainerConfig(precision=TrainerPrecision.fp32), correction, seed=0)
    metrics = trainer.train_step(batch)
    assert metrics[f"{m.ROUTER_FLIP}/exact"] == 0.0
    assert 0 < metrics[f"{m.ROUTER_FLIP}/b200_nvfp4"] < 1
    assert f"{m.ROUTER_FLIP}/unrecorded" not in metrics
    tokens = batch.mask.sum(1)
    share = float(tokens[4:8].sum() / tokens[:8].sum())  # the overall rate: over the recorded tokens
    assert metrics[m.ROUTER_FLIP] == pytest.approx(share * metrics[f"{m.ROUTER_FLIP}/b200_nvfp4"], rel=1e-5)


def test_routing_replay_is_refused_where_nothing_can_be_replayed(tiny_llama_dir, tiny_qwen3_moe_dir):
    from rlmix.commands.compose import compose_run_config
    from rlmix.errors import ConfigError

    arm = "+experiment=sc_mis_replay"
    cfg = compose_run_config([arm, f"model.path={tiny_qwen3_moe_dir}"])
    assert cfg.correction.routing_replay and resolve_correction(cfg.correction).routing_replay
    refusals = {
        "the embedded model is dense": [arm],
        f"model.path={tiny_llama_dir} \\(model_type='llama'\\) is dense": [arm, f"model.path={tiny_llama_dir}"],
        "trainer.activation_checkpointing=true": [arm, f"model.path={tiny_qwen3_moe_dir}",
                                                   "trainer.activation_checkpointing=true"],
        "fleet.pools.cpu_vllm_bf16 has backend: vllm": [arm, f"model.path={tiny_qwen3_moe_dir}", "fleet=vllm_cpu_smoke"],
    }
    for match, overrides in refusals.items():
        with pytest.raises(ConfigError, match=f"correction.routing_replay=true.*{match}|{match}.*") as err:
            compose_run_config(overrides)
        assert "\n" not in str(err.value) and "correction.routing_replay" in str(err.value)
