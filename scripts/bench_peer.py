"""rlmix against TRL on the same workload (``make bench-peer``; docs/performance.md, "Against TRL").

    .venv/bin/python scripts/bench_peer.py [--repeats 3] [--steps 12] [--peer-python .venv-peer/bin/python]
                                           [--out F]

The workload (scripts/peer_workload.py, built once): a random tiny Qwen3 with a BPE tokenizer and
a ChatML template, arithmetic prompts, and one reward both trainers call (scripts/peer_reward.py);
16 prompts × 8 samples per step, at most 24 new tokens, ``--steps`` steps. TRL is its
``GRPOTrainer`` on the CPU (scripts/peer_trl.py, in its own environment .venv-peer/, built by
``make bench-peer`` from requirements/peer.lock). rlmix is ``rlmix train`` on the same files, its
default run otherwise, in three arms:

- ``one_pool``: only the default fleet's first pool (h100_fp8), the other five removed;
- ``six_pools``: the default fleet (emulated_hetero6): the default run;
- ``synchronous``: the default fleet with ``loop.max_staleness=0``.

Each round runs TRL, then the three arms, in that order; ``--repeats`` rounds. The machine's
speed drifts over minutes, so each arm's ratios are taken against TRL of the same round, and the
median over rounds is reported. Per run:

- step time: the median over steps 2..N of the wall time between two ends of a trainer step,
  measured inside the process (rlmix: ``time/step_s`` of metrics.jsonl; TRL: between two
  ``on_step_end`` callbacks);
- the fastest step (steps 2..N), beside it: a step the machine's other work slowed is longer, never
  shorter, and TRL's two-threaded steps slow far more than rlmix's one-threaded processes when
  something else takes a core (up to 30 × in one run), so under load the two statistics disagree;
- time to step 1: launch to the line the process prints at the end of step 1 (rlmix's progress
  line, TRL's callback), both stamped the same way here (scripts/perf_common.py).

The load average is recorded before and after each run. Prints one JSON object, then each arm's
ratios beside the goals: default run step ≤ 0.8 × TRL's, synchronous step ≤ 1.0 ×, time to step
1 ≤ 1.5 × (every arm).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from rlmix.machine import cpu_model
from rlmix.metrics.names import STALENESS_MAX

from peer_workload import MODEL, Workload, build_workload
from arguments import at_least
from perf_common import load_average, median, read_metrics, run_rlmix, run_stamped, verdict

ROOT = Path(__file__).resolve().parents[1]
GROUPS, GROUP_SIZE, MAX_NEW_TOKENS = 16, 8, 24
DEFAULT_POOLS = ("h100_fp8", "h200_fp8", "b200_nvfp4", "b300_nvfp4", "a100_bf16", "rtxpro6000_bf16")
ARMS = {
    "one_pool": [f"~fleet.pools.{p}" for p in DEFAULT_POOLS[1:]],
    "six_pools": [],
    "synchronous": ["loop.max_staleness=0"],
}
# (arm, measure) -> the most its ratio to TRL's may be; an arm without a step goal reports its ratio alone.
GOALS = {("six_pools", "step"): 0.8, ("synchronous", "step"): 1.0,
         **{(arm, "first_step"): 1.5 for arm in ARMS}}


def loop_overrides(steps: int) -> list[str]:
    """The loop both trainers run: the step's size, the length, the steps; no checkpoint before the end."""
    return [f"loop.groups_per_step={GROUPS}", f"loop.group_size={GROUP_SIZE}", f"loop.max_new_tokens={MAX_NEW_TOKENS}",
            f"loop.steps={steps}", "loop.checkpoint_every=0", "loop.checkpoint_every_min=0", "logger=disabled"]


def trl_run(workload: Workload, peer_python: Path, steps: int) -> dict:
    load = load_average()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    argv = [str(peer_python), str(ROOT / "scripts" / "peer_trl.py"), f"--workload={workload.root}",
            f"--steps={steps}", f"--groups={GROUPS}", f"--group-size={GROUP_SIZE}",
            f"--max-new-tokens={MAX_NEW_TOKENS}"]
    run = run_stamped(argv, cwd=workload.root, env=env)
    report = json.loads(next(line for _, line in reversed(run.lines) if line.startswith("{\"")))
    expected = [GROUPS * GROUP_SIZE] * steps
    if report["completions_per_step"] != expected:
        raise RuntimeError(f"TRL scored {report['completions_per_step']} completions per step, not {expected}")
    return {
        "step_s_median": round(median(report["step_s"]), 3),
        "step_s_min": min(report["step_s"]),
        "first_step_s": round(run.first(r"peer step 1/"), 2),
        "first_step_in_process_s": report["first_step_s"],  # from the process's creation, imports included
        "step_s_all": report["step_s"],
        "versions": report["versions"],
        "threads": report["threads"],
        "wall_s": round(run.wall_s, 2),
        "load_avg_before": load,
        "load_avg_after": load_average(),
    }


def rlmix_run(workload: Workload, workdir: Path, steps: int, arm: list[str]) -> dict:
    workdir.mkdir(parents=True)
    load = load_average()
    run = run_rlmix(["train", *workload.rlmix_overrides(), *loop_overrides(steps), *arm,
                     f"hydra.run.dir={workdir / 'run'}"], cwd=workload.root)
    rows = read_metrics(workdir / "run")
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), [r["step"] for r in rows]
    step_s = [round(r["time/step_s"], 3) for r in rows[1:]]
    ready = run.all(r"Ray and (\d+) actors ready in ([\d.]+)s")
    return {
        "overrides": arm,
        "step_s_median": round(median(step_s), 3),
        "step_s_min": min(step_s),
        "first_step_s": round(run.first(rf"step\s+1/{steps}\b"), 2),
        "actors_ready_s": round(ready[0][0], 2) if ready else None,
        "actors": int(ready[0][1].group(1)) if ready else None,
        "step_s_all": step_s,
        "staleness_max": max(r.get(STALENESS_MAX, 0) for r in rows),  # synchronous: 0
        "wall_s": round(run.wall_s, 2),
        "load_avg_before": load,
        "load_avg_after": load_average(),
    }


def progress(index: int, name: str, run: dict) -> None:
    print(f"round {index + 1} {name}: step {run['step_s_median']:.3f}s, step 1 at {run['first_step_s']:.2f}s "
          f"(load average {run['load_avg_before']} -> {run['load_avg_after']})", file=sys.stderr, flush=True)


def one_round(workload: Workload, tmp: Path, index: int, peer_python: Path, steps: int) -> dict:
    trl = trl_run(workload, peer_python, steps)
    progress(index, "trl", trl)
    result = {"trl": trl}
    for name, arm in ARMS.items():
        run = rlmix_run(workload, tmp / f"round{index}_{name}", steps, arm)
        run["step_ratio"] = round(run["step_s_median"] / trl["step_s_median"], 3)
        run["step_min_ratio"] = round(run["step_s_min"] / trl["step_s_min"], 3)
        run["first_step_ratio"] = round(run["first_step_s"] / trl["first_step_s"], 3)
        progress(index, name, run)
        result[name] = run
    return result


def summarise(rounds: list[dict]) -> dict:
    """Per arm (and TRL): medians over rounds of the times, and of the per-round ratios to TRL's."""
    out = {"trl": {key: median([r["trl"][key] for r in rounds]) for key in ("step_s_median", "first_step_s")}}
    for arm in ARMS:
        keys = ("step_s_median", "first_step_s", "step_ratio", "step_min_ratio", "first_step_ratio")
        out[arm] = {key: round(median([r[arm][key] for r in rounds]), 3) for key in keys}
    return out


def machine() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count()}


def print_verdicts(result: dict) -> None:
    """TRL's times, then each arm's times and ratios to TRL's beside their goals, with the load averages."""
    rounds, summary = result["rounds"], result["summary"]
    loads = [r["trl"]["load_avg_before"] for r in rounds]
    print(f"TRL: step {summary['trl']['step_s_median']:.3f}s, step 1 at {summary['trl']['first_step_s']:.2f}s "
          f"(load average {min(loads)}-{max(loads)})")
    for arm in ARMS:
        loads = [r[arm]["load_avg_before"] for r in rounds]
        for measure, label, key in (("step", "step", "step_s_median"), ("first_step", "time to step 1", "first_step_s")):
            ratio, goal = summary[arm][f"{measure}_ratio"], GOALS.get((arm, measure))
            judged = verdict(ratio, goal, unit="x") if goal is not None else f"{ratio:.2f}x (no goal)"
            if measure == "step":  # the fastest steps: what each side does when nothing else takes the cores
                fastest = summary[arm]["step_min_ratio"]
                judged += f"; fastest step / TRL's {fastest:.2f}x"
                if goal is not None and (ratio <= goal) != (fastest <= goal):
                    judged += " -- the two disagree on the goal: other work on the machine, not a result; rerun it quiet"
            print(f"{arm}, {label} {summary[arm][key]:.2f}s / TRL's: {judged} (load average {min(loads)}-{max(loads)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), default=3,
                        help="rounds (TRL, then each rlmix arm); 6 for the issue's")
    parser.add_argument("--steps", type=at_least(1), default=12)
    parser.add_argument("--peer-python", type=Path, default=ROOT / ".venv-peer" / "bin" / "python")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.peer_python.is_file():  # argparse's usage error: exit 2, before the workload is built
        parser.error(f"--peer-python {args.peer_python}: no TRL environment; `make bench-peer` builds it "
                     "(requirements/peer.lock)")
    with tempfile.TemporaryDirectory() as tmp:
        workload = build_workload(Path(tmp) / "workload")
        peer_python = args.peer_python.absolute()  # not resolve(): the link is what makes it the venv's python
        rounds = [one_round(workload, Path(tmp), i, peer_python, args.steps) for i in range(args.repeats)]
    result = {
        "workload": {"prompts_per_step": GROUPS, "samples_per_prompt": GROUP_SIZE, "max_new_tokens": MAX_NEW_TOKENS,
                     "steps": args.steps, "model": {"model_type": "qwen3", **MODEL}},
        "machine": machine(),
        "rounds": rounds,
        "summary": summarise(rounds),
        "goals": {f"{arm}/{measure}": goal for (arm, measure), goal in GOALS.items()},
    }
    print(json.dumps(result, indent=2))
    print_verdicts(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
