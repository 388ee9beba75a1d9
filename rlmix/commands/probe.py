"""``rlmix probe``: each pool's mismatch against the trainer, without training.

    rlmix probe fleet=emulated_hetero6 [Hydra overrides]

The prompt set is the task's fixed ``test`` split, thinned evenly to ``probe.prompts``
prompts, each sampled ``probe.samples_per_prompt`` times with ``loop.max_new_tokens``
and ``loop.temperature``; K = ``probe.num_candidates`` (default ``correction.num_candidates``). Writes a console table and
``probe.json`` (fleet manifest, reference definition, per-pool results) to ``probe.out_dir`` or
``outputs/probe/<time>/``. The measurement itself is ``rlmix.eval.probe.probe_fleet``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlmix.eval.probe import FACTORS, PoolProbe, probe_fleet

PROBE_FILE = "probe.json"
_COLUMNS = ("pool", "kl_k3", "kl_k1", "|dlogp|", "mult_err", "tail_frac", "rho", "P_H", "tok/s",
            "KL_exact", *(f"KL_{f}" for f in FACTORS), "shares w/kv/kern")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _row(r: PoolProbe) -> list[str]:
    a = r.attribution
    factor = [_g(a.factor_kl[f]) if a else "-" for f in FACTORS]
    shares = "/".join(f"{a.shares[f]:.2f}" for f in FACTORS) if a and a.shares else "-"
    return [r.pool, _g(r.kl_k3), _g(r.kl_k1), _g(r.logprob_abs_diff), f"{r.multiplicative_error:.4f}",
            _g(r.ratio_tail_frac), _g(r.sc_tail_ratio), f"{r.sc_head_mass:.4f}", f"{r.tokens_per_s:.0f}",
            _g(r.kl_exact), *factor, shares]


def probe_table(results: list[PoolProbe]) -> str:
    """One row per pool, aligned columns."""
    from rlmix.report.table import render_table

    return render_table(_COLUMNS, [_row(r) for r in results], right_from=1)


def write_probe(out_dir: Path, summary: dict) -> Path:
    """Write ``probe.json`` atomically (a reader never sees half a file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (PROBE_FILE + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(out_dir / PROBE_FILE)
    return out_dir / PROBE_FILE


def run_probe(args: list[str]) -> None:
    """The ``rlmix probe`` entry point: Hydra overrides in, table on stdout, ``probe.json`` on disk."""
    from rlmix.commands.compose import compose_plan
    from rlmix.metrics.console import CountedLines
    from rlmix.orchestration.hardware import check_machine

    plan = compose_plan(list(args), for_training=False)
    cfg = plan.cfg
    check_machine(cfg, one_per_pool=True)  # the probe builds its samplers here, one per pool
    out_dir = Path(cfg.probe.out_dir) if cfg.probe.out_dir else Path("outputs") / "probe" / time.strftime(
        "%Y-%m-%d_%H-%M-%S")
    with CountedLines("probe") as progress:
        results, summary = probe_fleet(plan, progress)
    print(probe_table(results))
    print(f"reference: {summary['reference']['label']}; wrote {write_probe(out_dir, summary)}")
