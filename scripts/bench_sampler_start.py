"""One sampler actor's start-up, in fresh processes: its imports, then its first and second torch sampler.

    .venv/bin/python scripts/bench_sampler_start.py [--repeats 3] [--model-dir DIR]

Each repeat is a new interpreter that imports what a ``SamplerWorker`` imports, builds a torch
sampler on the default run's model (the embedded one unless ``--model-dir``) with its tokenizer,
then a second one. Prints wall and CPU seconds of each part, whether ``transformers`` was imported,
and the load average, one JSON line per repeat (docs/performance.md, Start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from arguments import at_least, existing


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(model_dir: str) -> dict:
    t0, c0 = time.perf_counter(), _cpu()
    import rlmix.orchestration.workers  # noqa: F401  (what the actor process imports)
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler

    t1, c1 = time.perf_counter(), _cpu()
    TorchSampler(model_dir, resolve_view("H100", "fp8_e4m3"), "first")
    load_fast_tokenizer(model_dir)
    t2, c2 = time.perf_counter(), _cpu()
    TorchSampler(model_dir, resolve_view("H100", "fp8_e4m3"), "second")
    t3 = time.perf_counter()
    return {"imports_s": round(t1 - t0, 2), "imports_cpu_s": round(c1 - c0, 2),
            "first_sampler_s": round(t2 - t1, 2), "first_sampler_cpu_s": round(c2 - c1, 2),
            "second_sampler_s": round(t3 - t2, 3), "transformers_imported": "transformers" in sys.modules,
            "load_avg": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--model-dir", type=existing("directory"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    model_dir = args.model_dir
    if model_dir is None:  # here, not in the child: resolving it imports more than an actor does
        from rlmix.config.embedded import EmbeddedModelSpec
        from rlmix.embedded.model import build_embedded_model

        model_dir = str(build_embedded_model(EmbeddedModelSpec()))
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, "--child", model_dir], capture_output=True, text=True, check=True)
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
