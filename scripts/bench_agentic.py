"""Episode throughput with 1 vs N concurrent episodes on the embedded agent model, and the trainer's idle fraction.

    python scripts/bench_agentic.py                     # throughput only (in-process, no Ray)
    python scripts/bench_agentic.py --train-steps 3     # also short `rlmix train` runs, one per concurrency

Throughput: one torch sampler (bf16 view) and the real local sandbox runtime run the same
``--episodes`` minicode_agent episodes (same problems, same seeds) through
``rlmix.agentic.train.EpisodeRollouts`` with ``concurrent_episodes`` = 1 and N. Reported: episodes/s,
policy tokens/s, the mean batch the sampler served per call, and the share of episode wall time
spent in the environment. Trainer idle fraction: ``time/trainer_idle_frac`` averaged over the steps
of a short CLI run (smoke fleet) per concurrency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def throughput(concurrency: int, episodes: int, group_size: int, seed: int) -> dict:
    import torch

    from rlmix.agentic.batching import TurnBatcher
    from rlmix.config.swebench import MiniCodeAgentConfig
    from rlmix.embedded.minicode_agent.model import build_agent_model
    from rlmix.agentic.train import EpisodeRollouts
    from rlmix.assembly.parts import make_task
    from rlmix.config.embedded import AgentModelSpec
    from rlmix.models.io import load_tokenizer
    from rlmix.rollout import EPISODE_STATS, SamplingParams
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler

    torch.set_num_threads(1)
    model_dir = build_agent_model(AgentModelSpec(), progress=print)
    tokenizer = load_tokenizer(model_dir)
    sampler = TorchSampler(model_dir, resolve_view("CPU", "bf16"), pool="bench")
    cfg = replace(MiniCodeAgentConfig(), concurrent_episodes=concurrency)
    task = make_task(cfg, seed)
    sizes: list[int] = []
    original = TurnBatcher.close

    def close(self):  # record the batches each request's batcher served
        original(self)
        sizes.extend(self.batch_sizes)

    TurnBatcher.close = close
    params = SamplingParams(stop_token_ids=(tokenizer.eos_token_id,), seed=seed)
    groups = episodes // group_size
    start = time.perf_counter()
    try:
        out = EpisodeRollouts(cfg, task, tokenizer, "bench")(
            sampler, tuple(task.sample(groups, seed=seed)), tuple(range(groups)), group_size, params)
    finally:
        TurnBatcher.close = original
        task.close()
    wall = time.perf_counter() - start
    col = {n: out.episode_stats[:, i] for i, n in enumerate(EPISODE_STATS)}
    return {"concurrent_episodes": concurrency, "episodes": len(out), "wall_s": wall,
            "episodes_per_s": len(out) / wall, "policy_tokens_per_s": float(col["policy_tokens"].sum()) / wall,
            "mean_batch": sum(sizes) / max(len(sizes), 1), "sampler_calls": len(sizes),
            "env_time_frac": float(col["env_s"].sum() / col["wall_s"].sum()),
            "reward_mean": float(out.rewards.mean()), "infra_errors": out.infra_errors}


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
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--train-steps", type=int, default=0, help="0 skips the trainer idle-fraction runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results = [throughput(c, args.episodes, args.group_size, args.seed) for c in args.concurrency]
    for r in results:
        print(json.dumps(r))
    base = results[0]["episodes_per_s"]
    for r in results[1:]:
        print(f"speed-up {r['concurrent_episodes']} vs {results[0]['concurrent_episodes']} concurrent: "
              f"{r['episodes_per_s'] / base:.2f}x")
    if args.train_steps:
        for c in args.concurrency:
            print(json.dumps(idle_fraction(c, args.train_steps)))


if __name__ == "__main__":
    main()
