"""How a step's cost grows: completion length, batch size, fleet size — a table and a log-log plot.

    .venv/bin/python scripts/bench_scaling.py [--lengths 24,48,96,192,384] [--batches 4,8,16,32]
                                              [--pools 1,2,3,6] [--out DIR]

Completion length and batch size are measured in this process, one thread, on the embedded model
(docs/embedded.md): one step's generation (the step's requests served in turn by the fleet's
samplers) plus one trainer step on that batch, the compute a step of the loop has to do.

- Length: the embedded model answers minicode in ~20 tokens and then stops, so a longer
  ``loop.max_new_tokens`` alone would not make longer completions. Here every completion runs to
  exactly ``L`` tokens: the samplers stop on no token (their ``stop_token_ids`` are emptied), and
  the model is the embedded one with ``max_position_embeddings`` raised to fit prompt + 384 tokens
  (default RoPE does not depend on it: the same weights compute the same logits). The trainer
  trains on all ``L`` tokens; rewards are drawn at random per sequence so no group is constant.
- Batch: ``loop.groups_per_step`` groups of ``loop.group_size`` at the default length.
- Fleet: the real loop (``rlmix train``, 8 steps, median ``time/step_s`` after two) with the
  first N pools of ``emulated_hetero6``; the other pools are removed with ``~fleet.pools.<name>``.

Each row has the load average beside it; the slope of log(time) against log(size) says how far
from linear each axis grows (1 = linear, > 1 superlinear).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

from arguments import at_least
from perf_common import isolated_step, load_average, median, read_metrics, run_rlmix

POOLS = ("h100_fp8", "h200_fp8", "b200_nvfp4", "b300_nvfp4", "a100_bf16", "rtxpro6000_bf16")


def long_context_copy(model_dir: Path, out: Path, positions: int) -> Path:
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["max_position_embeddings"] = max(config["max_position_embeddings"], positions)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def step_compute(model_dir: Path, cfg, stop: bool) -> dict:
    """Seconds of one step's generation and one trainer step (median of 2 after a warm-up)."""
    step = isolated_step(cfg, model_dir, stop=stop, random_rewards=True, reps=2)
    return {"generate_s": round(step["generate_s"], 3), "train_s": round(step["train_s"], 3), "tokens": step["tokens"],
            "mean_len": round(step["tokens"] / step["rows"], 1)}


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def fleet_step(workdir: Path, pools: int) -> float:
    workdir.mkdir(parents=True)
    drop = [f"~fleet.pools.{p}" for p in POOLS[pools:]]
    run_rlmix(["train", "+experiment=sc_mis", "logger=disabled", "loop.steps=8", f"hydra.run.dir={workdir / 'run'}",
               *drop], cwd=workdir)
    return round(median([r["time/step_s"] for r in read_metrics(workdir / "run")[2:]]), 3)


def main() -> None:
    import torch

    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.commands.compose import compose_plan, compose_run_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    def ints(text: str) -> list[int]:
        """A comma-separated list of counts, each at least 1."""
        return [at_least(1)(x) for x in text.split(",") if x]

    parser.add_argument("--lengths", type=ints, default=[24, 48, 96, 192, 384])
    parser.add_argument("--batches", type=ints, default=[4, 8, 16, 32])
    parser.add_argument("--pools", type=ints, default=[1, 2, 3, 6])
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_scaling"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = compose_plan(["+experiment=sc_mis"])
        model_dir = long_context_copy(resolve_model_dir(base), Path(tmp) / "model", 128 + max(args.lengths))
        for length in args.lengths:
            cfg = compose_run_config(["+experiment=sc_mis", f"loop.max_new_tokens={length}"])
            rows.append({"axis": "length", "size": length, "load": load_average()} | step_compute(model_dir, cfg, False))
        for groups in args.batches:
            cfg = compose_run_config(["+experiment=sc_mis", f"loop.groups_per_step={groups}"])
            rows.append({"axis": "batch_groups", "size": groups, "load": load_average()}
                        | step_compute(model_dir, cfg, True))
        for pools in args.pools:
            load = load_average()
            rows.append({"axis": "pools", "size": pools, "load": load, "loop_step_s": fleet_step(Path(tmp) / f"f{pools}", pools)})
    for row in rows:
        row["step_s"] = row.get("loop_step_s") or round(row["generate_s"] + row["train_s"], 3)
    report(rows, args.out)


def report(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    print(f"{'axis':<13}{'size':>6}{'step_s':>9}{'generate_s':>12}{'train_s':>9}{'tokens':>8}{'load':>7}")
    slopes = {}
    for axis in ("length", "batch_groups", "pools"):
        part = [r for r in rows if r["axis"] == axis]
        for r in part:
            print(f"{axis:<13}{r['size']:>6}{r['step_s']:>9.3f}{r.get('generate_s', float('nan')):>12.3f}"
                  f"{r.get('train_s', float('nan')):>9.3f}{r.get('tokens', 0):>8}{r['load']:>7.1f}")
        if len(part) > 1:
            slopes[axis] = round(slope([r["size"] for r in part], [r["step_s"] for r in part]), 2)
            ax.loglog([r["size"] for r in part], [r["step_s"] for r in part], "o-", label=f"{axis} (slope {slopes[axis]})")
    print("log-log slopes (1 = linear):", slopes)
    ax.set_xlabel("size (tokens per completion / groups per step / pools)")
    ax.set_ylabel("step time (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=120)
    (out / "scaling.json").write_text(json.dumps({"rows": rows, "slopes": slopes}, indent=2) + "\n")
    print(f"wrote {out / 'scaling.png'} and {out / 'scaling.json'}")


if __name__ == "__main__":
    main()
