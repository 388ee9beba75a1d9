"""The trainer step with PyTorch's fused attention backward against rlmix's dense one (rlmix/trainers/attention.py).

    .venv/bin/python scripts/bench_trainer_step.py [--rounds 7] [--threads 1] [--out F] [--override K=V ...]

One step's batch of a run (by default the v2 headline's: ``+experiment=sc_mis model=embedded_v2
fleet=emulated_hetero6 loop.lag=0``, the fp8 KV caches on) is generated as the loop generates it
(scripts/perf_common.py, ``step_batch``). Two torch trainers start from the same weights, on
``--threads`` threads, one per ``trainer.attention_backward``: ``fused`` (transformers' ``sdpa``
with PyTorch's fused CPU backward) and ``dense`` (the default: the same forward, rlmix's dense
fp32 backward). Each round times one step of each, the order alternating, after one warm-up step
each. Prints the median step of each, the median of the per-round ratios dense / fused, and the
load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from arguments import at_least
from perf_common import load_average, median, step_batch
from reproduce import DOSES, HEADLINE

# The headline's dose as scripts/reproduce.py runs it; each trainer below sets its own attention backward.
RUN = ["+experiment=sc_mis", "logger=disabled", *DOSES[HEADLINE]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=at_least(1), default=7)
    parser.add_argument("--threads", type=int, default=1,
                        help="the trainer's threads: 1 as the default run gives it on 2 cores, 2 as a synchronous run")
    parser.add_argument("--override", action="append", default=[], help="a config override (repeatable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.commands.compose import compose_plan
    from rlmix.config.schema import AttentionBackward
    from rlmix.orchestration.workers import TrainerWorker
    from rlmix.trainers.attention import NAME

    plan = compose_plan(RUN + args.override)
    cfg, model_dir = plan.cfg, resolve_model_dir(plan)
    batch, _, correction = step_batch(cfg, model_dir)
    trainers = {name: TrainerWorker(str(model_dir), dataclasses.replace(
                    cfg.trainer, num_threads=args.threads, attention_backward=AttentionBackward(name)),
                    correction, cfg.seed)
                for name in ("fused", "dense")}
    assert trainers["dense"].trainer.model.config._attn_implementation == NAME
    for trainer in trainers.values():
        trainer.train_step(batch)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in trainers}
    load = [load_average()]
    for r in range(args.rounds):
        for name in (("fused", "dense") if r % 2 == 0 else ("dense", "fused")):
            start = time.perf_counter()
            trainers[name].train_step(batch)
            times[name].append(time.perf_counter() - start)
        load.append(load_average())
        print(f"round {r + 1}/{args.rounds}: fused {times['fused'][-1]:.3f} s, dense {times['dense'][-1]:.3f} s",
              flush=True)
    ratios = [d / f for d, f in zip(times["dense"], times["fused"])]
    result = {"overrides": RUN + args.override, "threads": args.threads, "rows": len(batch), "tokens": int(batch.num_tokens),
              "fused_step_s": [round(t, 3) for t in times["fused"]], "dense_step_s": [round(t, 3) for t in times["dense"]],
              "fused_median_s": round(median(times["fused"]), 3), "dense_median_s": round(median(times["dense"]), 3),
              "ratio_median": round(median(ratios), 3), "load_avg": [min(load), max(load)]}
    print(json.dumps(result, indent=2))
    print(f"trainer step, dense backward / fused: {result['ratio_median']:.2f}x (median of {args.rounds} "
          f"rounds; {result['dense_median_s']:.3f} s against {result['fused_median_s']:.3f} s; "
          f"load average {min(load)}-{max(load)})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
