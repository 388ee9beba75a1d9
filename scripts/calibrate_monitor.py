"""Calibrate the collapse monitor on labelled runs: each rule's false alarms and misses.

    python scripts/calibrate_monitor.py                  # replay the stored set; print the table
    python scripts/calibrate_monitor.py --run 10         # the v1 default run at seeds 0..9, then their verdicts
    python scripts/calibrate_monitor.py --run 5 --first-seed 5   # ... at seeds 5..9
    python scripts/calibrate_monitor.py --add healthy /work/calib/default_s*     # store run dirs
    python scripts/calibrate_monitor.py --add collapse multirun/x --lasting-only  # ... only lasting ones
    python scripts/calibrate_monitor.py --import-results docs/results_full*/runs.json

The labelled set (``docs/monitor_calibration/runs.json``) holds per-step series: reward, KL (k3),
format-error rate, gradient norm and skipped steps, or only reward and KL for the records imported from
``scripts/reproduce.py``'s ``runs.json`` (which keep nothing else; their final format-error rate is
kept as ``format_last``). Labels: ``healthy`` (the default run; the small-lag ``stale2*`` doses that
did not end down) and ``collapse`` (runs that ended down: ``rlmix.metrics.lasting.still_down``).
The replay is offline and deterministic; ``tests/test_monitor_calibration.py`` pins its outcome.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rlmix.config.monitor import MonitorConfig
from rlmix.metrics.lasting import lasting, still_down, window_mean
from rlmix.metrics.monitor import CollapseMonitor
from rlmix.metrics.names import FORMAT_KEY, GRAD_NORM_KEY, KL_KEY, REWARD_KEY, SKIPPED_STEPS

ROOT = Path(__file__).resolve().parents[1]

STORE = ROOT / "docs" / "monitor_calibration" / "runs.json"
SERIES = {"reward": REWARD_KEY, "kl": KL_KEY, "format": FORMAT_KEY, "grad_norm": GRAD_NORM_KEY, "skipped": SKIPPED_STEPS}


def _compact(values: list) -> list | None:
    if all(v is None for v in values):
        return None
    return [None if v is None or v != v else float(f"{v:.5g}") for v in values]


LABELS = ("healthy", "collapse")  # what a stored run is: the table counts false alarms and misses by it


def record_from_run_dir(run_dir: Path, label: str, source: str) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    record = {"label": label, "source": source, "first_step": rows[0]["step"]}
    for name, key in SERIES.items():
        record[name] = _compact([row.get(key) for row in rows])
    return record


def record_ended_down(record: dict, cfg: MonitorConfig) -> bool:
    w = cfg.lasting.window
    reward = record["reward"]
    return still_down(window_mean(reward, slice(0, w)), window_mean(reward, slice(-w, None)),
                      format_last(record, cfg), cfg.lasting)


def format_last(record: dict, cfg: MonitorConfig) -> float:
    if record.get("format") is not None:
        return window_mean(record["format"], slice(-cfg.lasting.window, None))
    return record.get("format_last", float("nan"))


def import_results(path: Path, cfg: MonitorConfig) -> list[dict]:
    """reproduce.py's records: lasting collapses (by its rule) are ``collapse``; stale2* runs otherwise ``healthy``."""
    records = []
    for r in json.loads(path.read_text()):
        source = f"{path.parent.name}: {r['dose']} {r['arm']} seed {r['seed']} ({len(r['rewards'])} steps)"
        rec = {"label": "", "source": source, "first_step": 1, "reward": _compact(r["rewards"]),
               "kl": _compact(r["kls"]), "format": None, "grad_norm": None, "skipped": None,
               "format_last": round(r["format_last"], 5)}
        down = lasting(bool(r["collapsed"]), r["reward_first"], r["reward_last"], r["format_last"], cfg.lasting)
        if down:
            rec["label"] = "collapse"
        elif r["dose"].startswith("stale2") and not record_ended_down(rec, cfg):
            rec["label"] = "healthy"
        else:
            continue  # a large dose that ended up: neither label
        records.append(rec)
    return records


@dataclass
class Replay:
    flagged: bool  # at least one episode
    collapsed: bool  # the end-of-run verdict
    stopped: int | None  # the step action=stop would have stopped at
    warnings: int
    recovered: int  # episodes closed before the end


def replay(record: dict, cfg: MonitorConfig) -> Replay:
    monitor = CollapseMonitor(cfg)
    stopped = None
    names = [n for n in SERIES if record.get(n) is not None]
    for j in range(len(record["reward"])):
        metrics = {SERIES[n]: record[n][j] for n in names if record[n][j] is not None}
        verdict = monitor.update(record["first_step"] + j, metrics)
        if verdict.collapse and stopped is None:
            stopped = record["first_step"] + j
    end = monitor.finish()
    collapsed = end.collapse
    if record.get("format") is None:  # reward and KL only: the stored final format-error rate decides
        w = cfg.lasting.window
        collapsed = lasting(bool(end.episodes), window_mean(record["reward"], slice(0, w)),
                            window_mean(record["reward"], slice(-w, None)), format_last(record, cfg), cfg.lasting)
    return Replay(bool(end.episodes), collapsed, stopped, len(end.warnings), sum(e.recovered for e in end.episodes))


def only(rule: str, require_decline: bool = True) -> MonitorConfig:
    cfg = MonitorConfig()
    for name in ("reward", "kl", "format", "grad"):
        getattr(cfg, name).enabled = name == rule
    cfg.grad.require_decline = require_decline
    return cfg


def variants() -> list[tuple[str, MonitorConfig, str]]:
    """(row label, config, what is counted) for the table."""
    old = MonitorConfig()
    old.grad.require_decline = False
    return [
        ("`reward_drop`", only("reward"), "flagged"),
        ("`kl_growth` (with a decline)", only("kl"), "flagged"),
        ("`format_errors`", only("format"), "flagged"),
        ("`grad_spikes` alone", only("grad", require_decline=False), "flagged"),
        ("`grad_spikes` with a decline (default)", only("grad"), "flagged"),
        ("all rules, spikes alone flag (before)", old, "flagged"),
        ("all rules (default): flagged", MonitorConfig(), "flagged"),
        ("**verdict** (default): flagged and lasting", MonitorConfig(), "collapsed"),
        ("`action=stop` (default): stopped", MonitorConfig(), "stopped"),
    ]


def table(records: list[dict]) -> str:
    """Per rule (and for the verdict and action=stop): healthy runs it fired on, collapses it missed."""
    full = [r for r in records if r.get("format") is not None]
    partial = [r for r in records if r.get("format") is None]
    healthy = [r for r in full if r["label"] == "healthy"]
    groups = [  # (column header, records, count hits (false alarms) or misses)
        ("false alarms: v1 default runs (of {n}, full series)", [r for r in healthy if not is_v2(r)], True),
        ("false alarms: v2 runs (of {n}, full series)", [r for r in healthy if is_v2(r)], True),
        ("false alarms: stale2* runs (of {n}, reward and KL only)", [r for r in partial if r["label"] == "healthy"], True),
        ("misses: lasting collapses (of {n}, full series)", [r for r in full if r["label"] == "collapse"], False),
        ("misses: lasting collapses (of {n}, reward and KL only)", [r for r in partial if r["label"] == "collapse"], False),
    ]
    lines = ["| rule | " + " | ".join(h.format(n=len(rs)) for h, rs, _ in groups) + " |",
             "|---|" + "---|" * len(groups)]
    for label, cfg, what in variants():
        def hit(r: dict) -> bool:
            result = replay(r, cfg)
            return {"flagged": result.flagged, "collapsed": result.collapsed, "stopped": result.stopped is not None}[what]
        cells = [sum(hit(r) == alarms for r in rs) for _, rs, alarms in groups]
        lines.append(f"| {label} | " + " | ".join(map(str, cells)) + " |")
    cfg = MonitorConfig()
    healthy = [replay(r, cfg) for r in records if r["label"] == "healthy"]
    lines += ["", f"Healthy runs with a warning (spikes alone): {sum(h.warnings > 0 for h in healthy)}; "
                  f"with a recovered episode: {sum(h.recovered > 0 for h in healthy)}; of {len(healthy)}."]
    return "\n".join(lines)


def is_v2(record: dict) -> bool:
    """A run of the v2 workload (``model=embedded_v2``): stored from a ``scripts/reproduce.py`` v2 dose."""
    return record["source"].startswith("v2_")


def per_run(records: list[dict]) -> str:
    cfg = MonitorConfig()
    lines = []
    for r in records:
        res = replay(r, cfg)
        lines.append(f"{r['label']:<8} {'collapsed' if res.collapsed else 'flagged' if res.flagged else 'quiet':<9} "
                     f"stop {res.stopped or '-':<4} warn {res.warnings} recovered {res.recovered}  {r['source']}")
    return "\n".join(lines)


def load() -> list[dict]:
    return json.loads(STORE.read_text())["runs"] if STORE.is_file() else []


def save(records: list[dict]) -> None:
    STORE.parent.mkdir(parents=True, exist_ok=True)
    about = ("Labelled runs for scripts/calibrate_monitor.py: per-step series from the run's first_step "
             "(null where not recorded). healthy: the default run and the stale2* doses; collapse: runs "
             "that ended down (rlmix.metrics.lasting).")
    body = ",\n".join(json.dumps(r, separators=(",", ":")) for r in records)
    STORE.write_text(f'{{"about": {json.dumps(about)},\n"runs": [\n{body}\n]}}\n')


def run_defaults(n: int, out: Path, first_seed: int = 0) -> list[Path]:
    """The v1 default run (``rlmix train +experiment=sc_mis``, 150 steps) at seeds first_seed .. first_seed+n-1."""
    rlmix = str(Path(sys.executable).with_name("rlmix"))
    dirs = []
    for seed in range(first_seed, first_seed + n):
        run_dir = out / f"default_s{seed}"
        cmd = [rlmix, "train", "+experiment=sc_mis", f"seed={seed}", "logger.wandb.mode=disabled",
               f"hydra.run.dir={run_dir}"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        dirs.append(run_dir)
    return dirs


def input_problem(args: argparse.Namespace) -> str | None:
    """What in the command line cannot be done, before anything is run or the stored set is rewritten."""
    if args.run is not None and args.run < 1:
        return f"--run {args.run}: give a number of runs, at least 1"
    if args.add:
        label, dirs = args.add[0], args.add[1:]
        if label not in LABELS:
            return f"--add {label}: the label is one of {', '.join(LABELS)}, then the run directories"
        missing = [d for d in dirs if not Path(d).is_dir()]
        if not dirs or missing:
            return f"--add {label}: give run directories after the label" + (f" ({missing[0]}: no such directory)"
                                                                                 if missing else "")
    missing = [p for p in args.import_results or () if not p.is_file()]
    return f"--import-results {missing[0]}: no such file" if missing else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=int, metavar="N", help="run the default at seeds 0..N-1 and print their verdicts")
    parser.add_argument("--first-seed", type=int, default=0, metavar="S", help="with --run: seeds S .. S+N-1")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "calibration", help="where --run writes its runs")
    parser.add_argument("--add", nargs="+", metavar=("LABEL", "DIR"), help="store the runs under DIRs as LABEL")
    parser.add_argument("--lasting-only", action="store_true", help="with --add: only the runs that ended down")
    parser.add_argument("--import-results", nargs="+", type=Path, metavar="RUNS_JSON")
    parser.add_argument("--runs", action="store_true", help="also list each stored run's replayed outcome")
    args = parser.parse_args()
    refused = input_problem(args)
    if refused:
        parser.error(refused)
    cfg = MonitorConfig()
    if args.run:
        statuses = []
        for run_dir in run_defaults(args.run, args.out, args.first_seed):
            summary = json.loads((run_dir / "summary.json").read_text())
            statuses.append(summary["status"])
            print(f"{run_dir.name}: {summary['status']}; episodes {len(summary['collapse']['episodes'])}, "
                  f"warnings {len(summary['collapse']['warnings'])}")
        print(f"collapsed: {statuses.count('collapsed')} of {len(statuses)} default runs "
              f"(store them: --add healthy {args.out}/default_s*)")
        return
    records = load()
    if args.add:
        label, dirs = args.add[0], [Path(d) for d in args.add[1:]]
        run_dirs = sorted({p.parent for d in dirs for p in d.rglob("metrics.jsonl") if p.stat().st_size > 0})
        if not run_dirs:  # nothing to store: the set is left as it is
            parser.error(f"--add {label}: no run (a metrics.jsonl with rows) under {', '.join(map(str, dirs))}")
        new = [record_from_run_dir(d, label, d.name if d.parent.name.startswith("calib") else f"{d.parent.name}/{d.name}")
               for d in run_dirs]
        new = [r for r in new if not args.lasting_only or record_ended_down(r, cfg)]
        records = [r for r in records if r["source"] not in {n["source"] for n in new}] + new
        save(records)
        print(f"stored {len(new)} runs as {label}")
    if args.import_results:
        new = [rec for path in args.import_results for rec in import_results(path, cfg)]
        records = [r for r in records if r["source"] not in {n["source"] for n in new}] + new
        save(records)
        print(f"stored {len(new)} records from {len(args.import_results)} runs.json")
    if args.runs:
        print(per_run(records))
    print(table(records))


if __name__ == "__main__":
    main()
