"""Episode throughput with 1 vs N concurrent episodes on the embedded agent model: prefix reuse, continuous batching.

    python scripts/bench_agentic.py                     # throughput only (in-process, no Ray)
    python scripts/bench_agentic.py --repeats 3         # arms interleaved, medians of 3
    python scripts/bench_agentic.py --batching continuous whole --prefix-cache on   # the batching arms
    python scripts/bench_agentic.py --train-steps 3     # also short `rlmix train` runs, one per concurrency
    python scripts/bench_agentic.py --model v2          # the v2 agent model (Qwen3-MoE, byte-level BPE)

Throughput: one torch sampler (bf16 view) and the real local sandbox runtime run the same
``--episodes`` minicode_agent episodes (same problems, same seeds) through
``rlmix.agentic.train.EpisodeRollouts`` with ``concurrent_episodes`` = 1 and N, with the sampler's
prefix cache on and off (``--prefix-cache``), turns batched continuously or in whole calls
(``--batching``: ``task.continuous_batching``), sandbox commands started through prlimit/setpriv or
by forking the sampler process (``--launch``), in one sandbox per episode or one per command
(``--sandbox``: ``task.local_resident``). Reported: episodes/s, policy tokens/s, policy tokens
per decode step, the share of episode wall time spent in the environment, and where generation
time went: prefill (forwards of more than one position: seconds and positions fed) and decode (one
position per row); generating is the time inside sampler calls (whole) or decode-batch joins and
steps (continuous). Single-turn reference: the same sampler serves the episodes' first
prompts as a single-turn request would, all rows in one call, ``max_turn_tokens`` each, three calls
from a cold prefix cache; the ratio is
agentic policy tokens/s (over episode wall time) / single-turn tokens/s, and its ceiling on this
machine, were generation free, the same over the episodes' environment time alone.
Trainer idle fraction: ``time/trainer_idle_frac`` averaged over the steps of a short CLI run (smoke
fleet) per concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from arguments import at_least
from perf_common import verdict


def _timed_forward(sampler) -> dict:
    """Time the sampler's decoder forwards (prefill: more than one position fed; decode) and its
    generation: whole ``generate`` calls, or a decode batch's joins and steps."""
    split = {"generate_s": 0.0, "prefill_s": 0.0, "prefill_positions": 0, "decode_s": 0.0, "decode_steps": 0}
    forward, generate, decode_batch = sampler.model.forward, sampler.generate, sampler.decode_batch

    def timed_call(fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            split["generate_s"] += time.perf_counter() - start
            return out
        return call

    def timed_decode_batch(params):
        batch = decode_batch(params)
        batch.join, batch.step = timed_call(batch.join), timed_call(batch.step)
        return batch

    def timed(ids, *args, **kwargs):
        start = time.perf_counter()
        out = forward(ids, *args, **kwargs)
        kind = "prefill" if ids.shape[1] > 1 else "decode"
        split[f"{kind}_s"] += time.perf_counter() - start
        split["prefill_positions" if kind == "prefill" else "decode_steps"] += ids.numel() if kind == "prefill" else 1
        return out

    sampler.model.forward, sampler.generate, sampler.decode_batch = timed, timed_call(generate), timed_decode_batch
    return split


def throughput(concurrency: int, episodes: int, group_size: int, seed: int, prefix_cache: bool = True,
               model: str = "v1", continuous: bool = True, launch: str = "exec_chain",
               sandbox: str = "resident") -> dict:
    import torch

    from rlmix.agentic.batching import TurnBatcher
    from rlmix.agentic.policy import Message
    from rlmix.agentic.run import system_prompt
    from rlmix.config.swebench import MiniCodeAgentConfig
    from rlmix.agentic.train import EpisodeRollouts
    from rlmix.assembly.parts import EMBEDDED_AGENT_MODELS, make_task
    from rlmix.config.embedded import EmbeddedVersion
    from rlmix.config.schema import ModelConfig
    from rlmix.models.io import load_tokenizer
    from rlmix.rollout import EPISODE_STATS, SamplingParams
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler
    from rlmix.tasks.chat import chat_renderer

    torch.set_num_threads(1)
    model_dir = EMBEDDED_AGENT_MODELS[EmbeddedVersion(model)](ModelConfig(), print)  # what a run builds
    tokenizer = load_tokenizer(model_dir)
    cache = {} if prefix_cache else {"prefix_cache_bytes": 0}
    sampler = TorchSampler(model_dir, resolve_view("CPU", "bf16"), pool="bench", **cache)
    split = _timed_forward(sampler)
    cfg = replace(MiniCodeAgentConfig(), concurrent_episodes=concurrency, continuous_batching=continuous,
                  local_resident=sandbox == "resident")
    task = make_task(cfg, seed)
    sizes: list[int] = []
    original = TurnBatcher.close

    def close(self):  # record the batches each request's batcher served
        original(self)
        sizes.extend(self.batch_sizes)

    TurnBatcher.close = close
    from rlmix.isolation import process

    chain = process._exec_chain_tools
    if launch == "preexec_fn":  # sandbox commands start by forking this process (rlmix/isolation/process.py)
        process._exec_chain_tools = lambda: None
    params = SamplingParams(stop_token_ids=(tokenizer.eos_token_id,), seed=seed)
    groups = episodes // group_size
    problems = tuple(task.sample(groups, seed=seed))
    start = time.perf_counter()
    try:
        out = EpisodeRollouts(cfg, task, tokenizer, "bench")(sampler, problems, tuple(range(groups)), group_size, params)
        wall = time.perf_counter() - start
        agentic_split = dict(split)
        # The single-turn reference: the same first prompts, served as one single-turn request.
        chat, system = chat_renderer(tokenizer), system_prompt(cfg)
        first = [tokenizer.encode(chat.suffix(([Message("system", system)] if system else [])
                                              + [Message("user", task.harbor_task(p).instruction)], 0),
                                  add_special_tokens=False) for p in problems for _ in range(group_size)]
        sampler.prefix_cache.clear()  # the episodes ran these prompts: the reference starts cold
        single_tokens, single_s = 0, 0.0
        for call in range(3):
            single = sampler.generate(first, replace(params, max_new_tokens=cfg.max_turn_tokens, seed=seed + call))
            single_tokens, single_s = single_tokens + int(single.mask.sum()), single_s + single.gen_time_s
            sampler.prefix_cache.clear()
    finally:
        TurnBatcher.close = original
        process._exec_chain_tools = chain
        task.close()
    col = {n: out.episode_stats[:, i] for i, n in enumerate(EPISODE_STATS)}
    policy_tokens_per_s = float(col["policy_tokens"].sum()) / wall
    single_tokens_per_s = single_tokens / single_s
    return {"model": model, "concurrent_episodes": concurrency, "prefix_cache": prefix_cache,
            "batching": "continuous" if continuous else "whole", "launch": launch, "sandbox": sandbox,
            "episodes": len(out), "wall_s": wall,
            "episodes_per_s": len(out) / wall, "policy_tokens_per_s": policy_tokens_per_s,
            "generate_s": agentic_split["generate_s"], "prefill_s": agentic_split["prefill_s"],
            "prefill_positions": agentic_split["prefill_positions"], "decode_s": agentic_split["decode_s"],
            "decode_steps": agentic_split["decode_steps"],
            "tokens_per_decode_step": float(col["policy_tokens"].sum()) / max(agentic_split["decode_steps"], 1),
            "mean_batch": sum(sizes) / max(len(sizes), 1), "sampler_calls": len(sizes),
            "env_time_frac": float(col["env_s"].sum() / col["wall_s"].sum()),
            "reward_mean": float(out.rewards.mean()), "infra_errors": out.infra_errors,
            "single_turn_tokens_per_s": single_tokens_per_s,
            "ratio_to_single_turn": policy_tokens_per_s / single_tokens_per_s,
            # Were generation free, episodes would take their environment time alone: the ratio's ceiling.
            "ratio_if_generation_free": policy_tokens_per_s / max(float(col["env_s"].sum() / col["wall_s"].sum()), 1e-9)
            / single_tokens_per_s}


def idle_fraction(concurrency: int, steps: int) -> dict:
    rlmix = str(Path(sys.executable).with_name("rlmix"))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        args = [rlmix, "train", "+experiment=sc_mis", "task=minicode_agent", "fleet=smoke", f"loop.steps={steps}",
                "loop.groups_per_step=4", "loop.group_size=4", "loop.groups_per_request=2",
                f"task.concurrent_episodes={concurrency}", "logger.wandb.mode=disabled", f"hydra.run.dir={run}"]
        subprocess.run(args, check=True, capture_output=True, text=True, timeout=3600)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    return {"concurrent_episodes": concurrency, "steps": len(rows), "trainer_idle_frac": mean("time/trainer_idle_frac"),
            "step_s": mean("time/step_s"), "reward_mean": mean("reward/mean")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=at_least(1), default=16)
    ap.add_argument("--group-size", type=at_least(1), default=4)
    ap.add_argument("--concurrency", type=at_least(0), nargs="+", default=[1, 8], help="episodes at once (0: all)")
    ap.add_argument("--prefix-cache", choices=["on", "off"], nargs="+", default=["on", "off"])
    ap.add_argument("--batching", choices=["continuous", "whole"], nargs="+", default=["continuous"],
                    help="task.continuous_batching true (continuous) or false (whole calls)")
    ap.add_argument("--launch", choices=["exec_chain", "preexec_fn"], nargs="+", default=["exec_chain"],
                    help="how sandbox commands start: prlimit/setpriv (vfork) or a preexec_fn (fork)")
    ap.add_argument("--sandbox", choices=["resident", "per_command"], nargs="+", default=["resident"],
                    help="task.local_resident true (one sandbox per episode's working copy) or false (one per command)")
    ap.add_argument("--repeats", type=at_least(1), default=1, help="rounds; every arm once per round, interleaved")
    ap.add_argument("--train-steps", type=at_least(0), default=0, help="0 skips the trainer idle-fraction runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--goal", type=float, default=0.5, help="agentic / single-turn policy tokens/s to reach")
    ap.add_argument("--model", choices=["v1", "v2"], default="v1", help="the embedded agent model (model=embedded_v2: v2)")
    args = ap.parse_args()
    arms = [(c, cache == "on", how == "continuous", launch, box) for c in args.concurrency
            for cache in args.prefix_cache for how in args.batching for launch in args.launch for box in args.sandbox]
    runs: dict[tuple, list[dict]] = {arm: [] for arm in arms}
    for _ in range(args.repeats):
        for arm in arms:
            c, cache, continuous, launch, box = arm
            r = throughput(c, args.episodes, args.group_size, args.seed, prefix_cache=cache, model=args.model,
                           continuous=continuous, launch=launch, sandbox=box)
            r["load_avg_1min"] = os.getloadavg()[0]
            print(json.dumps(r), flush=True)
            runs[arm].append(r)
    keys = ("episodes_per_s", "policy_tokens_per_s", "single_turn_tokens_per_s", "ratio_to_single_turn",
            "prefill_s", "decode_s", "generate_s", "env_time_frac", "tokens_per_decode_step")
    print("median of", args.repeats, "| concurrent | prefix cache | batching | launch | sandbox | " + " | ".join(keys))
    name = {True: "continuous", False: "whole"}
    for (c, cache, continuous, launch, box), rs in runs.items():
        print(f"| {c} | {'on' if cache else 'off'} | {name[continuous]} | {launch} | {box} | "
              + " | ".join(f"{statistics.median(r[k] for r in rs):.3g}" for k in keys))
    for (c, cache, continuous, launch, box), rs in runs.items():
        print(f"agentic / single-turn tokens/s, {c} concurrent, prefix cache {'on' if cache else 'off'}, "
              f"{name[continuous]} batching, {launch}, {box} sandbox:",
              verdict(statistics.median(r["ratio_to_single_turn"] for r in rs), args.goal, unit="x", at_least=True),
              f"(median of {len(rs)}, load average {statistics.median(r['load_avg_1min'] for r in rs):.1f}; "
              f"{statistics.median(r['ratio_if_generation_free'] for r in rs):.2f}x were generation free)")
    if args.train_steps:
        for c in args.concurrency:
            print(json.dumps(idle_fraction(c, args.train_steps)))


if __name__ == "__main__":
    main()
