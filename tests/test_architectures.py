"""Every architecture the torch sampler emulates, against the Hugging Face forward of the same
random weights; and the one-line refusal of everything else, before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlmix.errors import ConfigError
from rlmix.rollout import SamplingParams
from rlmix.samplers.accelerators import PrecisionView, resolve_view
from rlmix.samplers.architectures import ARCHITECTURES, describe
from rlmix.samplers.torch_sampler import TorchSampler
from tests.cli import rlmix_refusing
from tests.conftest import build_char_tokenizer, save_tiny_decoder

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# One small random config per row of the table and per feature: (model_type, config overrides).
# Windows are shorter than the test sequences, so the sliding masks are exercised.
CASES = {
    "llama": ("llama", {}),
    "llama_tied_mha_bias": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4, "attention_bias": True}),
    "llama3_rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "llama_linear_rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}}),
    "qwen2": ("qwen2", {}),
    "qwen2_sliding_tied": ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1,
                                     "tie_word_embeddings": True}),
    "qwen3": ("qwen3", {}),
    "qwen3_tied_bias": ("qwen3", {"tie_word_embeddings": True, "attention_bias": True}),
    "mistral_window": ("mistral", {"sliding_window": 6}),
    # mixtures of experts: 2 layers, one dense by mlp_only_layers; top-2 (unnormalised) or top-3 of
    # 4 (renormalised); Mixtral with a window
    "qwen3_moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                "mlp_only_layers": [1]}),
    "qwen3_moe_norm_bias": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 3, "norm_topk_prob": True,
                                          "moe_intermediate_size": 32, "attention_bias": True,
                                          "tie_word_embeddings": True}),
    "mixtral_window": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 6}),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {name: save_tiny_decoder(root / name, model_type, seed=i, **overrides)
            for i, (name, (model_type, overrides)) in enumerate(CASES.items())}


def _teacher_batch(b: int = 5, n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, n), right-padded to different lengths, and their attention mask."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 50, (b, n), generator=g)
    lens = torch.tensor([n, 13, 20, 17, 9])[:b]
    mask = (torch.arange(n)[None] < lens[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def test_every_row_of_the_table_has_a_case():
    assert {model_type for model_type, _ in CASES.values()} == set(ARCHITECTURES)


@pytest.mark.parametrize("case", list(CASES))
def test_exact_view_matches_hf_fp32(case, model_dirs):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dirs[case], dtype=torch.float32).eval()
    ids, mask = _teacher_batch()
    with torch.no_grad():
        ref = torch.log_softmax(hf(input_ids=ids, attention_mask=mask).logits.float(), -1)
    mine = torch.log_softmax(TorchSampler(model_dirs[case], PrecisionView.exact(), "x").logits(ids, mask), -1)
    real = mask.bool()
    assert ref[real].std() > 1.0  # peaked enough that a missing bias/norm/window would show
    torch.testing.assert_close(mine[real], ref[real], atol=3e-5, rtol=0)


@pytest.mark.parametrize("case", ["qwen2_sliding_tied", "qwen3_tied_bias", "mistral_window", "llama3_rope", "qwen3_moe",
                                  "qwen3_moe_norm_bias", "mixtral_window"])
def test_kv_cache_generation_matches_teacher_forcing(case, model_dirs):
    """Left-padded batched generation records the log-probs a fresh forward over prompt + completion gives
    (cache columns, RoPE positions and sliding windows agree)."""
    sampler = TorchSampler(model_dirs[case], PrecisionView.exact(), "x")
    prompts = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 11], [1, 20, 21, 22, 23]]
    vocab = sampler.model.shape.vocab
    r = sampler.generate(prompts, SamplingParams(max_new_tokens=10, num_candidates=vocab, seed=0))
    for i, prompt in enumerate(prompts):
        n = int(r.mask[i].sum())
        seq = torch.tensor(prompt + r.completion_ids[i, :n].tolist())[None]
        logits = sampler.logits(seq, torch.ones_like(seq))[0, len(prompt) - 1 : -1]
        full = torch.full((n, vocab), float("-inf")).scatter(1, r.head_ids[i, :n], r.head_logprobs[i, :n])
        # an expert's fp32 GEMM runs over other token subsets in the two passes (sums in another
        # order): ~1e-5 relative on log-probs of magnitude ~5; a flipped expert would be ~1e-1
        rtol = 3e-5 if sampler.model.shape.spec.moe else 0
        torch.testing.assert_close(full, torch.log_softmax(logits, -1), atol=3e-5, rtol=rtol)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_precision_emulation_applies_to_every_architecture(model_type, model_dirs):
    """bf16 rounds off the exact forward a little; fp8 weights and activations more."""
    model_dir = model_dirs[next(c for c, (t, _) in CASES.items() if t == model_type)]
    ids, mask = _teacher_batch()
    real = mask.bool()

    def logprobs(view: PrecisionView) -> torch.Tensor:
        return torch.log_softmax(TorchSampler(model_dir, view, "x").logits(ids, mask), -1)[real]

    exact = logprobs(PrecisionView.exact())
    kl = {name: float((q.exp() * (q - exact)).sum(-1).mean())
          for name, q in (("bf16", logprobs(resolve_view("H100", "bf16"))),
                          ("fp8", logprobs(resolve_view("H100", "fp8_e4m3"))))}
    assert 0 < kl["bf16"] < kl["fp8"] < 0.5, kl


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, match", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, r"architecture GPT2LMHeadModel \(model_type='gpt2'\)"),
    ({"model_type": "phi3"}, r"model_type='phi3'.*`backend: vllm`"),
    ({"model_type": "llama", "hidden_act": "gelu"}, r"hidden_act='gelu'.*allowed: 'silu'"),
    ({"model_type": "llama", "mlp_bias": True}, r"mlp_bias=True"),
    ({"model_type": "qwen2", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, r"rope_type='yarn'"),
    ({"model_type": "llama", "rope_theta": 5e5, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     r"rope_type='dynamic'"),  # the transformers 4.x spelling
])
def test_unsupported_configs_are_one_line_naming_the_cause(fields, match):
    with pytest.raises(ConfigError, match=match) as err:
        describe(fields)
    assert "\n" not in str(err.value)


def test_both_rope_spellings_read_alike():
    old = describe({"model_type": "llama", "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    new = describe({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}})
    assert old.rope_type == new.rope_type == "llama3" and old.rope == new.rope


def test_cli_refuses_an_unsupported_architecture_before_ray(tmp_path):
    """The CLI's own app: exit 2, one line naming the architecture and the vllm way out, no run dir."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_char_tokenizer()
    model_dir = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=len(tokenizer),
                               bos_token_id=1, eos_token_id=2)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    work = tmp_path / "work"
    work.mkdir()
    proc = rlmix_refusing("train", "+experiment=smoke", f"model.path={model_dir}", cwd=work)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "GPT2LMHeadModel" in lines[0] and "backend: vllm" in lines[0]
    assert list(work.iterdir()) == []  # no outputs/, no run dir


def test_torch_pool_with_vllm_settings_is_refused(tmp_path):
    from rlmix.commands.compose import compose_run_config

    with pytest.raises(ConfigError, match=r"fleet.pools.a100_bf16.vllm is set but the pool has backend: torch"):
        compose_run_config(["+experiment=smoke", "fleet.pools.a100_bf16.vllm.tensor_parallel_size=2"])
    qwen = save_tiny_decoder(tmp_path / "qwen2", "qwen2")
    cfg = compose_run_config(["+experiment=smoke", f"model.path={qwen}"])
    assert json.loads((qwen / "config.json").read_text())["model_type"] == "qwen2" and cfg.model.path == str(qwen)


# --- mixtures of experts -------------------------------------------------------------------


@pytest.mark.parametrize("case", ["qwen3_moe", "mixtral_window"])
def test_fused_experts_as_a_trainer_publishes_them_serve_alike(case, model_dirs):
    """transformers 5 holds experts fused (mlp.experts.gate_up_proj) where checkpoints store one
    matrix per expert (block_sparse_moe.experts.{e}.w1 for Mixtral): both layouts give one forward."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dirs[case], dtype=torch.float32)
    fused = {k: v.detach() for k, v in hf.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in fused)
    sampler = TorchSampler(model_dirs[case], PrecisionView.exact(), "x")
    ids, mask = _teacher_batch()
    from_file = sampler.logits(ids, mask)
    sampler.load_weights(fused, 1)
    assert torch.equal(sampler.logits(ids, mask), from_file)
    with pytest.raises(ValueError, match=r"weights lack \d+ (qwen3_moe|mixtral) parameters.*experts.down_proj"):
        sampler.load_weights({k: v for k, v in fused.items() if "experts.down_proj" not in k}, 2)


def test_quantised_pools_route_some_tokens_to_other_experts(model_dirs):
    """The router sees each pool's rounded hidden state: nvfp4 flips more top-k sets than bf16, and
    the exact view none against itself."""
    ids, mask = _teacher_batch()
    real = mask.bool()

    def routes(view: PrecisionView) -> torch.Tensor:
        model = TorchSampler(model_dirs["qwen3_moe_norm_bias"], view, "x").model
        out: list[torch.Tensor] = []
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model.forward(ids, positions, real, model.new_cache(*ids.shape), 0, routes=out)
        return torch.stack(out, dim=2).sort(dim=-1).values[real]  # (N, layers, k) as sets

    exact = routes(PrecisionView.exact())
    flips = {name: float((routes(resolve_view("B200", name)) != exact).any(-1).float().mean())
             for name in ("bf16", "nvfp4")}
    assert torch.equal(routes(PrecisionView.exact()), exact)
    assert 0 <= flips["bf16"] < flips["nvfp4"] and flips["nvfp4"] > 0.01, flips


def test_router_jitter_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"mixtral with router_jitter_noise=0.1 .*allowed: 0.0") as err:
        describe({"model_type": "mixtral", "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
                  "router_jitter_noise": 0.1})
    assert "\n" not in str(err.value)


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    spec = describe({"model_type": "qwen3_moe", "num_hidden_layers": 6, "num_local_experts": 4,
                     "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3]}).moe
    assert spec.sparse == (False, True, False, False, False, True) and spec.layers == (1, 5)
    assert describe({"model_type": "qwen3", "num_hidden_layers": 2}).moe is None


@pytest.mark.parametrize("case", ["qwen3_moe", "mixtral_window"])
def test_generation_records_the_experts_a_fresh_forward_chooses(case, model_dirs):
    """``routed_experts`` (B, P + T, M, k) int16: at every prompt and fed-back completion position, the
    experts a teacher-forced forward over prompt + completion chooses there; -1 past the last fed token."""
    sampler = TorchSampler(model_dirs[case], resolve_view("H100", "fp8_e4m3"), "x", max_batch=2)
    prompts = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 11], [1, 20, 21, 22, 23]]
    r = sampler.generate(prompts, SamplingParams(max_new_tokens=10, stop_token_ids=(3, 4, 5), seed=0))
    moe = sampler.model.shape.spec.moe
    assert r.routed_experts.dtype == torch.int16
    assert r.routed_experts.shape == (3, r.prompt_ids.shape[1] + r.mask.shape[1], len(moe.layers), moe.top_k)
    for i, prompt in enumerate(prompts):
        n = int(r.mask[i].sum())
        seq = torch.tensor(prompt + r.completion_ids[i, :n].tolist())[None]
        fed = len(prompt) + n - 1  # the last generated token is never fed back
        routes: list[torch.Tensor] = []
        model = sampler.model
        model.forward(seq, torch.arange(seq.shape[1])[None], torch.ones_like(seq, dtype=torch.bool),
                      model.new_cache(1, seq.shape[1]), 0, routes=routes)
        expected = torch.stack(routes, dim=2)[0, :fed].to(torch.int16)
        assert torch.equal(r.routed_experts[i, :fed], expected)
        assert bool((r.routed_experts[i, fed:] == -1).all())
    dense = TorchSampler(model_dirs["qwen3"], PrecisionView.exact(), "x")
    assert dense.generate(prompts, SamplingParams(max_new_tokens=3, seed=0)).routed_experts is None
