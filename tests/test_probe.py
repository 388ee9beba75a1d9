"""rlmix probe: exact KL and attribution math, one-factor views, a two-pool fleet, probe.json, the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlmix.config.schema import TrainerConfig, TrainerPrecision
from rlmix.errors import ConfigError
from rlmix.eval.probe import (
    FACTORS,
    Attribution,
    PoolProbe,
    ProbeContext,
    attribution_shares,
    exact_kl,
    factor_views,
    reference_view,
    probe_fleet,
    teacher_forced_logits,
)
from rlmix.commands.probe import PROBE_FILE, probe_table, run_probe
from rlmix.eval.where import position_labels, prob_labels
from rlmix.samplers.accelerators import PrecisionView, resolve_view
from tests.cli import rlmix_refusing

RLMIX = str(Path(sys.executable).with_name("rlmix"))
TINY = ["probe.prompts=4", "probe.samples_per_prompt=2", "loop.max_new_tokens=8"]
# Hydra cannot add keys to the typed pools dict, so the smoke fleet's two slots are re-targeted:
# both pools on A100 (same kernel family), one serving bf16 weights and one int4.
BF16_VS_INT4 = ["fleet=smoke", "fleet.pools.h100_fp8.accelerator=A100", "fleet.pools.h100_fp8.precision=int4"]
# Which PrecisionView fields each factor may change.
FACTOR_FIELDS = {"weights": {"weights", "activations", "linear_inputs", "int4_group"},
                 "kv": {"kv_cache"}, "kernel": {"kernel"}}


def compose(overrides: list[str]):
    """The resolved plan of ``rlmix probe overrides``."""
    from rlmix.commands.compose import compose_plan

    return compose_plan(overrides, for_training=False)


# -- pure math ---------------------------------------------------------------------------------


def test_exact_kl_hand_computed_and_shift_invariant():
    q = torch.tensor([[0.5, 0.5], [0.2, 0.8]]).log()
    p = torch.tensor([[0.25, 0.75], [0.2, 0.8]]).log()
    kl = exact_kl(q + 3.0, p - 1.0)  # logits: a constant shift changes nothing
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl[0].item() == pytest.approx(expected, rel=1e-5)
    assert kl[1].item() == pytest.approx(0.0, abs=1e-6)


def test_exact_kl_zero_mass_tokens_contribute_nothing():
    q = torch.tensor([[0.0, float("-inf"), math.log(3.0)]])  # q = [1/4, 0, 3/4]
    p = torch.tensor([[0.0, 0.0, 0.0]])  # uniform over 3
    expected = 0.25 * math.log(0.25 * 3) + 0.75 * math.log(0.75 * 3)
    assert exact_kl(q, p).item() == pytest.approx(expected, rel=1e-5)


def test_attribution_shares_sum_to_one_and_none_without_mismatch():
    shares = attribution_shares({"weights": 3.0, "kv": 1.0, "kernel": 0.0})
    assert shares == {"weights": 0.75, "kv": 0.25, "kernel": 0.0}
    assert attribution_shares({"weights": 0.0, "kv": 0.0, "kernel": 0.0}) is None


@pytest.mark.parametrize("accelerator,precision,kv", [
    ("H100", "fp8_e4m3", None), ("B200", "nvfp4", "fp8_e4m3"), ("A100", "int4", None), ("A100", "fp16", None),
])
def test_factor_views_switch_exactly_one_factor(accelerator, precision, kv):
    view, ref = resolve_view(accelerator, precision, kv), reference_view()
    assert ref == resolve_view("CPU", "bf16")
    views = factor_views(view, ref)
    assert tuple(views) == FACTORS
    union = {}
    for name, fview in views.items():
        changed = {f.name for f in dataclasses.fields(ref) if getattr(fview, f.name) != getattr(ref, f.name)}
        assert changed <= FACTOR_FIELDS[name], (name, changed)
        union |= {f: getattr(fview, f) for f in changed}
    # All three factors switched together give the pool's own numerics.
    assert dataclasses.replace(ref, **union, accelerator=view.accelerator,
                               emulated_beyond_hardware=view.emulated_beyond_hardware) == view


# -- the measurement on a tiny checkpoint ------------------------------------------------------


def test_teacher_forced_exact_view_matches_the_hf_model(tiny_llama_dir):
    """Position alignment: the exact view teacher-forced equals HF fp32 logits at the same tokens."""
    from rlmix.correction.logprobs import gather_logprobs
    from rlmix.rollout import SamplingParams
    from rlmix.samplers.torch_sampler import TorchSampler
    from rlmix.trainers.tokens import masked_logits

    ctx = ProbeContext(tiny_llama_dir, 0, compose([]).correction, TrainerConfig(precision=TrainerPrecision.fp32), seed=0)
    sampler = TorchSampler(tiny_llama_dir, PrecisionView.exact(), pool="x", pad_id=0)
    prompts = [[1, 5, 6, 7], [1, 9], [1, 4, 4, 4, 4, 4, 4]]
    batch = sampler.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=6, seed=3))
    tf = teacher_forced_logits(ctx.view_sampler(PrecisionView.exact()), batch, pad_id=0)
    hf = masked_logits(ctx.trainer.model, batch, 0, autocast=None).detach()
    assert tf.shape == hf.shape == (batch.num_tokens, 52)
    torch.testing.assert_close(tf, hf, atol=2e-4, rtol=1e-4)
    # ... and both reproduce the sampler's own recorded log-probs of the sampled tokens.
    logp, _ = gather_logprobs(tf, batch.completion_ids[batch.mask], None)
    torch.testing.assert_close(logp, batch.sampler_logprobs[batch.mask], atol=2e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def two_pools(tiny_llama_dir):
    lines: list[str] = []
    cfg = compose([*BF16_VS_INT4, f"model.path={tiny_llama_dir}", *TINY])
    results, summary = probe_fleet(cfg, progress=lines.append)
    return {r.pool: r for r in results}, summary, lines


def test_probe_separates_a_bf16_pool_from_an_int4_pool(two_pools):
    results, _, lines = two_pools
    int4, bf16 = results["h100_fp8"], results["a100_bf16"]
    assert (int4.tags["precision"], bf16.tags["precision"]) == ("int4", "bf16")
    assert int4.kl_k3 > bf16.kl_k3 and int4.kl_exact > bf16.kl_exact
    assert int4.logprob_abs_diff > bf16.logprob_abs_diff
    # Same accelerator, so the difference is the weights: that factor dominates the int4 pool ...
    assert int4.attribution.factor_kl["weights"] > 10 * bf16.attribution.joint_kl
    assert int4.attribution.shares["weights"] > 0.9
    # ... while the bf16 pool's weights equal the reference's: exactly zero, all from the kernel.
    assert bf16.attribution.factor_kl["weights"] == 0.0 and bf16.attribution.factor_kl["kv"] == 0.0
    assert bf16.attribution.shares == {"weights": 0.0, "kv": 0.0, "kernel": 1.0}
    for r in (int4, bf16):
        assert sum(r.attribution.shares.values()) == pytest.approx(1.0)
        assert r.sequences == 8 and 0 < r.tokens <= 64 and r.tokens_per_s > 0
        assert r.multiplicative_error == pytest.approx(math.exp(r.logprob_abs_diff), rel=1e-5)
        assert 0.0 <= r.ratio_tail_frac <= 1.0 and 0.0 < r.sc_head_mass <= 1.0 + 1e-5
        assert r.sc_tail_ratio > 0
        assert 0.0 < r.trainer_entropy <= math.log(52)  # nats per token over the tiny model's 52 tokens
    assert len(lines) == 2 and lines[0].startswith("[1/2] h100_fp8") and "entropy=" in lines[0]


def test_probe_summary_has_every_field_and_round_trips(two_pools, tmp_path):
    from rlmix.commands.probe import write_probe

    results, summary, _ = two_pools
    path = write_probe(tmp_path, summary)
    loaded = json.loads(path.read_text())
    assert set(loaded) == {"fleet", "reference", "trainer", "settings", "pools", "versions"}
    assert set(loaded["fleet"]) == set(loaded["pools"]) == {"h100_fp8", "a100_bf16"}
    assert loaded["reference"]["label"] == reference_view().label
    assert "fp32-softmax" in loaded["reference"]["definition"]
    assert loaded["settings"]["prompts"] == 4 and len(loaded["settings"]["task_ids"]) == 4
    for row in loaded["pools"].values():
        assert set(row) == {f.name for f in dataclasses.fields(PoolProbe)}
        assert set(row["attribution"]) == {f.name for f in dataclasses.fields(Attribution)}
        assert all(isinstance(row[k], float) for k in ("kl_k3", "kl_k1", "kl_exact", "sc_tail_ratio", "sc_head_mass"))
        assert [b["bin"] for b in row["by_trainer_prob"]] == list(prob_labels())
        assert [b["bin"] for b in row["by_position"]] == list(position_labels())
        assert sum(b["tokens"] for b in row["by_position"]) == row["tokens"]
        assert sum(b["abs_diff_share"] for b in row["by_trainer_prob"]) == pytest.approx(1.0)
        assert row["router"] is None  # a dense model
    table = probe_table(list(results.values())).splitlines()
    assert len(table) == 4 and "KL_kernel" in table[0] and set(table[1]) <= {"-", " "} and table[2].startswith("h100_fp8")


def test_a_pool_computing_like_the_reference_has_zero_attributed_kl(tiny_llama_dir):
    cfg = compose(["fleet=smoke", "~fleet.pools.h100_fp8", "fleet.pools.a100_bf16.accelerator=CPU",
                   f"model.path={tiny_llama_dir}", "probe.prompts=2", "probe.samples_per_prompt=2",
                   "loop.max_new_tokens=4"])
    (result,), _ = probe_fleet(cfg, progress=lambda _: None)
    a = result.attribution
    assert a.joint_kl == 0.0 and set(a.factor_kl.values()) == {0.0} and a.shares is None
    # What remains is how the trainer's autocast differs from the reference view.
    assert result.kl_exact == pytest.approx(a.reference_to_trainer_kl, abs=1e-7)


@pytest.mark.parametrize("override,key", [
    ("probe.prompts=1000", "probe.prompts"),
    ("probe.num_candidates=0", "probe.num_candidates"),
    ("fleet.pools.a100_bf16.precision=int3", "precision"),
])
def test_bad_input_is_a_config_error_naming_the_key(override, key, tmp_path):
    with pytest.raises(ConfigError, match=key):
        run_probe(["fleet=smoke", override, f"probe.out_dir={tmp_path}"])
    assert not (tmp_path / PROBE_FILE).exists()


@pytest.mark.slow
def test_cli_probe_end_to_end(tiny_llama_dir, tmp_path):
    out_dir = tmp_path / "probe"
    args = [RLMIX, "probe", *BF16_VS_INT4, f"model.path={tiny_llama_dir}", "probe.prompts=2",
            "probe.samples_per_prompt=2", "loop.max_new_tokens=4", f"probe.out_dir={out_dir}"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[2/2] a100_bf16" in out.stdout and "shares w/kv/kern" in out.stdout and "t128+" in out.stdout
    assert set(json.loads((out_dir / PROBE_FILE).read_text())["pools"]) == {"h100_fp8", "a100_bf16"}
    bad = rlmix_refusing("probe", "fleet=nope", cwd=tmp_path)  # the CLI's entry, in this process
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
