"""Ray actors' start with and without a ``runtime_env``, side by side.

    .venv/bin/python scripts/bench_actor_start.py [--rounds 3] [--actors 7]

Each round starts a fresh local Ray instance twice, the two ways alternating: once as rlmix
started its actors before (a job ``runtime_env`` and one per actor, holding a few environment
variables) and once as it does now (none; ``rlmix.orchestration.session``). Each time ``--actors``
bare actors (``num_cpus=0``, as rlmix's) import what a sampler worker imports, and the seconds from
``ray.init``'s return to every actor answering are taken, with the CPU time the whole machine spent
meanwhile (``/proc/stat``: other load counts too, so run it on a quiet machine). Prints one JSON
line per start, then the medians and their ratio (docs/performance.md, Start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from arguments import at_least
from perf_common import load_average, median

ENV = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "RLMIX_BENCH": "1"}}


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, *_ = map(int, f.readline().split()[1:])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def child(variant: str, actors: int) -> dict:
    import ray

    kwargs = {"runtime_env": ENV} if variant == "runtime_env" else {}
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False,
             log_to_driver=False, _system_config={"worker_maximum_startup_concurrency": 64}, **kwargs)
    t1, busy = time.perf_counter(), machine_busy_s()

    @ray.remote(num_cpus=0)
    class Bare:
        def __init__(self):
            import rlmix.orchestration.workers  # noqa: F401  (torch and what a sampler imports)

        def ready(self) -> int:
            return os.getpid()

    handles = [Bare.options(**kwargs).remote() for _ in range(actors)]
    ray.get([h.ready.remote() for h in handles])
    result = {"variant": variant, "init_s": round(t1 - t0, 2), "actors_ready_s": round(time.perf_counter() - t1, 2),
              "machine_cpu_s": round(machine_busy_s() - busy, 1), "load_avg": load_average()}
    ray.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--actors", type=at_least(1), default=7)
    parser.add_argument("--child", choices=("runtime_env", "none"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.actors)))
        return
    runs: dict[str, list[dict]] = {"runtime_env": [], "none": []}
    for r in range(args.rounds):
        for variant in runs:
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--actors", str(args.actors)],
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[variant].append(result)
            print(f"round {r + 1}/{args.rounds}", json.dumps(result), flush=True)
    ready = {v: median([r["actors_ready_s"] for r in rs]) for v, rs in runs.items()}
    cpu = {v: median([r["machine_cpu_s"] for r in rs]) for v, rs in runs.items()}
    print(f"{args.actors} actors ready (median s): runtime_env {ready['runtime_env']}, none {ready['none']} "
          f"({ready['none'] / ready['runtime_env']:.2f}x); machine CPU s: {cpu['runtime_env']} and {cpu['none']}")


if __name__ == "__main__":
    main()
