"""What a hand-off between processes costs: one request's rollouts and one step's published weights.

    .venv/bin/python scripts/bench_transport.py [--repeats 41]

Every step of the loop moves each request's ``Rollouts`` from a sampler to the driver, the batch
from the driver to the trainer, and the trainer's published weights to every sampler that serves
the next step, each through Ray's object store. This times ``ray.put`` (the sender's side) and
``ray.get`` (the receiver's) of the default run's objects, packed as ``rlmix.transport`` packs them
(one buffer) and tensor by tensor (how they travelled before, kept here as the baseline), the two
interleaved, medians: a real request's rows (the h100_fp8 pool's view of the embedded v2 model, 2
minicode prompts x 8 samples, 24 new tokens, K = 128 recorded, routed experts) and the v2 model's
weights at the trainer's published 16-bit dtype. Prints one JSON line per object with the load
average (docs/performance.md, "The loop").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from bench_weight_load import model_dir
from arguments import at_least
from perf_common import load_average


def timed(ray, obj) -> tuple[float, float]:
    start = time.perf_counter()
    ref = ray.put(obj)
    put = time.perf_counter()
    ray.get(ref)
    return put - start, time.perf_counter() - put


def compare(ray, name: str, packed, plain, repeats: int) -> None:
    times: dict[str, list[tuple[float, float]]] = {"packed": [], "plain": []}
    for _ in range(repeats):
        times["packed"].append(timed(ray, packed))
        times["plain"].append(timed(ray, plain))
    med = {arm: [statistics.median(t[i] for t in rows) * 1000 for i in (0, 1)] for arm, rows in times.items()}
    print(json.dumps({
        "object": name,
        "put_ms": {arm: round(m[0], 2) for arm, m in med.items()},
        "get_ms": {arm: round(m[1], 2) for arm, m in med.items()},
        "get_ratio": round(med["packed"][1] / med["plain"][1], 2),
        "put_ratio": round(med["packed"][0] / med["plain"][0], 2),
        "load_avg": load_average(),
    }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), default=41)
    args = parser.parse_args()
    import ray
    from safetensors.torch import load_file

    from rlmix.embedded.minicode import MiniCode
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.rollout import SamplingParams
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler
    from rlmix.transport import TensorDict

    torch.set_num_threads(1)
    path = model_dir("v2")
    tokenizer = load_fast_tokenizer(path)
    sampler = TorchSampler(path, resolve_view("H100", "fp8_e4m3"), "h100_fp8")
    prompts = [tokenizer.encode(p.prompt) for p in MiniCode().sample(2, seed=0)] * 8
    rows = sampler.generate(prompts, SamplingParams(max_new_tokens=24, num_candidates=128, seed=0))
    fields = {f.name: getattr(rows, f.name) for f in dataclasses.fields(rows)}  # tensor by tensor
    weights = {name: w.to(torch.bfloat16) for name, w in load_file(str(Path(path) / "model.safetensors")).items()}

    ray.init(num_cpus=1, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        compare(ray, f"rollouts ({len(rows)} rows, {sum(isinstance(v, torch.Tensor) for v in fields.values())} "
                     "tensors)", rows, fields, args.repeats)
        compare(ray, f"weights ({len(weights)} tensors)", TensorDict(weights), weights, args.repeats)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
