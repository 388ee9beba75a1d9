"""Peak memory and time of the trainer's log-prob path: dense (N, V) logits vs the chunked lm head.

One fresh subprocess per (vocabulary, path): it builds a tiny Llama with that vocabulary and a batch
of B rows × T completion tokens (sc_mis, a K = 128 head), runs `batch_loss` forward and backward
once for memory, then `--reps` more times for time. Memory is the process's peak resident set
(`getrusage` high-water mark) minus its resident set just before the call, so it counts everything
the loss allocates: activations, logits, gradients. Printed per configuration:

    B/(N·V)      peak bytes per token × vocabulary entry (one fp32 (N, V) copy is 4.0)
    vs goal      that peak over the goal, half an fp32 (N, V) copy (≤ 1.00 meets it)
    us/token     median wall time of forward + backward per token, and its ratio to dense

    .venv/bin/python scripts/bench_memory.py                       # V = 32,000 and 152,064, N = 4,096
    .venv/bin/python scripts/bench_memory.py --vocab 32000 --reps 5

The dense path's peak grows as 18 B × N × V, so at a large vocabulary it runs on fewer rows
(`--dense-max-gib`); bytes per token × vocabulary entry do not depend on N, which the printed N shows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from arguments import at_least

DENSE_BYTES_PER_ENTRY = 18  # measured: what the dense path holds at peak, per token × vocabulary entry


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def child(args: argparse.Namespace) -> dict:
    """Run in a fresh process: one configuration, memory first, then time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig
    from rlmix.correction import CorrectionMode
    from rlmix.rollout import Rollouts
    from rlmix.trainers import lm_head
    from rlmix.trainers.loss import batch_loss

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    v, b, t, p, k = args.vocab[0], args.rows, args.tokens, args.prompt, args.heads
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=v, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=p + t, tie_word_embeddings=False,
    )).float()
    path, why = lm_head.head_path(model)
    if args.path == "dense":  # the old path on the same model: what an unchunkable output layer gets
        lm_head.head_path = lambda _model: (lm_head.HeadPath.dense, "benchmark reference")
        path, why = lm_head.HeadPath.dense, "benchmark reference"
    g = torch.Generator().manual_seed(1)
    head_logprobs, _ = torch.sort(-torch.rand(b, t, k, generator=g) * 10, dim=-1, descending=True)
    batch = Rollouts(
        prompt_ids=torch.randint(1, v, (b, p), generator=g), prompt_lens=torch.full((b,), p),
        completion_ids=torch.randint(1, v, (b, t), generator=g), mask=torch.ones(b, t, dtype=torch.bool),
        sampler_logprobs=-torch.rand(b, t, generator=g) * 5, policy_version=torch.zeros(b, dtype=torch.long),
        pool=("p",) * b, finish_reason=("length",) * b, temperature=0.9,
        head_ids=torch.randint(0, v, (b, t, k), generator=g), head_logprobs=head_logprobs,
    )
    cfg = resolve_correction(CorrectionConfig(mode=CorrectionMode.sc_mis, num_candidates=k, replay_support=False))
    advantages = torch.randn(b, generator=g)
    n = batch.num_tokens

    def step() -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        out = batch_loss(model, batch, advantages, cfg, num_tokens=n, pad_id=0,
                         autocast=torch.bfloat16 if args.bf16 else None)
        out.loss.backward()
        return time.perf_counter() - start

    before, high_before = _rss_bytes(), _peak_rss_bytes()
    first = step()
    peak = _peak_rss_bytes() - before
    times = [step() for _ in range(args.reps)] or [first]
    return dict(vocab=v, path=path.value, why=why, tokens=n, peak_bytes=peak,
                peak_trustworthy=_peak_rss_bytes() > high_before, step_s=statistics.median(times))


def run_child(args: argparse.Namespace, vocab: int, path: str, rows: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--path", path, "--vocab", str(vocab), "--rows", str(rows),
           "--tokens", str(args.tokens), "--prompt", str(args.prompt), "--heads", str(args.heads),
           "--hidden", str(args.hidden), "--reps", str(args.reps), "--threads", str(args.threads)]
    cmd += ["--bf16"] if args.bf16 else []
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{path} at V={vocab} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064])
    parser.add_argument("--rows", type=int, default=4, help="B: completions per batch")
    parser.add_argument("--tokens", type=int, default=1024, help="T: completion tokens per row (all generated)")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--heads", type=int, default=128, help="K: head candidates per token (sc_mis)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--reps", type=at_least(1), default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="BF16 autocast as in training (default fp32)")
    parser.add_argument("--dense-max-gib", type=float, default=4.0,
                        help="run the dense path on fewer rows when its expected peak exceeds this")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=["dense", "chunked"], default="chunked", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    print(f"B={args.rows} T={args.tokens} K={args.heads} d={args.hidden} {'bf16' if args.bf16 else 'fp32'}, "
          f"{args.threads} threads, median of {args.reps}; one process per row")
    print(f"{'V':>8} {'path':>8} {'N':>6} {'peak MiB':>9} {'B/(N·V)':>8} {'vs goal':>8} {'us/token':>9} {'vs dense':>9}")
    for vocab in args.vocab:
        per_row = DENSE_BYTES_PER_ENTRY * args.tokens * vocab
        dense_rows = max(1, min(args.rows, int(args.dense_max_gib * 2**30 // per_row)))
        results = {path: run_child(args, vocab, path, rows)
                   for path, rows in (("dense", dense_rows), ("chunked", args.rows))}
        dense_us = 1e6 * results["dense"]["step_s"] / results["dense"]["tokens"]
        for path, r in results.items():
            per_entry = r["peak_bytes"] / (r["tokens"] * vocab)
            us = 1e6 * r["step_s"] / r["tokens"]
            flag = "" if r["peak_trustworthy"] else "  (peak below set-up's: a lower bound)"
            print(f"{vocab:>8} {r['path']:>8} {r['tokens']:>6} {r['peak_bytes'] / 2**20:>9.0f} {per_entry:>8.2f} "
                  f"{per_entry / 2.0:>8.2f} {us:>9.2f} {us / dense_us:>8.2f}x{flag}")


if __name__ == "__main__":
    main()
