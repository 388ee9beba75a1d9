"""Per-job overhead of a sweep: what each job of ``rlmix train -m +experiment=smoke`` costs beyond its steps.

    .venv/bin/python scripts/bench_sweep.py [--goal 2] [--out F]

Two sweeps of four smoke jobs (two steps each) with Hydra's basic launcher, in one process:

- ``trainer``: correction=mis,tis x trainer.lr=3e-4,1e-4 — the samplers' arguments never change,
  so every job after the first reuses Ray and all actor processes (rlmix.orchestration.session);
- ``seeds``: seed=0,1,2,3 — each job's samplers get new seeds; their processes are reused too,
  re-initialised with the new arguments (a sampler Ray restarts from an earlier job's arguments is
  re-initialised again before it serves: rlmix.orchestration.session).

A job's overhead = (start of the next job − its own start, from Hydra's "#k :" lines) − the sum of
its ``time/step_s``. The first job pays Ray's start and every actor's; the goal is for the others.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from perf_common import load_average, read_metrics, run_rlmix, verdict

SWEEPS = {
    "trainer": ["correction=mis,tis", "trainer.lr=3e-4,1e-4"],
    "seeds": ["seed=0,1,2,3"],
}


def sweep(workdir: Path, overrides: list[str]) -> dict:
    workdir.mkdir(parents=True)
    load = load_average()
    out = workdir / "sweep"
    run = run_rlmix(["train", "-m", "+experiment=smoke", "loop.steps=2", "logger=disabled",
                     f"hydra.sweep.dir={out}", *overrides], cwd=workdir)
    starts = [t for t, _ in run.all(r"\[HYDRA\]\s+#\d+ : ")]
    runs = sorted((p.parent for p in out.glob("*/metrics.jsonl")), key=lambda p: int(p.name.split("_")[0]))
    overheads = []
    for i, run_dir in enumerate(runs[:-1]):
        steps_s = sum(r["time/step_s"] for r in read_metrics(run_dir))
        overheads.append(round(starts[i + 1] - starts[i] - steps_s, 2))
    warm = overheads[1:]
    return {"overrides": overrides, "jobs": len(runs), "overhead_s": overheads,
            "first_job_overhead_s": overheads[0], "warm_job_overhead_s": round(sum(warm) / len(warm), 2),
            "wall_s": round(run.wall_s, 2), "load_avg_before": load, "load_avg_after": load_average()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goal", type=float, default=2.0, help="seconds of overhead per job")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {name: sweep(Path(tmp) / name, o) for name, o in SWEEPS.items()} | {"goal_s": args.goal}
    print(json.dumps(result, indent=2))
    for name in SWEEPS:
        arm = result[name]
        print(f"per-job overhead, {name} sweep: first job {arm['first_job_overhead_s']:.2f}s; later jobs",
              verdict(arm["warm_job_overhead_s"], args.goal), f"(load average {arm['load_avg_before']})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
