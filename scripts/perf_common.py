"""Shared by the performance benchmarks (scripts/bench_startup.py, bench_actor_start.py, bench_loop.py,
bench_sweep.py, bench_scaling.py, bench_peer.py, bench_weight_load.py, bench_trainer_step.py,
bench_transport.py).

Each runs the real ``rlmix`` command in a subprocess, stamps every line it prints with the time
since launch, and records the machine's load average beside each number: on a shared machine the
absolute seconds move with the load, ratios measured side by side in one run much less.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RLMIX = str(Path(sys.executable).with_name("rlmix"))
# The default run, as `make train` starts it (the Makefile's train target): the start-up and loop
# goals are about this run, so their benchmarks run it unless told otherwise.
DEFAULT_RUN = ("+experiment=sc_mis", "model=embedded_v2")
# The benchmarks' own in-process model loads: no per-load progress bars in their output.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass
class Launch:
    lines: list[tuple[float, str]]  # (seconds since launch, line)
    wall_s: float
    returncode: int

    def first(self, pattern: str) -> float | None:
        """Seconds from launch to the first line matching ``pattern``."""
        rx = re.compile(pattern)
        return next((t for t, line in self.lines if rx.search(line)), None)

    def all(self, pattern: str) -> list[tuple[float, re.Match]]:
        rx = re.compile(pattern)
        return [(t, m) for t, line in self.lines if (m := rx.search(line))]


def run_stamped(argv: list[str], cwd: Path, timeout: float = 1800, env: dict | None = None) -> Launch:
    """``argv`` with every output line time-stamped; raises with its tail if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ if env is None else env)
    lines = []
    for line in proc.stdout:
        lines.append((time.perf_counter() - start, line.rstrip("\n")))
    code = proc.wait(timeout=timeout)
    launch = Launch(lines, time.perf_counter() - start, code)
    if code != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise RuntimeError(f"{Path(argv[0]).name} {' '.join(argv[1:])} failed ({code}):\n{tail}")
    return launch


def run_rlmix(args: list[str], cwd: Path, timeout: float = 1800) -> Launch:
    """``rlmix <args>`` with every output line time-stamped; raises with its tail if it fails."""
    return run_stamped([RLMIX, *args], cwd, timeout, env=os.environ | {"WANDB_MODE": "disabled"})


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def verdict(value: float, goal: float, unit: str = "s", at_least: bool = False) -> str:
    """``value`` against a goal it must stay under (or, ``at_least``, reach)."""
    met = value >= goal if at_least else value <= goal
    bound = ">= " if at_least else ""
    return f"{value:.2f}{unit} vs goal {bound}{goal:.2f}{unit}: ratio {value / goal:.2f} ({'met' if met else 'NOT met'})"


def isolated_step(cfg, model_dir: Path, *, stop: bool = True, random_rewards: bool = False, reps: int = 3) -> dict:
    """One step's compute with nothing else running, in this process on one thread.

    The step's batch is generated as ``step_batch`` does, then the trainer trains on it: one
    warm-up step, then ``reps`` timed ones. Returns ``generate_s``, ``train_s`` (median),
    ``tokens`` and ``rows`` of the batch.
    """
    from rlmix.orchestration.workers import TrainerWorker

    batch, generate_s, correction = step_batch(cfg, model_dir, stop=stop, random_rewards=random_rewards)
    cfg.trainer.num_threads = 1
    trainer = TrainerWorker(str(model_dir), cfg.trainer, correction, cfg.seed)
    times = step_times(trainer, batch, reps)
    return {"generate_s": generate_s, "train_s": median(times), "tokens": int(batch.num_tokens), "rows": len(batch)}


def step_batch(cfg, model_dir: Path, *, stop: bool = True, random_rewards: bool = False):
    """(batch, generate_s, correction): one step's batch of the run ``cfg``, on one thread.

    The step's requests are generated in turn by the fleet's samplers (the tokens the loop would
    generate), after one untimed warm-up request each. ``stop=False`` empties every sampler's stop
    tokens so completions run to ``loop.max_new_tokens``; ``random_rewards`` draws one reward per
    sequence so no group is constant.
    """
    import dataclasses

    import torch

    from rlmix.assembly.fleet import resolve_fleet
    from rlmix.assembly.parts import make_task
    from rlmix.assembly.plan import plan_run
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.orchestration.workers import SamplerWorker, make_request
    from rlmix.rollout import concat_rollouts
    from rlmix.seeds import derive_seed

    torch.set_num_threads(1)
    plan = plan_run(cfg)
    tokenizer = load_fast_tokenizer(model_dir)
    specs = resolve_fleet(plan, tokenizer.eos_token_id)
    if not stop:
        specs = [dataclasses.replace(s, params=dataclasses.replace(s.params, stop_token_ids=())) for s in specs]
    samplers = [SamplerWorker(s, str(model_dir), plan.task, derive_seed(cfg.seed, s.name), 1) for s in specs]
    task, loop = make_task(cfg.task, cfg.seed), cfg.loop
    requests = [make_request(task, i, loop.groups_per_request, cfg.seed)
                for i in range(loop.groups_per_step // loop.groups_per_request)]
    for sampler in samplers:  # warm-up: each sampler's first call pays one-time costs
        sampler.generate(requests[0], loop.group_size, None, 0)
    start = time.perf_counter()
    parts = [samplers[i % len(samplers)].generate(r, loop.group_size, None, 0) for i, r in enumerate(requests)]
    generate_s = time.perf_counter() - start
    batch = concat_rollouts(parts, tokenizer.pad_token_id)
    if random_rewards:
        batch = batch.replace(rewards=torch.rand(len(batch), generator=torch.Generator().manual_seed(0)))
    return batch, generate_s, plan.correction


def step_times(trainer, batch, reps: int) -> list[float]:
    """Seconds of each of ``reps`` trainer steps on ``batch``, after one untimed warm-up step."""
    trainer.train_step(batch)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        trainer.train_step(batch)
        times.append(time.perf_counter() - start)
    return times
