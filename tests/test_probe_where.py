"""Where the probe's mismatch sits: bins by trainer probability and by position, and router flips,
each checked against a direct loop over the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from rlmix.commands.probe import where_table
from rlmix.correction.diagnostics import K3_TOKEN_CAP
from rlmix.eval.where import (POSITION_EDGES, PROB_EDGES, bin_index, by_env_distance, by_position, by_trainer_prob,
                              env_distance_labels, env_distances, position_labels, prob_labels, router_flips)


def _k3(lr: float) -> float:
    return min(math.exp(lr) - 1.0 - lr, K3_TOKEN_CAP)


def _prob_bin(p: float) -> int:
    for i in range(len(PROB_EDGES) - 2):
        if p < PROB_EDGES[i + 1]:
            return i
    return len(PROB_EDGES) - 2


def _position_bin(t: int) -> int:
    return sum(t >= e for e in POSITION_EDGES[1:])


def _loop_bins(lrs: list[float], bins: list[int], count: int) -> list[tuple[int, float, float, float]]:
    """(tokens, mean |lr|, mean k3, share of Σ|lr|) per bin, one token at a time."""
    total = sum(abs(x) for x in lrs)
    out = []
    for i in range(count):
        mine = [x for x, b in zip(lrs, bins) if b == i]
        n = len(mine)
        out.append((n, sum(abs(x) for x in mine) / n if n else 0.0, sum(_k3(x) for x in mine) / n if n else 0.0,
                    sum(abs(x) for x in mine) / total))
    return out


def _check(result, oracle, labels):
    assert [b.bin for b in result] == list(labels)
    for b, (n, abs_mean, k3, share) in zip(result, oracle):
        assert b.tokens == n
        assert b.logprob_abs_diff == pytest.approx(abs_mean, rel=1e-9, abs=1e-12)
        assert b.kl_k3 == pytest.approx(k3, rel=1e-9, abs=1e-12)
        assert b.abs_diff_share == pytest.approx(share, rel=1e-9, abs=1e-12)


def test_labels_name_the_bins():
    assert prob_labels() == ("[0,0.001)", "[0.001,0.01)", "[0.01,0.1)", "[0.1,0.5)", "[0.5,0.9)", "[0.9,1]")
    assert position_labels() == ("0-7", "8-31", "32-127", "128+")


def test_edges_belong_to_the_bin_above_and_the_top_edge_to_the_last():
    p = torch.tensor([0.0, 1e-3, 0.00099, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
    assert bin_index(p, PROB_EDGES, closed_last=True).tolist() == [0, 1, 0, 3, 4, 5, 5]
    t = torch.tensor([0, 7, 8, 31, 32, 127, 128, 4000], dtype=torch.float64)
    assert bin_index(t, POSITION_EDGES, closed_last=False).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_binning_equals_a_loop_over_tokens():
    gen = torch.Generator().manual_seed(0)
    n = 400
    # Probabilities spread over every bin (log-uniform from 1e-5 to 1), log-ratios of both signs with outliers.
    logp = torch.empty(n, dtype=torch.float64).uniform_(math.log(1e-5), 0.0, generator=gen)
    lr = torch.randn(n, generator=gen, dtype=torch.float64) * 0.05
    lr[::37] *= 60.0  # a few tokens past the k3 cap
    positions = torch.randint(0, 300, (n,), generator=gen)
    lrs, ps, ts = lr.tolist(), logp.exp().tolist(), positions.tolist()

    _check(by_trainer_prob(lr, logp), _loop_bins(lrs, [_prob_bin(p) for p in ps], 6), prob_labels())
    _check(by_position(lr, positions), _loop_bins(lrs, [_position_bin(t) for t in ts], 4), position_labels())


def test_empty_bins_and_no_mismatch():
    bins = by_position(torch.zeros(3), torch.tensor([0, 1, 2]))
    assert [b.tokens for b in bins] == [3, 0, 0, 0]
    assert all(b.abs_diff_share is None and b.logprob_abs_diff == 0.0 and b.kl_k3 == 0.0 for b in bins)


def _env_distance_bin(d: int) -> int:
    """first_turn, 0, 1-3, 4-15, 16-63, 64+."""
    if d < 0:
        return 0
    return 1 + sum(d >= e for e in (1, 4, 16, 64))


def test_env_distance_bins_equal_a_loop_over_an_episode_shaped_batch():
    gen = torch.Generator().manual_seed(2)
    B, T = 6, 200
    # Each row: a first policy turn, then observation/policy runs of random lengths, then padding.
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        t, policy = 0, True
        end = T - int(torch.randint(0, 40, (1,), generator=gen))
        while t < end:
            run = int(torch.randint(1, 90 if policy else 12, (1,), generator=gen))
            mask[b, t: min(t + run, end)] = policy
            t, policy = t + run, not policy
    mask[0, :] = torch.arange(T) < 50  # a single-turn row: every token is first_turn
    dists = []
    for b in range(B):  # walk each row: the distance resets at every non-policy token
        last_env = None
        for t in range(T):
            if not mask[b, t]:
                last_env = t
            else:
                dists.append(-1 if last_env is None else t - last_env - 1)
    assert env_distances(mask).tolist() == dists
    assert min(dists) == -1 and max(dists) >= 64
    lr = torch.randn(len(dists), generator=gen, dtype=torch.float64) * 0.1
    oracle = _loop_bins(lr.tolist(), [_env_distance_bin(d) for d in dists], 6)
    _check(by_env_distance(lr, torch.tensor(dists)), oracle, env_distance_labels())
    assert env_distance_labels() == ("first_turn", "0", "1-3", "4-15", "16-63", "64+")
    # Single-turn completions: nothing follows an environment token, so there is nothing to report.
    assert by_env_distance(lr[:50], env_distances(mask[:1])) is None


def test_router_flips_equal_a_loop_over_tokens():
    gen = torch.Generator().manual_seed(1)
    n, layers = 300, 4
    lr = torch.randn(n, generator=gen, dtype=torch.float64) * 0.1
    flip = torch.randint(0, layers + 1, (n,), generator=gen).double() / layers  # share of flipped layers
    flip[torch.rand(n, generator=gen) < 0.7] = 0.0  # most tokens route alike
    flip[::23] = float("nan")  # no record
    rows = [(abs(x), f) for x, f in zip(lr.tolist(), flip.tolist()) if not math.isnan(f)]
    hit = [a for a, f in rows if f > 0]
    miss = [a for a, f in rows if f == 0]
    r = router_flips(lr, flip)
    assert r.tokens == len(rows) == n - len(range(0, n, 23))
    assert r.layer_flip_rate == pytest.approx(sum(f for _, f in rows) / len(rows))
    assert r.token_flip_rate == pytest.approx(len(hit) / len(rows))
    assert r.logprob_abs_diff_flipped == pytest.approx(sum(hit) / len(hit))
    assert r.logprob_abs_diff_unflipped == pytest.approx(sum(miss) / len(miss))
    assert r.abs_diff_share_flipped == pytest.approx(sum(hit) / (sum(hit) + sum(miss)))
    assert router_flips(lr[:3], torch.full((3,), float("nan"))) is None


# -- on a pool's sampled batch -----------------------------------------------------------------


def _probe_one_pool(model_dir, fleet: list[str], pool: str, prompts, max_new_tokens: int):
    """A pool's sampled batch and ``measure`` of it against an fp32 trainer view."""
    from rlmix.assembly.fleet import build_sampler, resolve_fleet
    from rlmix.commands.compose import compose_plan
    from rlmix.config.schema import TrainerConfig, TrainerPrecision
    from rlmix.eval.probe import ProbeContext, measure

    plan = compose_plan([*fleet, f"model.path={model_dir}", f"loop.max_new_tokens={max_new_tokens}"],
                        for_training=False)
    spec = next(s for s in resolve_fleet(plan, eos_id=2) if s.pool == pool)
    batch = build_sampler(spec, model_dir, seed=0).generate(prompts, spec.params)
    ctx = ProbeContext(model_dir, 0, plan.correction, TrainerConfig(precision=TrainerPrecision.fp32), seed=0)
    return batch, measure(ctx, batch, spec, tokens_per_s=1.0)


def _loop_log_ratios(model_dir, batch) -> tuple[list[float], list[float], list[int]]:
    """(lr, p_trainer, position) of every generated token, one unpadded fp32 forward per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    lrs, ps, ts = [], [], []
    for b in range(len(batch)):
        n_prompt = int(batch.prompt_lens[b])
        prompt = batch.prompt_ids[b, :n_prompt].tolist()
        cols = [t for t in range(batch.mask.shape[1]) if batch.mask[b, t]]
        seq = prompt + batch.completion_ids[b, : cols[-1] + 1].tolist()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0].double() / batch.temperature
        for t in cols:
            logp = torch.log_softmax(logits[n_prompt + t - 1], -1)[int(batch.completion_ids[b, t])].item()
            lrs.append(max(-20.0, min(20.0, logp - float(batch.sampler_logprobs[b, t]))))
            ps.append(math.exp(logp))
            ts.append(t)
    return lrs, ps, ts


@pytest.mark.slow
def test_a_pools_bins_equal_a_loop_over_its_sampled_tokens(tiny_llama_dir):
    fleet = ["fleet=smoke", "fleet.pools.h100_fp8.accelerator=A100", "fleet.pools.h100_fp8.precision=int4"]
    prompts = [[1, 5, 6, 7], [1, 9], [1, 4, 4, 4, 4, 4, 4], [1, 20, 21]]
    batch, result = _probe_one_pool(tiny_llama_dir, fleet, "h100_fp8", prompts, max_new_tokens=40)
    lrs, ps, ts = _loop_log_ratios(tiny_llama_dir, batch)
    assert len(lrs) == result.tokens and max(ts) >= 32  # three of the four position bins are populated
    for got, bins, labels in ((result.by_trainer_prob, [_prob_bin(p) for p in ps], prob_labels()),
                              (result.by_position, [_position_bin(t) for t in ts], position_labels())):
        oracle = _loop_bins(lrs, bins, len(labels))
        assert [b.tokens for b in got] == [o[0] for o in oracle]
        for b, (_, abs_mean, k3, share) in zip(got, oracle):
            assert b.logprob_abs_diff == pytest.approx(abs_mean, abs=1e-4)
            assert b.kl_k3 == pytest.approx(k3, abs=1e-4)
            assert b.abs_diff_share == pytest.approx(share, abs=1e-4)
        # The bins partition the pool's tokens: their token-weighted means are the pool's means.
        assert sum(b.tokens * b.logprob_abs_diff for b in got) / result.tokens == pytest.approx(result.logprob_abs_diff, rel=1e-5)
        assert sum(b.tokens * b.kl_k3 for b in got) / result.tokens == pytest.approx(result.kl_k3, rel=1e-5)
    assert result.router is None  # a dense model
    table = where_table([result]).splitlines()
    assert "p<0.001" in table[0] and "t128+" in table[0] and table[2].startswith("h100_fp8")
    assert table[2].split()[-4:] == ["-"] * 4


def _loop_router_flips(model_dir, batch) -> list[float]:
    """Per generated token, the share of sparse layers whose top-k experts (recomputed here from each
    router's input: top-k of softmax(x Wᵀ), fp32, one unpadded row at a time) differ from the
    sampler's record at the position predicting it; NaN where there is no record."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gates = [mod for name, mod in model.named_modules() if name.endswith("mlp.gate")]
    flips = []
    for b in range(len(batch)):
        n_prompt = int(batch.prompt_lens[b])
        cols = [t for t in range(batch.mask.shape[1]) if batch.mask[b, t]]
        seq = batch.prompt_ids[b, :n_prompt].tolist() + batch.completion_ids[b, : cols[-1] + 1].tolist()
        inputs: list[torch.Tensor] = []
        handles = [g.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].reshape(-1, args[0].shape[-1])))
                   for g in gates]
        with torch.no_grad():
            model(input_ids=torch.tensor([seq]))
        for h in handles:
            h.remove()
        for t in cols:
            pos = n_prompt + t - 1
            recorded = batch.routed_experts[b, pos].long()  # (M, k)
            if (recorded < 0).any():
                flips.append(float("nan"))
                continue
            differ = 0
            for layer, (gate, x) in enumerate(zip(gates, inputs)):
                own = torch.softmax(x[pos] @ gate.weight.T, -1).topk(gate.top_k).indices
                differ += set(own.tolist()) != set(recorded[layer].tolist())
            flips.append(differ / len(gates))
    return flips


@pytest.mark.slow
def test_router_flips_of_a_moe_pool_equal_a_loop_over_its_sampled_tokens(tiny_qwen3_moe_dir):
    import dataclasses

    fleet = ["fleet=smoke", "fleet.pools.h100_fp8.accelerator=B200", "fleet.pools.h100_fp8.precision=nvfp4"]
    prompts = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 11], [1, 20, 21, 22, 23], [1, 30, 31]]
    batch, result = _probe_one_pool(tiny_qwen3_moe_dir, fleet, "h100_fp8", prompts, max_new_tokens=16)
    lrs, _, _ = _loop_log_ratios(tiny_qwen3_moe_dir, batch)
    flips = _loop_router_flips(tiny_qwen3_moe_dir, batch)
    rows = [(abs(x), f) for x, f in zip(lrs, flips) if not math.isnan(f)]
    hit, miss = [a for a, f in rows if f > 0], [a for a, f in rows if f == 0]
    assert hit and miss  # nvfp4 moves some tokens to other experts, not all
    r = result.router
    assert r.tokens == len(rows) == result.tokens  # a torch pool records the position predicting every token
    assert r.layer_flip_rate == pytest.approx(sum(f for _, f in rows) / len(rows))
    assert r.token_flip_rate == pytest.approx(len(hit) / len(rows))
    assert r.logprob_abs_diff_flipped == pytest.approx(sum(hit) / len(hit), abs=1e-4)
    assert r.logprob_abs_diff_unflipped == pytest.approx(sum(miss) / len(miss), abs=1e-4)
    assert r.abs_diff_share_flipped == pytest.approx(sum(hit) / (sum(hit) + sum(miss)), abs=1e-4)
    assert dataclasses.asdict(result)["router"]["tokens"] == r.tokens  # what probe.json holds
    row = where_table([result]).splitlines()[2].split()
    assert row[-4:] == [f"{r.layer_flip_rate:.3f}", f"{r.token_flip_rate:.3f}",
                        f"{r.logprob_abs_diff_flipped:.2g}/{r.logprob_abs_diff_unflipped:.2g}",
                        f"{100 * r.abs_diff_share_flipped:.0f}%"]


def test_teacher_forcing_attends_to_observations_between_policy_turns():
    """An episode's mask has holes: the attention must reach its last generated token, not stop
    after as many tokens as the policy generated."""
    from rlmix.eval.probe import sequence_attention
    from rlmix.rollout import Rollouts

    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    batch = Rollouts(prompt_ids=torch.tensor([[1, 2, 3], [1, 2, 0], [1, 0, 0]]), prompt_lens=torch.tensor([3, 2, 1]),
                     completion_ids=torch.tensor([[4, 5, 6, 7, 8, 9], [4, 5, 6, 0, 0, 0], [0] * 6]), mask=mask,
                     sampler_logprobs=torch.zeros(3, 6), policy_version=torch.zeros(3, dtype=torch.long),
                     pool=("a",) * 3, finish_reason=("stop",) * 3)
    _, attention, _ = sequence_attention(batch, pad_id=0)
    assert attention.tolist() == [[True] * 8 + [False], [True] * 5 + [False] * 4, [True] + [False] * 8]


@pytest.mark.slow
def test_the_probe_draws_episodes_and_bins_by_distance_after_an_observation(tmp_path):
    """task=minicode_agent: each pool plays sandboxed episodes (a random tiny agent model, whose
    malformed actions get error observations back), and the env-distance bins cover its tokens."""
    from rlmix.commands.compose import compose_plan
    from rlmix.eval.probe import probe_fleet
    from tests.agentic_models import tiny_agent_model

    model_dir = tiny_agent_model(tmp_path / "agent")
    plan = compose_plan(["task=minicode_agent", "task.max_turns=3", "task.max_turn_tokens=24", "fleet=smoke",
                         "~fleet.pools.h100_fp8", f"model.path={model_dir}", "probe.prompts=2",
                         "probe.samples_per_prompt=2"], for_training=False)
    (result,), summary = probe_fleet(plan, progress=lambda _: None)
    bins = result.by_env_distance
    assert [b.bin for b in bins] == list(env_distance_labels())
    assert sum(b.tokens for b in bins) == result.tokens == sum(b.tokens for b in result.by_position)
    assert bins[0].tokens > 0 and sum(b.tokens for b in bins[1:]) > 0  # first turns and later turns
    assert result.sequences == 4 and len(summary["settings"]["task_ids"]) == 2
    header = where_table([result]).splitlines()[0]
    assert "efirst_turn" in header and "e0" in header
