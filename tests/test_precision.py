"""Number formats (hand-computed values) and the accelerator catalog."""

from __future__ import annotations

import pytest
import torch

from rlmix.errors import ConfigError
from rlmix.samplers.accelerators import CATALOG, KernelFamily, PrecisionView, resolve_view
from rlmix.samplers.precision import Precision
from rlmix.samplers.precision import (
    e2m1_round,
    fp8_qdq_tensor,
    nvfp4_qdq,
    quantize_dequantize,
    round_activation,
    round_kv,
)


def test_bf16_fp16_round_to_nearest_even():
    one = 1.0
    x = torch.tensor([one + 2**-8, one + 3 * 2**-8, one + 2**-10 + 2**-12])
    # bf16 keeps 7 mantissa bits: 1+2^-8 is a tie -> 1; 1+3·2^-8 is a tie -> even 1+2^-6.
    assert quantize_dequantize(x, Precision.bf16).tolist() == [1.0, 1.0 + 2**-6, 1.0]
    # fp16 keeps 10: 1+2^-10 is exact, +2^-12 rounds away.
    assert quantize_dequantize(x, Precision.fp16).tolist() == [1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-10]


def test_fp8_per_channel_scale_and_grid():
    # Row amax 448 -> scale 1: e4m3 spacing is 2 in [16, 32), so 17 (a tie) -> 16; 0.3 -> 0.3125.
    w = torch.tensor([[448.0, 17.0, 0.3], [224.0, 8.5, 0.15]])
    out = quantize_dequantize(w, Precision.fp8_e4m3)
    assert out[0].tolist() == [448.0, 16.0, 0.3125]
    # Second row: amax 224 -> scale 0.5, values 448, 17, 0.3 in fp8 -> the first row halved.
    assert out[1].tolist() == [224.0, 8.0, 0.15625]
    e5 = quantize_dequantize(torch.tensor([[57344.0, 0.3, 40.0]]), Precision.fp8_e5m2)
    assert e5[0].tolist() == [57344.0, 0.3125, 40.0]


def test_fp8_per_tensor_scale_and_the_rows_it_is_taken_over():
    # One scale for the matrix (amax 448 -> 1): 0.3 -> 0.3125. Per channel the second row's amax 2
    # gives s = 2/448, 0.3/s = 67.2 -> 64 (spacing 8 in [64, 128)), 64·s = 0.2857...
    w = torch.tensor([[448.0, 1.0], [2.0, 0.3]])
    assert quantize_dequantize(w, Precision.fp8_e4m3, per_tensor=True)[1].tolist() == [2.0, 0.3125]
    assert quantize_dequantize(w, Precision.fp8_e4m3)[1].tolist() == pytest.approx([2.0, 64 * 2 / 448])
    # Rows outside ``real`` do not set the scale (0.3 -> 64·2/448 again) but are rounded with it:
    # 448 saturates at fmax·s = 2.
    out = fp8_qdq_tensor(w, Precision.fp8_e4m3, real=torch.tensor([False, True]))
    assert out[1].tolist() == pytest.approx([2.0, 64 * 2 / 448]) and out[0, 0].item() == 2.0


def test_int8_per_channel_and_int4_groups():
    w = torch.tensor([[127.0, 0.4, -63.5, 1.6]])
    assert quantize_dequantize(w, Precision.int8).tolist() == [[127.0, 0.0, -64.0, 2.0]]
    # int4, groups of 2: [0.7, -1.4] scale 0.2 -> 3.5 ties to 4 -> 0.8, -7 -> -1.4;
    # [3.0, 0.1] scale 3/7 -> 7 and 0.233 -> 0.
    w4 = torch.tensor([[0.7, -1.4, 3.0, 0.1]])
    out = quantize_dequantize(w4, Precision.int4, block_size=2)
    torch.testing.assert_close(out, torch.tensor([[0.8, -1.4, 3.0, 0.0]]))


def test_e2m1_grid_and_ties():
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert e2m1_round(torch.tensor(grid)).tolist() == grid
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, 0.3, 2.6])
    assert e2m1_round(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0, 0.5, 3.0]


def _e2m1_by_search(x: torch.Tensor) -> torch.Tensor:
    """The oracle: the nearest grid value by distance, a tie to the even grid index (mantissa 0)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    dist = (x.abs().double().clamp(max=6.0)[:, None] - grid).abs()
    best = dist.min(dim=1, keepdim=True).values
    candidates = torch.where(dist == best, torch.arange(8), 99)
    even = torch.where(candidates % 2 == 0, candidates, 99).min(dim=1).values
    idx = torch.where(even < 99, even, candidates.min(dim=1).values)
    return (torch.sign(x).double() * grid[idx]).float()


def test_e2m1_rounding_matches_the_nearest_grid_value_everywhere():
    """Every float32 on a fine grid over [-8, 8] (every tie included) and random values of several
    magnitudes round as the search over the grid says."""
    fine = torch.linspace(-8.0, 8.0, 2**18 + 1)
    g = torch.Generator().manual_seed(0)
    spread = torch.cat([torch.randn(20_000, generator=g) * s for s in (0.2, 1.0, 3.0, 20.0)])
    for x in (fine, spread):
        torch.testing.assert_close(e2m1_round(x), _e2m1_by_search(x), atol=0, rtol=0)


def test_nvfp4_two_level_scales():
    # Tensor amax 6 -> g = 1/448; block 0 amax 6 -> block scale fp8(448) = 448 -> unit step:
    # values round onto the e2m1 grid directly. Block 1 amax 0.6 -> scale fp8(44.8) = 44 (e4m3
    # spacing 4 in [32, 64)) -> step 44/448; 0.6 / step = 6.109 -> saturates at 6 -> 6·44/448.
    block0 = torch.tensor([6.0, 0.3, 0.8, 1.3, 2.6, -5.1, 3.4, 0.0] * 2)
    block1 = torch.zeros(16)
    block1[0] = 0.6
    out = nvfp4_qdq(torch.cat([block0, block1])[None])[0]
    expected0 = [6.0, 0.5, 1.0, 1.5, 3.0, -6.0, 3.0, 0.0] * 2
    assert out[:16].tolist() == expected0
    assert out[16].item() == pytest.approx(6 * 44 / 448)
    assert out[17:].abs().sum() == 0


def test_nvfp4_activations_take_each_tokens_scale_alone():
    """A GEMM input quantised to nvfp4 (W4A4) is scaled token by token: a batch-mate a thousand times
    larger changes nothing in a row, where one scale over the tensor would coarsen its blocks."""
    g = torch.Generator().manual_seed(0)
    row = torch.randn(1, 32, generator=g)
    big = 1000.0 * torch.randn(1, 32, generator=g)
    together = round_activation(torch.cat([row, big]), Precision.nvfp4)
    assert torch.equal(together[0], nvfp4_qdq(row)[0])
    assert torch.equal(together[1], nvfp4_qdq(big)[0])
    assert not torch.equal(nvfp4_qdq(torch.cat([row, big]))[0], together[0])


def test_zero_rows_stay_zero_and_finite():
    w = torch.zeros(4, 64)
    for fmt in Precision:
        out = quantize_dequantize(w, fmt)
        assert torch.equal(out, w), fmt


def test_error_grows_with_coarser_formats():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    err = {f: (quantize_dequantize(w, f) - w).pow(2).mean().item() for f in Precision}
    assert err[Precision.fp32] == 0
    assert err[Precision.fp16] < err[Precision.bf16] < err[Precision.fp8_e4m3] < err[Precision.fp8_e5m2]
    assert err[Precision.int8] < err[Precision.fp8_e4m3]
    assert err[Precision.fp8_e5m2] < err[Precision.nvfp4] and err[Precision.fp8_e5m2] < err[Precision.int4]


def test_activation_and_kv_rounding():
    x = torch.tensor([[448.0, 17.0], [4.0, 0.3]])
    # fp8 activations: dynamic per-token scale (row 0 amax 448 -> scale 1; row 1 -> 4/448).
    out = round_activation(x, Precision.fp8_e4m3)
    assert out[0].tolist() == [448.0, 16.0]
    assert out[1, 0].item() == 4.0
    with pytest.raises(ValueError, match="weight-only"):
        round_activation(x, Precision.int4)
    # fp8 KV cache: unit scale, saturating.
    assert round_kv(torch.tensor([1000.0, -0.3]), Precision.fp8_e4m3).tolist() == [448.0, -0.3125]
    with pytest.raises(ValueError):
        round_kv(x, Precision.int8)


# --- accelerator catalog -------------------------------------------------------------------


def test_catalog_covers_required_types():
    for name in ("H100", "H200", "B200", "B300", "A100", "RTX_PRO_6000", "L4", "CPU"):
        assert name in CATALOG
    assert Precision.fp8_e4m3 not in CATALOG["A100"].native_weight_precisions
    assert Precision.nvfp4 in CATALOG["B200"].native_weight_precisions
    assert Precision.nvfp4 in CATALOG["RTX_PRO_6000"].native_weight_precisions
    assert Precision.nvfp4 not in CATALOG["H100"].native_weight_precisions


def test_kernel_family_follows_generation():
    assert CATALOG["H100"].kernel_family is CATALOG["H200"].kernel_family
    assert CATALOG["B200"].kernel_family is CATALOG["B300"].kernel_family
    families = {CATALOG[n].kernel_family for n in ("A100", "H100", "B200", "CPU")}
    assert len(families) == 4
    assert CATALOG["CPU"].kernel_family is KernelFamily.fp32_softmax


def test_every_native_precision_resolves():
    for spec in CATALOG.values():
        for fmt in spec.native_weight_precisions:
            view = resolve_view(spec.name.lower(), fmt.name)
            assert view.weights is fmt and view.kernel is spec.kernel_family
            assert not view.emulated_beyond_hardware
            assert view.kv_cache in spec.native_kv_precisions


def test_fp8_is_w8a8_and_int_is_weight_only():
    fp8 = resolve_view("H100", "fp8_e4m3")
    assert (fp8.activations, fp8.linear_inputs, fp8.kv_cache) == (Precision.bf16, Precision.fp8_e4m3, Precision.bf16)
    int4 = resolve_view("A100", "int4", int4_group=32)
    assert (int4.linear_inputs, int4.int4_group) == (Precision.bf16, 32)
    assert resolve_view("L4", "fp16").activations is Precision.fp16
    assert resolve_view("H200", "bf16", kv_precision="fp8_e5m2").kv_cache is Precision.fp8_e5m2


def test_gemm_inputs_default_to_the_format_and_may_be_set():
    """linear_inputs: the format's own GEMM input by default; the activation dtype (a 16-bit GEMM) or,
    for int8 and nvfp4, the weight format itself (W8A8, W4A4) when a pool says so."""
    assert resolve_view("B200", "nvfp4").linear_inputs is Precision.bf16
    w4a4 = resolve_view("B200", "nvfp4", linear_inputs="nvfp4")
    assert w4a4.linear_inputs is Precision.nvfp4 and w4a4.activations is Precision.bf16
    assert w4a4.label == "emulated:B200/nvfp4+inputs=nvfp4/kv=bf16/online_softmax_fp16"
    assert w4a4.tags()["linear_inputs"] == "nvfp4"
    assert resolve_view("A100", "int8", linear_inputs="int8").linear_inputs is Precision.int8
    assert resolve_view("H100", "fp8_e4m3", linear_inputs="bf16").label.startswith("emulated:H100/fp8_e4m3+inputs=bf16/")
    assert resolve_view("H100", "fp8_e4m3", linear_inputs="fp8_e4m3") == resolve_view("H100", "fp8_e4m3")
    for precision, inputs, allowed in (("nvfp4", "int8", "bf16, nvfp4"), ("int4", "int4", "bf16"),
                                       ("fp8_e4m3", "nvfp4", "fp8_e4m3, bf16"), ("bf16", "fp8", "bf16")):
        accelerator = "B200" if precision == "nvfp4" else "H100"
        with pytest.raises(ConfigError) as err:
            resolve_view(accelerator, precision, linear_inputs=inputs)
        assert str(err.value) == f"linear_inputs={inputs!r} with precision={precision}: allowed: {allowed}"


def test_fp8_attention_needs_an_e4m3_cache_and_hopper():
    view = resolve_view("H100", "fp8_e4m3", kv_precision="fp8_e4m3", fp8_attention=True)
    assert view.fp8_attention and not view.emulated_beyond_hardware
    assert view.label == "emulated:H100/fp8_e4m3/kv=fp8_e4m3/fp8_attention"
    assert view.tags()["fp8_attention"] == "true"
    assert not resolve_view("H100", "fp8_e4m3", kv_precision="fp8_e4m3").fp8_attention
    with pytest.raises(ConfigError, match="set kv_precision=fp8_e4m3 \\(it is bf16\\)"):
        resolve_view("H200", "bf16", fp8_attention=True)
    with pytest.raises(ConfigError, match="\\(it is fp8_e5m2\\)"):
        resolve_view("H200", "bf16", kv_precision="fp8_e5m2", fp8_attention=True)
    with pytest.raises(ConfigError, match="runs on Hopper \\(H100, H200\\), not B200"):
        resolve_view("B200", "nvfp4", kv_precision="fp8_e4m3", fp8_attention=True)
    beyond = resolve_view("B200", "nvfp4", kv_precision="fp8_e4m3", fp8_attention=True, allow_emulation=True)
    assert beyond.emulated_beyond_hardware and beyond.label.endswith("fp8_attention+beyond_hardware")


def test_unsupported_precision_is_refused_with_one_line():
    with pytest.raises(ConfigError) as err:
        resolve_view("A100", "fp8_e4m3")
    msg = str(err.value)
    assert "A100" in msg and "fp8_e4m3" in msg and "bf16" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="kv_precision=fp8_e4m3"):
        resolve_view("A100", "bf16", kv_precision="fp8_e4m3")
    with pytest.raises(ConfigError, match="H100"):
        resolve_view("H100", "nvfp4")


def test_explicit_emulation_beyond_hardware_says_so():
    view = resolve_view("H100", "nvfp4", allow_emulation=True)
    assert view.emulated_beyond_hardware and "beyond_hardware" in view.label
    assert view.tags()["emulated_beyond_hardware"] == "true"
    assert "beyond" not in resolve_view("B200", "nvfp4").label


def test_unknown_names_list_what_is_known():
    with pytest.raises(ConfigError, match="known: .*H100.*CPU"):
        resolve_view("TPUv9", "bf16")
    with pytest.raises(ConfigError, match="allowed: fp32, bf16"):
        resolve_view("H100", "fp7")
    assert PrecisionView.exact().label.startswith("emulated:CPU/fp32")
