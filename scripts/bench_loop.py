"""The loop against its compute floor, on the default run (``make train``'s: six emulated pools,
sc_mis, the v2 model; ``perf_common.DEFAULT_RUN``).

    .venv/bin/python scripts/bench_loop.py [--steps 12] [--goal 1.15] [--out F] [--override model.embedded_version=v1]

In one run, side by side:

1. The compute floor. In this process, one thread: the requests of one step generated in turn by
   the six pools' samplers (the same tokens the loop generates), then the trainer step on that
   batch (median of 3 after a warm-up). floor = (generation + trainer step) / cores — what a
   perfect overlap of sampling and training on all cores would take per step.
2. The loop as configured by default (threads from the cores Ray reports, rlmix.orchestration.cores).
3. The loop as it was before that plan: trainer 2 threads, every sampler generating at once.

Reports each loop's median ``time/step_s`` over the steps after the first two, its ratio to the
floor, and the mean ``time/trainer_idle_frac``, ``time/sampler_busy_frac``, ``loop/buffered_groups``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from arguments import at_least
from perf_common import DEFAULT_RUN, isolated_step, load_average, median, read_metrics, run_rlmix, verdict

ARM = [*DEFAULT_RUN, "logger=disabled"]
OVERSUBSCRIBED = ["trainer.num_threads=2", "loop.sampler_threads=1", "loop.concurrent_requests=6"]


def compute_floor(extra: list[str]) -> dict:
    """Core-seconds of one step's generation and one trainer step, each alone in this process."""
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.commands.compose import compose_plan

    plan = compose_plan(ARM + extra)
    step = isolated_step(plan.cfg, resolve_model_dir(plan), reps=3)
    cores = os.cpu_count() or 1
    return {"generate_s": round(step["generate_s"], 3), "train_step_s": round(step["train_s"], 3), "cores": cores,
            "tokens": step["tokens"], "floor_s": round((step["generate_s"] + step["train_s"]) / cores, 3)}


def loop_run(workdir: Path, steps: int, extra: list[str]) -> dict:
    workdir.mkdir(parents=True)
    load = load_average()
    run_rlmix(["train", *ARM, f"loop.steps={steps}", f"hydra.run.dir={workdir / 'run'}", *extra], cwd=workdir)
    rows = read_metrics(workdir / "run")[2:]  # the first steps fill the pipeline
    mean = lambda key: round(statistics.fmean(r[key] for r in rows if r.get(key) is not None), 3)  # noqa: E731
    return {
        "overrides": extra,
        "step_s_median": round(median([r["time/step_s"] for r in rows]), 3),
        "step_s_all": [round(r["time/step_s"], 3) for r in rows],
        "trainer_idle_frac": mean("time/trainer_idle_frac"),
        "sampler_busy_frac": mean("time/sampler_busy_frac") if "time/sampler_busy_frac" in rows[0] else None,
        "buffered_groups": mean("loop/buffered_groups") if "loop/buffered_groups" in rows[0] else None,
        "load_avg_before": load,
        "load_avg_after": load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(3), default=12)  # steps 1-2 are dropped
    parser.add_argument("--goal", type=float, default=1.15, help="loop step / compute floor")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--override", action="append", default=[],
                        help="a config override for every arm and the floor, e.g. model.embedded_version=v1 (repeatable)")
    args = parser.parse_args()
    load = load_average()
    floor = compute_floor(args.override) | {"load_avg_before": load, "load_avg_after": load_average()}
    with tempfile.TemporaryDirectory() as tmp:
        planned = loop_run(Path(tmp) / "planned", args.steps, args.override)
        oversubscribed = loop_run(Path(tmp) / "oversubscribed", args.steps, args.override + OVERSUBSCRIBED)
    for arm in (planned, oversubscribed):
        arm["ratio_to_floor"] = round(arm["step_s_median"] / floor["floor_s"], 2)
    result = {"overrides": args.override, "floor": floor, "planned": planned, "oversubscribed": oversubscribed,
              "goal_ratio": args.goal}
    print(json.dumps(result, indent=2))
    for name, arm in (("planned", planned), ("oversubscribed", oversubscribed)):
        print(f"loop step / floor, {name}:", verdict(arm["ratio_to_floor"], args.goal, unit="x"),
              f"(load average {arm['load_avg_before']})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
