"""Cost of the correction: forward+backward of `token_loss` for sc_mis (top-K head) vs none.

Both modes run on the same batch in one process, interleaved (alternating which goes first),
several repetitions; prints the absolute median times and the median of the per-repetition
ratios sc_mis / none (docs/architecture.md target: ≤ 1.10), for wall-clock time and for this
process's CPU time (the latter is the steadier number on a shared machine).

    .venv/bin/python scripts/bench_correction.py                 # N=4096, V=32768, K=128, fp32, CPU
    .venv/bin/python scripts/bench_correction.py --tokens 1024 --reps 5
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench_correction.py   # on an oversubscribed machine

The SC work is ~20 small (N, K) elementwise ops. On a machine with more runnable threads than
cores, each parallel op can wait a scheduler slice for its second OpenMP thread (spinning,
which also counts as CPU time); that inflates the sc_mis side far beyond its arithmetic.
`--threads 1` or `OMP_WAIT_POLICY=PASSIVE` measure the arithmetic cost.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from rlmix.correction import token_loss
from arguments import at_least


def make_batch(n: int, v: int, k: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Trainer logits and a sampler record with a realistic mismatch (perturbed logits)."""
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(n, v, generator=gen)
    sampler_logp = torch.log_softmax(logits + 0.05 * torch.randn(n, v, generator=gen), dim=1)
    head_logprobs, head_ids = torch.topk(sampler_logp, k, dim=1)
    sampled = torch.multinomial(sampler_logp.exp(), 1, generator=gen)[:, 0]
    return dict(
        logits=logits,
        sampled_ids=sampled,
        sampler_logprobs=sampler_logp.gather(1, sampled[:, None])[:, 0],
        advantages=torch.randn(n, generator=gen),
        head_ids=head_ids,
        head_logprobs=head_logprobs,
    )


def time_once(batch: dict[str, torch.Tensor], mode: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one forward+backward."""
    logits = batch["logits"].clone().requires_grad_(True)  # clone outside the timed region
    head = dict(head_ids=batch["head_ids"], head_logprobs=batch["head_logprobs"]) if mode != "none" else {}
    wall, cpu = time.perf_counter(), time.process_time()
    out = token_loss(logits, batch["sampled_ids"], batch["sampler_logprobs"], batch["advantages"], mode=mode, **head)
    out.loss.backward()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=at_least(1), default=4096)
    parser.add_argument("--vocab", type=at_least(1), default=32768)
    parser.add_argument("--head", type=at_least(1), default=128)
    parser.add_argument("--reps", type=at_least(1), default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = make_batch(args.tokens, args.vocab, args.head)
    for mode in ("none", "sc_mis"):  # warm-up: allocator and kernels
        time_once(batch, mode)
    modes = ("none", "sc_mis")
    times: dict[tuple[str, str], list[float]] = {(m, c): [] for m in modes for c in ("wall", "cpu")}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for rep in range(args.reps):
        order = modes if rep % 2 == 0 else modes[::-1]
        pair = {mode: time_once(batch, mode) for mode in order}
        for i, clock in enumerate(("wall", "cpu")):
            for mode in modes:
                times[mode, clock].append(pair[mode][i])
            ratios[clock].append(pair["sc_mis"][i] / pair["none"][i])
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), load average {os.getloadavg()[0]:.1f}; "
          f"N={args.tokens} V={args.vocab} K={args.head} fp32, {args.reps} reps")
    for clock in ("wall", "cpu"):
        for mode in modes:
            ts = times[mode, clock]
            print(f"{clock:>4} {mode:>7}: median {statistics.median(ts) * 1e3:8.1f} ms"
                  f"  (min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})")
        ratio = statistics.median(ratios[clock])
        print(f"{clock:>4} median ratio sc_mis / none: {ratio:.3f}  (target <= 1.10: {'ok' if ratio <= 1.10 else 'MISSED'})")

if __name__ == "__main__":
    main()
