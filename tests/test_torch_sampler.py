"""The torch sampler: HF equivalence under the exact view, KV-cache consistency, batch invariance,
sampling rules, and that emulated mismatch grows with coarser formats and follows the kernel family."""

from __future__ import annotations

import logging

import pytest
import torch

from rlmix.errors import ConfigError
from rlmix.rollout import SamplingParams
from rlmix.samplers.accelerators import KernelFamily, PrecisionView, resolve_view
from rlmix.samplers.precision import Precision, nvfp4_qdq, quantize_dequantize, round_to
from rlmix.samplers.attention import FP8_BLOCK, attend
from rlmix.samplers.emulated_decoder import DecoderShape
from rlmix.samplers.sampling import draw, keep_mask
from rlmix.samplers.torch_sampler import TorchSampler
from tests.conftest import save_tiny_llama

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 11], [1, 20, 21, 22, 23], [1, 30, 31, 32, 33, 34, 35, 36, 37, 38]]


def _teacher_batch(seed: int = 0, b: int = 6, n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences, right-padded to different lengths: ids (B, n), attention mask (B, n)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 50, (b, n), generator=g)
    lens = torch.randint(n // 2, n + 1, (b,), generator=g)
    lens[0] = n
    mask = (torch.arange(n)[None] < lens[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


@pytest.fixture(scope="module")
def exact(tiny_llama_dir) -> TorchSampler:
    return TorchSampler(tiny_llama_dir, PrecisionView.exact(), "cpu_fp32_exact")


@pytest.fixture(scope="module")
def tied_mha_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tied_mha"), seed=1, tie=True, kv_heads=2)


@pytest.mark.parametrize("which", ["gqa_untied", "mha_tied"])
def test_exact_view_matches_hf_fp32(which, tiny_llama_dir, tied_mha_dir):
    from transformers import LlamaForCausalLM

    model_dir = tiny_llama_dir if which == "gqa_untied" else tied_mha_dir
    hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, mask = _teacher_batch()
    with torch.no_grad():
        ref = torch.log_softmax(hf(input_ids=ids, attention_mask=mask).logits.float(), -1)
    mine = torch.log_softmax(TorchSampler(model_dir, PrecisionView.exact(), "x").logits(ids, mask), -1)
    real = mask.bool()
    torch.testing.assert_close(mine[real], ref[real], atol=2e-5, rtol=0)


def test_kv_cache_generation_matches_teacher_forcing(exact, tiny_llama_dir):
    """Recorded full-vocab log-probs of each generated token equal a fresh forward over prompt + completion."""
    vocab = exact.model.shape.vocab
    r = exact.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=12, num_candidates=vocab, seed=0))
    for i, prompt in enumerate(PROMPTS):
        n = int(r.mask[i].sum())
        seq = torch.tensor(prompt + r.completion_ids[i, :n].tolist())[None]
        logits = exact.logits(seq, torch.ones_like(seq))[0, len(prompt) - 1 : -1] / 0.8
        full = torch.full((n, vocab), float("-inf")).scatter(1, r.head_ids[i, :n], r.head_logprobs[i, :n])
        # fp32 GEMMs of other shapes sum in another order (by CPU kernel): ~1e-6 relative on log-probs
        # of magnitude ~10, so 2e-5 absolute was one CPU's margin, not the math's.
        torch.testing.assert_close(full, torch.log_softmax(logits, -1), atol=1e-5, rtol=1e-5)


def test_a_prompts_result_does_not_depend_on_the_batch(exact):
    params = SamplingParams(top_p=0.9, max_new_tokens=10, num_candidates=5, support_slots=64, seed=7)
    alone = exact.generate(PROMPTS[1:2], params)
    crowded = exact.generate([PROMPTS[1], PROMPTS[3], PROMPTS[0]], params)
    n = alone.completion_ids.shape[1]
    assert torch.equal(alone.completion_ids[0], crowded.completion_ids[0, :n])
    torch.testing.assert_close(alone.sampler_logprobs[0], crowded.sampler_logprobs[0, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone.head_logprobs[0], crowded.head_logprobs[0, :n], atol=1e-5, rtol=1e-5)


def test_max_batch_chunking_is_invisible(tiny_llama_dir):
    params = SamplingParams(max_new_tokens=6, num_candidates=3, seed=3)
    whole = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "x").generate(PROMPTS, params)
    chunked = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "x", max_batch=3).generate(PROMPTS, params)
    assert torch.equal(whole.completion_ids, chunked.completion_ids)
    torch.testing.assert_close(whole.sampler_logprobs, chunked.sampler_logprobs, atol=1e-5, rtol=1e-5)  # fp32, by shape


def test_unseeded_calls_advance_the_sampler_generator(tiny_llama_dir):
    params = SamplingParams(max_new_tokens=6)
    a, b = TorchSampler(tiny_llama_dir, PrecisionView.exact(), "x", seed=5), TorchSampler(
        tiny_llama_dir, PrecisionView.exact(), "x", seed=5)
    first, again = a.generate(PROMPTS, params), a.generate(PROMPTS, params)
    assert not torch.equal(first.completion_ids, again.completion_ids)
    assert torch.equal(first.completion_ids, b.generate(PROMPTS, params).completion_ids)


# --- sampling rules (pure) ---------------------------------------------------------------


def test_top_k_keeps_ties_and_top_p_needs_the_smallest_prefix():
    logits = torch.tensor([[3.0, 3.0, 1.0, 0.0]])
    assert keep_mask(logits, top_k=1, top_p=1.0).tolist() == [[True, True, False, False]]
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert keep_mask(probs.log(), 0, 0.75).tolist() == [[True, True, False, False]]
    assert keep_mask(probs.log(), 0, 0.85).tolist() == [[True, True, True, False]]
    assert keep_mask(probs.log(), 0, 0.1).tolist() == [[True, False, False, False]]
    tied = torch.tensor([[0.4, 0.4, 0.2]]).log()
    assert keep_mask(tied, 0, 0.3).tolist() == [[True, True, False]]
    # top-k first, then top-p on the renormalised top-k distribution: {0.5, 0.3} -> 0.625, 0.375
    assert keep_mask(probs.log(), 2, 0.6).tolist() == [[True, False, False, False]]


def test_inverse_cdf_draw_and_recorded_values():
    logits = torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.25, 0.25]]).log()
    u = torch.tensor([0.5, 0.6])
    out = draw(logits, u, 1.0, 0, 1.0, num_candidates=4, support_slots=0)
    assert out.tokens.tolist() == [2, 1]  # a zero-probability token is never drawn
    torch.testing.assert_close(out.logprobs, torch.tensor([0.5, 0.25]).log())
    assert out.head_ids[:, -1].tolist() == [-1, -1] and torch.isneginf(out.head_logprobs[:, -1]).all()
    trunc = draw(logits[1:], torch.tensor([0.9]), 1.0, 1, 1.0, num_candidates=0, support_slots=3)
    assert trunc.tokens.tolist() == [0] and trunc.logprobs.tolist() == [0.0]
    assert trunc.support_ids.tolist() == [[0, -1, -1]] and trunc.support_probs.tolist() == [[1.0, 0.0, 0.0]]


def test_draw_frequencies_follow_the_truncated_distribution():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]]).expand(20000, 6)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    out = draw(logits, u, 0.9, 0, 0.8, num_candidates=0, support_slots=6)
    freq = torch.bincount(out.tokens, minlength=6).float() / 20000
    expected = _dense(out)
    assert expected[3:].sum() == 0 and expected[:3].sum() == pytest.approx(1.0)  # top-p 0.8 keeps 3 here
    torch.testing.assert_close(freq, expected, atol=0.012, rtol=0)


def _dense(out) -> torch.Tensor:
    ids, probs = out.support_ids[0], out.support_probs[0]
    return torch.zeros(6).scatter(0, ids[ids >= 0], probs[ids >= 0])


def test_support_overflow_is_an_error(exact):
    with pytest.raises(ValueError, match="support_slots=2"):
        exact.generate(PROMPTS, SamplingParams(top_p=0.999, max_new_tokens=3, support_slots=2, seed=0))


# --- emulated mismatch -------------------------------------------------------------------


def _kl_to_exact(model_dir, view, ids, mask, ref) -> float:
    q = torch.log_softmax(TorchSampler(model_dir, view, "x").logits(ids, mask), -1)
    real = mask.bool()
    return (q.exp() * (q - ref)).sum(-1)[real].mean().item()


@pytest.fixture(scope="module")
def teacher(exact):
    ids, mask = _teacher_batch(seed=1, b=16, n=40)
    return ids, mask, torch.log_softmax(exact.logits(ids, mask), -1)


def test_mismatch_grows_with_coarser_weights(tiny_llama_dir, teacher):
    kl = {
        name: _kl_to_exact(tiny_llama_dir, resolve_view(acc, prec), *teacher)
        for name, (acc, prec) in {
            "bf16": ("H100", "bf16"), "int8": ("H100", "int8"), "fp8": ("H100", "fp8_e4m3"),
            "fp8_e5m2": ("H100", "fp8_e5m2"), "nvfp4": ("B200", "nvfp4"), "int4": ("H100", "int4"),
        }.items()
    }
    assert 0 < kl["bf16"] < kl["int8"] < kl["fp8"] < kl["fp8_e5m2"] < kl["nvfp4"]
    assert kl["fp8_e5m2"] < kl["int4"]


def test_mismatch_follows_the_kernel_family(tiny_llama_dir, teacher):
    ids, mask, _ = teacher

    def logits(acc: str) -> torch.Tensor:
        return TorchSampler(tiny_llama_dir, resolve_view(acc, "bf16"), acc).logits(ids, mask)[mask.bool()]

    by_acc = {acc: logits(acc) for acc in ("H100", "H200", "A100", "B200", "CPU")}
    assert torch.equal(by_acc["H100"], by_acc["H200"])  # same family, same precision: bit-identical
    for a, b in [("H100", "A100"), ("H100", "B200"), ("A100", "B200"), ("CPU", "A100")]:
        assert (by_acc[a] - by_acc[b]).abs().max() > 1e-3, (a, b)


def test_kv_cache_precision_is_applied(tiny_llama_dir, teacher):
    bf16_kv = _kl_to_exact(tiny_llama_dir, resolve_view("H100", "bf16"), *teacher)
    fp8_kv = _kl_to_exact(tiny_llama_dir, resolve_view("H100", "bf16", kv_precision="fp8_e4m3"), *teacher)
    assert fp8_kv > 2 * bf16_kv


def test_w4a4_quantises_every_gemm_input_and_adds_mismatch(tiny_llama_dir, teacher):
    """nvfp4 W4A4: a decoder GEMM equals the dense product of the token's nvfp4 values (scaled alone)
    and the nvfp4 weight, rounded to bf16; the pool's mismatch exceeds weight-only nvfp4's."""
    w4a4 = TorchSampler(tiny_llama_dir, resolve_view("B200", "nvfp4", linear_inputs="nvfp4"), "b200_w4a4")
    x = round_to(torch.randn(5, 64, generator=torch.Generator().manual_seed(3)), torch.bfloat16)
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(4))
    qw = quantize_dequantize(w, Precision.nvfp4)
    oracle = torch.stack([round_to(nvfp4_qdq(x[i : i + 1])[0] @ qw.T, torch.bfloat16) for i in range(len(x))])
    assert torch.equal(w4a4.model._linear(x, qw), oracle)
    weight_only = _kl_to_exact(tiny_llama_dir, resolve_view("B200", "nvfp4"), *teacher)
    assert _kl_to_exact(tiny_llama_dir, w4a4.model.view, *teacher) > 1.5 * weight_only


def test_per_tensor_fp8_scales_share_one_scale_across_the_step_and_ignore_padding(tiny_llama_dir):
    """vLLM's online fp8 scales each GEMM input once over all the step's tokens: a row's numbers then
    depend on what it is batched with, unlike per-token scales, but never on padding, which an
    engine does not compute (here the pad token's embedding is made huge, so including it would
    coarsen every scale)."""
    tensor = TorchSampler(tiny_llama_dir, resolve_view("H100", "fp8_e4m3", fp8_scales="tensor"), "h100_tensor")
    assert tensor.model.view.label == "emulated:H100/fp8_e4m3+tensor_scales/kv=bf16/online_softmax_bf16"
    row = torch.randint(3, 40, (1, 10), generator=torch.Generator().manual_seed(2))
    alone = tensor.logits(row, torch.ones_like(row))[0]
    tensor.model.embed[0] *= 300.0  # the pad token
    padded = torch.cat([row, torch.zeros(1, 6, dtype=torch.long)], 1)
    torch.testing.assert_close(tensor.logits(padded, (padded != 0).long())[0, :10], alone, atol=1e-5, rtol=1e-5)
    # A batch-mate with much larger activations (a token the row does not hold) coarsens the row's scale.
    tensor.model.embed[45] *= 300.0
    crowd = torch.cat([padded, torch.full((1, 16), 45)], 0)
    shared = tensor.logits(crowd, (crowd != 0).long())[0, :10]
    assert (shared - alone).abs().max() > 1e-3


def test_per_tensor_scales_are_for_fp8_pools_only():
    with pytest.raises(ConfigError, match="fp8_scales=tensor applies to fp8 weights"):
        resolve_view("A100", "bf16", fp8_scales="tensor")
    with pytest.raises(ConfigError, match="fp8_scales='row': allowed: channel, tensor"):
        resolve_view("H100", "fp8_e4m3", fp8_scales="row")


# --- load-time behaviour -----------------------------------------------------------------


def test_emulated_views_say_so(tiny_llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="rlmix.samplers.torch_sampler"):
        s = TorchSampler(tiny_llama_dir, resolve_view("H100", "nvfp4", allow_emulation=True), "h100_nvfp4_emu")
    assert "emulated:H100/nvfp4" in caplog.text and "beyond_hardware" in caplog.text
    assert any(rec.levelno == logging.WARNING for rec in caplog.records)
    r = s.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2, seed=0))
    assert r.tags["emulated"] == "true" and r.tags["backend"] == "torch" and r.tags["precision"] == "nvfp4"


def test_format_that_does_not_fit_the_model_is_a_config_error(tiny_llama_dir):
    with pytest.raises(ConfigError, match="int4.*multiple of the quantisation group 48"):
        TorchSampler(tiny_llama_dir, resolve_view("A100", "int4", int4_group=48), "a100_int4")


def test_bad_model_dir_and_unsupported_rope(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        TorchSampler(tmp_path / "nope", PrecisionView.exact(), "x")
    with pytest.raises(ConfigError, match="config.json"):
        TorchSampler(tmp_path, PrecisionView.exact(), "x")
    from transformers import LlamaConfig

    cfg = LlamaConfig(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match="rope_type"):
        DecoderShape.from_fields(cfg.to_dict())
    from transformers import GPT2Config

    with pytest.raises(ConfigError, match="model_type='gpt2'.*backend: vllm"):
        DecoderShape.from_fields(GPT2Config().to_dict())


# --- attention kernels -------------------------------------------------------------------


def test_every_kernel_family_approximates_exact_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 6, 16, generator=g)
    k, v = torch.randn(2, 2, 100, 16, generator=g), torch.randn(2, 2, 100, 16, generator=g)
    allowed = torch.rand(2, 1, 6, 100, generator=g) < 0.7
    allowed[..., 0] = True
    ref = attend(q, k, v, allowed, 0.25, Precision.fp32, KernelFamily.fp32_softmax)
    errors = {}
    for family in KernelFamily:
        out = attend(q, k, v, allowed, 0.25, Precision.fp32, family)
        errors[family] = (out - ref).abs().max().item()
        assert errors[family] < 2e-2, family
    assert errors[KernelFamily.fp32_softmax] == 0
    assert errors[KernelFamily.online_softmax_fp32acc] < errors[KernelFamily.online_softmax_bf16]


def test_an_fp16_model_runs_every_kernel_family_in_fp16():
    """Flash kernels cast the probabilities to V's dtype: in an fp16 model the Hopper family's bf16
    probabilities and accumulators are fp16, so its error shrinks to the fp16 family's scale."""
    from rlmix.samplers.attention import BLOCKWISE

    hopper = BLOCKWISE[KernelFamily.online_softmax_bf16]
    assert hopper.for_activations(Precision.bf16) is hopper
    assert hopper.for_activations(Precision.fp16) == type(hopper)(16, Precision.fp16, Precision.fp16)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 6, 16, generator=g)
    k, v = torch.randn(2, 2, 200, 16, generator=g), torch.randn(2, 2, 200, 16, generator=g)
    allowed = torch.ones(2, 1, 6, 200, dtype=torch.bool)
    ref = attend(q, k, v, allowed, 0.25, Precision.fp32, KernelFamily.fp32_softmax)
    err = {act: (attend(q, k, v, allowed, 0.25, act, KernelFamily.online_softmax_bf16) - ref).abs().mean().item()
           for act in (Precision.bf16, Precision.fp16)}
    assert err[Precision.fp16] < err[Precision.bf16] / 4, err


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).float()


def test_fp8_attention_against_a_dense_oracle():
    """Within one key block the fp8 path is a dense formula: query cast to e4m3, exact fp32 scores,
    probabilities e4m3 after the 2^8 shift in the PV product only, fp32 row sum. Past a block it
    stays within fp8's error of exact attention, and coarser than the fp32-accumulating kernel."""
    g = torch.Generator().manual_seed(0)
    q = 3 * torch.randn(2, 2, 6, 16, generator=g)
    k, v = _fp8(torch.randn(2, 2, 300, 16, generator=g)), _fp8(torch.randn(2, 2, 300, 16, generator=g))
    allowed = torch.rand(2, 1, 6, 300, generator=g) < 0.7
    allowed[..., 0] = True
    n = FP8_BLOCK
    s = (_fp8(q) @ k[..., :n, :].transpose(-1, -2) * 0.25).masked_fill(~allowed[..., :n], float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    oracle = (_fp8(256 * p) / 256) @ v[..., :n, :] / p.sum(-1, keepdim=True)
    one_block = attend(q, k[..., :n, :], v[..., :n, :], allowed[..., :n], 0.25, Precision.fp32,
                       KernelFamily.online_softmax_bf16, fp8=True)
    torch.testing.assert_close(one_block, oracle, atol=1e-6, rtol=1e-5)
    ref = attend(q, k, v, allowed, 0.25, Precision.fp32, KernelFamily.fp32_softmax)
    fp8 = (attend(q, k, v, allowed, 0.25, Precision.fp32, KernelFamily.fp32_softmax, fp8=True) - ref).abs()
    fa2 = (attend(q, k, v, allowed, 0.25, Precision.fp32, KernelFamily.online_softmax_fp32acc) - ref).abs()
    assert 0 < fa2.mean() < fp8.mean() < 0.05


def test_fp8_attention_is_applied_by_the_pool(tiny_llama_dir, teacher):
    kv = resolve_view("H100", "bf16", kv_precision="fp8_e4m3")
    fp8 = resolve_view("H100", "bf16", kv_precision="fp8_e4m3", fp8_attention=True)
    assert _kl_to_exact(tiny_llama_dir, fp8, *teacher) > 1.2 * _kl_to_exact(tiny_llama_dir, kv, *teacher)


def test_fp16_accumulators_saturate_instead_of_overflowing():
    q, k = torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 64, 4)
    v = torch.full((1, 1, 64, 4), 6.0e4)
    allowed = torch.ones(1, 1, 1, 64, dtype=torch.bool)
    out = attend(q, k, v, allowed, 1.0, Precision.fp32, KernelFamily.online_softmax_fp16)
    assert torch.isfinite(out).all()
