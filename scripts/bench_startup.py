"""Start-up: seconds from ``rlmix train`` to the end of the first step of the default run.

    .venv/bin/python scripts/bench_startup.py [--repeats 2] [--goal 10] [--out F] [OVERRIDE ...]

Runs the default run (``make train``'s, ``perf_common.DEFAULT_RUN``) as ``rlmix train +experiment=sc_mis
model=embedded_v2 loop.steps=1 logger=disabled`` (six emulated pools plus the trainer: seven actors),
with any overrides after those, ``--repeats`` times and reports, for each, the seconds from launch to the
line of step 1, and to the runner's "Ray and N actors ready" line; the load average is recorded
beside each. Prints one JSON object and the ratio against the goal (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from arguments import at_least
from perf_common import DEFAULT_RUN, load_average, median, run_rlmix, verdict


def one_start(workdir: Path, extra: list[str]) -> dict:
    workdir.mkdir(parents=True)
    load = load_average()
    run = run_rlmix(["train", *DEFAULT_RUN, "loop.steps=1", "logger=disabled",
                     f"hydra.run.dir={workdir / 'run'}", *extra], cwd=workdir)
    ready = run.all(r"Ray and (\d+) actors ready in ([\d.]+)s")
    return {
        "first_step_s": round(run.first(r"step\s+1/1"), 2),
        "pools_logged_s": round(run.first(r"pool \w+: "), 2),  # imports + config composed
        "actors_ready_s": round(ready[0][0], 2) if ready else None,
        "actors": int(ready[0][1].group(1)) if ready else None,
        "wall_s": round(run.wall_s, 2),
        "load_avg_before": load,
        "load_avg_after": load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), default=2)
    parser.add_argument("--goal", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_start(Path(tmp) / str(i), args.overrides) for i in range(args.repeats)]
    result = {"runs": runs, "median_first_step_s": median([r["first_step_s"] for r in runs]), "goal_s": args.goal}
    print(json.dumps(result, indent=2))
    print("start-up to step 1:", verdict(result["median_first_step_s"], args.goal),
          f"(load average {runs[-1]['load_avg_before']})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
