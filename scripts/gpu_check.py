"""The one check a GPU user runs: real vLLM bf16 and fp8 pools and the DeepSpeed trainer on CUDA.

    .venv/bin/python scripts/gpu_check.py [--model DIR] [--steps 3] [--ranks 1] [--tp N]

Needs the CUDA builds (``make setup TARGET=gpu`` or ``pip install -e .[gpu]``; docs/install.md).
Without ``--model`` it saves a small random Llama (head_dim 64) in a temporary directory, so
nothing is downloaded.
Prints one JSON line per check (a check that raised: one line with its error) and a final verdict;
exits 1 if any check failed. Check 0 runs anywhere (no GPU needed); without CUDA the script stops
after it with one line saying so, exit 1:

0. The GPU preset (``fleet=vllm_gpu_mixed``) passes the load-time rules on the embedded model with
   each pool's max_model_len at the model's context; the preset as shipped (lengths sized for real
   models) is refused for exceeding that context, and so are out-of-range engine settings (tensor
   parallel size above a node, gpu_memory_utilization outside (0, 1]).

1. vLLM bf16 pool: sampled-token log-probs and the full-vocabulary head against a teacher-forced
   fp32 Hugging Face forward on the same weights; top-p/top-k support rows sum to 1 and hold the
   sampled token; the log-prob is renormalised over the support (docs/math.md §3.2, §4).
2. vLLM fp8 pool (online e4m3): the same record; its mismatch (mean |log p − log q|) vs the oracle.
3. DeepSpeed (BF16, ZeRO 1 then 2, NCCL): a few steps on a batch sampled by the bf16 pool; loss
   and grad norm finite, parameters move.
4. Weight sync: the trainer's published weights loaded in place into the bf16 vLLM engine change
   its generations and match a teacher-forced forward of those weights.
5. Engine settings reach vLLM: a pool's ``vllm`` block (gpu_memory_utilization, max_model_len,
   kv_cache_dtype fp8_e4m3, CUDA graphs, ``--tp`` GPUs; TP defaults to 2 when two GPUs are
   visible) is what the engine reports, and its log-probs stay near the fp32 oracle.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

RESULTS: list[dict] = []


def report(check: str, ok: bool, **seen) -> None:
    RESULTS.append({"check": check, "ok": bool(ok), **seen})
    print(json.dumps(RESULTS[-1]), flush=True)


def random_llama(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlmix.embedded.chartok import build_char_tokenizer  # the embedded model's tokenizer
    from rlmix.embedded.minicode import ALPHABET

    tok = build_char_tokenizer(ALPHABET)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def oracle_logprobs(model_dir: Path, r, weights: dict | None = None) -> torch.Tensor:
    """(N, V) fp32 teacher-forced log_softmax(z/T) at the masked completion positions."""
    from rlmix.models.io import load_causal_lm

    model = load_causal_lm(model_dir, dtype=torch.float32).cuda()
    if weights is not None:
        model.load_state_dict({k: v.float() for k, v in weights.items()})
    rows = []
    with torch.no_grad():
        for i in range(len(r)):
            plen, n = int(r.prompt_lens[i]), int(r.mask[i].sum())
            ids = torch.cat([r.prompt_ids[i, :plen], r.completion_ids[i, :n]])[None].cuda()
            rows.append(torch.log_softmax(model(ids).logits[0, plen - 1 : plen - 1 + n].float() / r.temperature, -1))
    return torch.cat(rows).cpu()


def check_pool(name: str, sampler, model_dir: Path, prompts, tol: float) -> object:
    from rlmix.rollout import SamplingParams

    full = sampler.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=24, num_candidates=16, seed=1))
    oracle = oracle_logprobs(model_dir, full)
    lp = oracle.gather(-1, full.completion_ids[full.mask][:, None])[:, 0]
    err = (full.sampler_logprobs[full.mask] - lp).abs()
    head_err = (full.head_logprobs[full.mask] - oracle.gather(-1, full.head_ids[full.mask])).abs().max()
    report(f"{name}: log-probs vs fp32 oracle", float(err.mean()) < tol, mean_abs=float(err.mean()),
           max_abs=float(err.max()), head_max_abs=float(head_err), tokens=full.num_tokens, tags=full.tags)
    trunc = sampler.generate(prompts, SamplingParams(temperature=0.8, top_p=0.9, top_k=32, max_new_tokens=24,
                                                     num_candidates=16, support_slots=64, seed=2))
    ids, probs = trunc.support_ids[trunc.mask], trunc.support_probs[trunc.mask]
    hit = ids == trunc.completion_ids[trunc.mask][:, None]
    renorm = (trunc.sampler_logprobs[trunc.mask] - (probs * hit).sum(-1).log()).abs().max()
    report(f"{name}: top-p/top-k support", bool(hit.any(-1).all()) and float(renorm) < 1e-4,
           row_sum_max_dev=float((probs.sum(-1) - 1).abs().max()), sampled_in_support=bool(hit.any(-1).all()),
           logprob_vs_support_max_abs=float(renorm))
    return full


PRESET = "fleet=vllm_gpu_mixed"


def check_config_rules() -> None:
    """Check 0 against the embedded model: the preset's engine lengths are sized for real models' contexts,
    so it is composed with each pool's max_model_len at the model's context (the preset as shipped must be
    refused for exceeding it), and two out-of-range settings must be refused."""
    from omegaconf import OmegaConf

    import rlmix
    from rlmix.assembly.rules import model_fields, model_positions
    from rlmix.commands.compose import compose_run_config
    from rlmix.errors import ConfigError

    preset = OmegaConf.load(Path(rlmix.__file__).parent / "conf" / "fleet" / "vllm_gpu_mixed.yaml")
    pools = list(preset.pools)
    own = compose_run_config([PRESET, *(f"fleet.pools.{p}.vllm.max_model_len=null" for p in pools)])
    positions = model_positions(own, model_fields(own))
    fit = [PRESET, *(f"fleet.pools.{p}.vllm.max_model_len={positions}" for p in pools)]
    cfg = compose_run_config(fit)
    engines = {name: vars(pool.vllm) for name, pool in cfg.fleet.pools.items()}
    refused, accepted = {}, []
    for overrides in ([PRESET], [*fit, "fleet.pools.h200_bf16.vllm.tensor_parallel_size=16"],
                      [*fit, "fleet.pools.h100_fp8.vllm.gpu_memory_utilization=1.5"]):
        key = overrides[-1]
        try:
            compose_run_config(overrides)
            accepted.append(key)
        except ConfigError as err:
            refused[key] = str(err).splitlines()[0]
    report("config: vllm_gpu_mixed engine settings", not accepted, model_positions=positions, engines=engines,
           refused=refused, accepted_but_should_not=accepted)


def run_check(name: str, check, *args):
    """``check(*args)``'s result, or None after one failed line naming what it raised."""
    try:
        return check(*args)
    except Exception as err:  # one verdict line per check, never a traceback
        lines = str(err).splitlines()
        report(name, False, error=f"{type(err).__name__}: {lines[0] if lines else ''}")
        return None


def verdict() -> bool:
    ok = all(r["ok"] for r in RESULTS)
    print(json.dumps({"verdict": "ok" if ok else "FAILED", "failed": [r["check"] for r in RESULTS if not r["ok"]]}),
          flush=True)
    return ok


def check_engine_settings(model_dir: Path, prompts, tp: int) -> None:
    from rlmix.samplers.vllm_checks import VllmEngine
    from rlmix.samplers.vllm_sampler import VllmSampler

    wanted = dict(tensor_parallel_size=tp, gpu_memory_utilization=0.3, max_model_len=384,
                  kv_cache_dtype="fp8_e4m3", enforce_eager=False)
    try:
        sampler = VllmSampler(model_dir, pool="gpu_engine_settings", engine=VllmEngine("bfloat16", None, **wanted))
    except Exception as err:  # report what the engine said (fp8 KV needs compute capability >= 8.9)
        report(f"engine settings {wanted}", False, error=f"{type(err).__name__}: {str(err).splitlines()[0]}")
        return
    config = sampler.llm.llm_engine.vllm_config
    seen = dict(tensor_parallel_size=config.parallel_config.tensor_parallel_size,
                gpu_memory_utilization=config.cache_config.gpu_memory_utilization,
                max_model_len=config.model_config.max_model_len, kv_cache_dtype=config.cache_config.cache_dtype,
                enforce_eager=config.model_config.enforce_eager)
    report("engine settings reach vLLM", seen == wanted, wanted=wanted, seen=seen)
    check_pool(f"vllm bf16 tp={tp} kv=fp8_e4m3", sampler, model_dir, prompts, tol=0.5)
    sampler.close()


def check_deepspeed(model_dir: Path, batch, steps: int, ranks: int):
    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig, TrainerBackend, TrainerConfig
    from rlmix.config.deepspeed import DeepSpeedConfig
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(len(batch), generator=g) < 0.5).float()
    batch = batch.replace(group_ids=torch.arange(len(batch)) // 4, rewards=rewards,
                          format_ok=torch.ones(len(batch), dtype=torch.bool), task_ids=("t",) * len(batch))
    weights = None
    for stage in (1, 2):
        cfg = TrainerConfig(backend=TrainerBackend.deepspeed, lr=1e-4, micro_batch_size=8,
                            deepspeed=DeepSpeedConfig(zero_stage=stage, ranks=ranks))
        trainer = DeepSpeedTrainer(model_dir, cfg, resolve_correction(CorrectionConfig(num_candidates=16)), seed=0)
        before = trainer.published_weights()
        losses, norms = [], []
        for _ in range(steps):
            m = trainer.train_step(batch)
            losses.append(m["train/loss"]), norms.append(m["train/grad_norm"])
        weights = trainer.published_weights()
        moved = sum(int((weights[k] != v).sum()) for k, v in before.items())
        finite = all(torch.isfinite(torch.tensor(losses + norms)))
        report(f"deepspeed zero{stage} x{ranks} on cuda", finite and moved > 0, losses=losses, grad_norms=norms,
               params_moved=moved, version=trainer.version)
        trainer.close()
    return weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--tp", type=int, default=None, help="tensor parallel size of check 5 (default: 2 if 2 GPUs)")
    args = ap.parse_args()
    run_check("config: vllm_gpu_mixed engine settings", check_config_rules)
    if not torch.cuda.is_available():
        report("cuda", False, error="no CUDA device visible: checks 1-5 not run")
        verdict()
        raise SystemExit("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); check 0 done, "
                         "checks 1-5 need a GPU and the CUDA builds (docs/install.md)")
    model_dir = run_check("device", setup_model, args.model)
    if model_dir is not None:
        run_gpu_checks(model_dir, args)
    raise SystemExit(0 if verdict() else 1)


def setup_model(model: Path | None) -> Path:
    model_dir = model or random_llama(Path(tempfile.mkdtemp(prefix="rlmix_gpu_check_")))
    report("device", True, name=torch.cuda.get_device_name(), torch=torch.__version__, model=str(model_dir))
    return model_dir


def run_gpu_checks(model_dir: Path, args) -> None:
    """Checks 1-5; a check whose input failed (the bf16 pool, the trainer) is skipped with one line."""
    from rlmix.models.io import load_tokenizer
    from rlmix.samplers.vllm_checks import VllmEngine
    from rlmix.samplers.vllm_sampler import VllmSampler

    tok = load_tokenizer(model_dir)
    prompts = [tok(t).input_ids for t in ["def f(x):", "map (+1) [1,2,3] =", "reverse [4,5] =", "sum [1] ="]] * 4

    def pool(label: str, name: str, quantization: str | None, tol: float):
        sampler = VllmSampler(model_dir, pool=name, engine=VllmEngine("bfloat16", quantization,
                                                                       gpu_memory_utilization=0.3))
        try:
            return sampler, check_pool(label, sampler, model_dir, prompts, tol)
        except Exception:
            sampler.close()
            raise

    bf16 = run_check("vllm bf16", pool, "vllm bf16", "gpu_bf16", None, 0.05)
    # fp8 may be refused by the engine (e.g. fp8 needs compute capability >= 8.9): its line says what it said
    fp8 = run_check("vllm fp8_e4m3", pool, "vllm fp8_e4m3", "gpu_fp8", "fp8", 0.5)
    if fp8 is not None:
        fp8[0].close()
    if bf16 is None:
        report("deepspeed and weight sync", False, error="skipped: they train on the bf16 pool's batch")
    else:
        sampler, batch = bf16
        weights = run_check("deepspeed on cuda", check_deepspeed, model_dir, batch, args.steps, args.ranks)
        if weights is None:
            report("weight sync into vllm bf16", False, error="skipped: no trained weights")
        else:
            run_check("weight sync into vllm bf16", check_weight_sync, sampler, model_dir, prompts, batch, weights,
                      args.steps)
        sampler.close()
    tp = args.tp or (2 if torch.cuda.device_count() >= 2 else 1)
    run_check("engine settings reach vLLM", check_engine_settings, model_dir, prompts, tp)


def check_weight_sync(sampler, model_dir: Path, prompts, batch, weights: dict, version: int) -> None:
    from rlmix.rollout import SamplingParams

    params = SamplingParams(temperature=0.8, max_new_tokens=24, num_candidates=4, seed=1)
    sampler.load_weights(weights, version=version)
    after = sampler.generate(prompts, params)
    lp = oracle_logprobs(model_dir, after, weights).gather(-1, after.completion_ids[after.mask][:, None])[:, 0]
    err = float((after.sampler_logprobs[after.mask] - lp).abs().mean())
    report("weight sync into vllm bf16", err < 0.05 and not torch.equal(after.completion_ids, batch.completion_ids),
           mean_abs_vs_new_weights=err, version=int(after.policy_version[0]))


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
