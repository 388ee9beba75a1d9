"""A sampler's weight load: what a request pays when the trainer has published new weights since.

    .venv/bin/python scripts/bench_weight_load.py [--model v2|v1] [--model-dir DIR] [--repeats 9]

With weights published every step, a sampler whose next request comes after a trainer step first
loads that step's weights, quantising every matrix by its pool's view (``rlmix.orchestration.loop``:
weights travel with a request when the sampler holds another version). For each pool of the default
fleet (``conf/fleet/emulated_hetero6.yaml``) this prints the median seconds of
``TorchSampler.load_weights`` beside the median of one default-sized request's generation (2 minicode
prompts, encoded without the chat template, x 8 samples, 24 new tokens, K = 128 recorded), both on
one thread, with the load average: the load's
share of a request is its cost in the loop (docs/performance.md, "The loop against its floor").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from arguments import at_least, existing
from perf_common import load_average

ROOT = Path(__file__).resolve().parents[1]


def model_dir(which: str) -> str:
    if which == "v1":
        from rlmix.config.embedded import EmbeddedModelSpec
        from rlmix.embedded.model import build_embedded_model

        return str(build_embedded_model(EmbeddedModelSpec(), progress=print))
    from rlmix.config.embedded import EmbeddedMoeSpec
    from rlmix.embedded.v2.model import build_v2_model

    return str(build_v2_model(EmbeddedMoeSpec(), progress=print))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("v2", "v1"), default="v2")
    parser.add_argument("--model-dir", type=existing("directory"), help="any HF causal-LM directory instead of the embedded model")
    parser.add_argument("--repeats", type=at_least(1), default=9)
    args = parser.parse_args()
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from rlmix.embedded.minicode import MiniCode
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.rollout import SamplingParams
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler

    torch.set_num_threads(1)
    path = args.model_dir or model_dir(args.model)
    weights = load_file(str(Path(path) / "model.safetensors"))
    tokenizer = load_fast_tokenizer(path)
    prompts = [tokenizer.encode(p.prompt) for p in MiniCode().sample(2, seed=0)] * 8
    params = SamplingParams(max_new_tokens=24, num_candidates=128)
    pools = OmegaConf.load(ROOT / "conf" / "fleet" / "emulated_hetero6.yaml").pools
    for name, pool in pools.items():
        sampler = TorchSampler(path, resolve_view(pool.accelerator, pool.precision), name)
        loads, generations = [], []
        for r in range(args.repeats):
            start = time.perf_counter()
            sampler.load_weights(weights, r)
            loads.append(time.perf_counter() - start)
            start = time.perf_counter()
            sampler.generate(prompts, dataclasses.replace(params, seed=r))
            generations.append(time.perf_counter() - start)
        load, generate = statistics.median(loads), statistics.median(generations)
        print(json.dumps({"pool": name, "load_ms": round(1000 * load, 1), "request_ms": round(1000 * generate, 1),
                          "load_share": round(load / (load + generate), 3),
                          "load_avg": load_average()}), flush=True)


if __name__ == "__main__":
    main()
