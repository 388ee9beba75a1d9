"""Side by side on the embedded model: sampler tokens/s (torch vs vLLM) and trainer step time (torch vs DeepSpeed).

    .venv/bin/python scripts/bench_backends.py [--batch 64] [--new-tokens 48] [--repeats 3] [--model DIR] [--out F]

Both samplers run in this process, one after the other, on the same prompts (minicode task prompts
tokenized by the model's tokenizer), with the same sampling settings and K candidates recorded per
token (the record the trainer needs). Throughput counts generated tokens over generate() wall time,
best of ``--repeats`` after one warm-up call. Trainers: the same scored batch (from the torch
sampler, rewards drawn at random per group) through ``train_step``, mean of ``--repeats`` steps
after one warm-up step; DeepSpeed runs one rank, ZeRO 1, BF16, gloo. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from arguments import at_least, existing
from perf_common import step_times


def untrained_embedded(out: Path) -> Path:
    """The embedded model as initialised from its seed, before the warm start."""
    from transformers import LlamaForCausalLM

    from rlmix.embedded.chartok import build_char_tokenizer
    from rlmix.config.embedded import EmbeddedModelSpec
    from rlmix.embedded.model import llama_config
    from rlmix.embedded.minicode import ALPHABET

    spec, tok = EmbeddedModelSpec(), build_char_tokenizer(ALPHABET)
    torch.manual_seed(spec.seed)
    special = {"pad": tok.pad_token_id, "bos": tok.bos_token_id, "eos": tok.eos_token_id}
    LlamaForCausalLM(llama_config(spec, len(tok), special)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_prompts(model_dir, n: int, seed: int) -> list[list[int]]:
    from rlmix.models.io import load_tokenizer
    from rlmix.embedded.minicode import MiniCode

    tok = load_tokenizer(model_dir)
    problems = MiniCode(levels=(1, 2, 3), seed=seed).sample(n, seed=seed)
    return [tok(p.prompt).input_ids for p in problems]


def time_sampler(sampler, prompts, params, repeats: int) -> dict:
    sampler.generate(prompts[:4], params)  # warm-up
    best, tokens = float("inf"), 0
    for r in range(repeats):
        start = time.perf_counter()
        out = sampler.generate(prompts, params.__class__(**{**params.__dict__, "seed": 100 + r}))
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, tokens = elapsed, out.num_tokens
    return {"tokens": tokens, "seconds": round(best, 3), "tokens_per_s": round(tokens / best, 1)}


def scored_batch(rollouts, group_size: int):
    b = len(rollouts)
    g = torch.Generator().manual_seed(0)
    return rollouts.replace(
        group_ids=torch.arange(b) // group_size,
        rewards=(torch.rand(b, generator=g) < 0.4).float(),
        format_ok=torch.ones(b, dtype=torch.bool),
        task_ids=tuple(str(i // group_size) for i in range(b)),
    )


def time_trainer(trainer, batch, repeats: int) -> dict:
    times = step_times(trainer, batch, repeats)
    return {"step_s": round(sum(times) / len(times), 3), "steps": repeats, "tokens": batch.num_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=at_least(1), default=64)
    ap.add_argument("--new-tokens", type=at_least(1), default=48)
    ap.add_argument("--candidates", type=at_least(1), default=128,
                    help="K recorded per token (capped at the vocabulary)")
    ap.add_argument("--repeats", type=at_least(1), default=3)
    ap.add_argument("--model", type=existing("directory"), default=None,
                    help="an HF model dir instead of the embedded model")
    ap.add_argument("--untrained", action="store_true",
                    help="the embedded model's architecture and tokenizer with its initial weights, no warm "
                         "start (the same timings: no stop tokens, every row generates --new-tokens)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig, TrainerBackend, TrainerConfig
    from rlmix.config.embedded import EmbeddedModelSpec
    from rlmix.embedded.model import build_embedded_model
    from rlmix.rollout import SamplingParams
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler
    from rlmix.samplers.vllm_checks import VllmEngine
    from rlmix.samplers.vllm_sampler import VllmSampler
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer
    from rlmix.trainers.torch_trainer import TorchTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    if args.model:
        model_dir = Path(args.model)
    elif args.untrained:
        model_dir = untrained_embedded(Path(tempfile.mkdtemp(prefix="rlmix_bench_")))
    else:
        model_dir = build_embedded_model(EmbeddedModelSpec(), progress=print)
    prompts = build_prompts(model_dir, args.batch, seed=0)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens,
                            num_candidates=min(args.candidates, vocab), seed=0)
    report: dict = {"model_dir": str(model_dir), "untrained": args.untrained, "batch": args.batch, "new_tokens": args.new_tokens,
                    "candidates": params.num_candidates, "cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads()}

    torch_sampler = TorchSampler(model_dir, resolve_view("CPU", "bf16"), pool="bench_torch", seed=0)
    report["sampler_torch_bf16"] = time_sampler(torch_sampler, prompts, params, args.repeats)
    batch = scored_batch(torch_sampler.generate(prompts, params), group_size=8)
    torch_sampler.close()
    vllm_sampler = VllmSampler(model_dir, pool="bench_vllm", engine=VllmEngine("bfloat16", None), seed=0)
    report["sampler_vllm_cpu_bf16"] = time_sampler(vllm_sampler, prompts, params, args.repeats)
    vllm_sampler.close()
    torch.set_num_threads(os.cpu_count() or 1)  # the CPU vLLM worker binds threads; undo for the trainers

    correction = resolve_correction(CorrectionConfig(num_candidates=params.num_candidates))
    cfg = TrainerConfig(micro_batch_size=args.batch)
    report["trainer_torch_bf16"] = time_trainer(TorchTrainer(model_dir, cfg, correction, seed=0), batch, args.repeats)
    ds_cfg = TrainerConfig(backend=TrainerBackend.deepspeed, micro_batch_size=args.batch)
    report["trainer_deepspeed_zero1_bf16"] = time_trainer(DeepSpeedTrainer(model_dir, ds_cfg, correction, seed=0),
                                                          batch, args.repeats)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    main()
