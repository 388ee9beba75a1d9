"""``rlmix probe``: each pool's mismatch against the trainer, without training.

    rlmix probe fleet=emulated_hetero6 [Hydra overrides]

The prompt set is the task's fixed ``test`` split, thinned evenly to ``probe.prompts``
prompts, each sampled ``probe.samples_per_prompt`` times with ``loop.max_new_tokens``
and ``loop.temperature``; K = ``probe.num_candidates`` (default ``correction.num_candidates``). Writes a console table and
``probe.json`` (fleet manifest, reference definition, per-pool results) to ``probe.out_dir`` or
``outputs/probe/<time>/``. The measurement itself is ``rlmix.eval.probe``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.schema import MiniCodeTaskConfig, RunConfig
from rlmix.errors import ConfigError
from rlmix.eval.probe import FACTORS, PoolProbe, ProbeContext, ProbeSettings, probe_pool, reference_view

PROBE_FILE = "probe.json"
REFERENCE_DEFINITION = (
    "trainer-like precision view: weights, activations, linear inputs and KV cache in the trainer's "
    "autocast format (bf16 by default; trainer.precision), "
    "exact fp32-softmax attention kernel. Factors switch one at a time to the pool's value: "
    "weights (weight format with the activation dtype / W8A8 inputs / int4 group it implies), "
    "kv (KV-cache format), kernel (attention-kernel family). Factor KLs are exact full-vocabulary "
    "KL(q_factor || p_ref) per token, teacher-forced on the pool's sampled sequences, averaged over tokens."
)


def probe_prompts(cfg: RunConfig, count: int) -> list:
    """``count`` problems of the task's test split, evenly spaced so every difficulty level is present."""
    from rlmix.assembly.parts import make_task

    if not isinstance(cfg.task, (MiniCodeTaskConfig, DatasetTaskConfig)):
        raise ConfigError("rlmix probe needs task=minicode or task=dataset (its test split is the probe's prompt set)")
    problems = make_task(cfg.task, cfg.seed).split("test")
    if not 1 <= count <= len(problems):
        raise ConfigError(
            f"probe.prompts={count}: the probe samples that many prompts from the test split, "
            f"which has {len(problems)}; use 1..{len(problems)}"
        )
    return [problems[i * len(problems) // count] for i in range(count)]


def probe_fleet(cfg: RunConfig, progress=print) -> tuple[list[PoolProbe], dict]:
    """Probe every pool of ``cfg.fleet`` (one instance each): (per-pool results, what ``probe.json`` holds)."""
    from rlmix.models.io import load_tokenizer
    from rlmix.assembly.fleet import fleet_manifest, resolve_fleet
    from rlmix.assembly.parts import package_versions, resolve_model_dir
    from rlmix.config.load import resolve_correction

    if not cfg.fleet.pools:
        raise ConfigError("fleet.pools is empty: the probe needs at least one pool (e.g. fleet=emulated_hetero6)")
    settings = ProbeSettings.from_run_config(cfg)
    problems = probe_prompts(cfg, settings.prompts)
    model_dir = resolve_model_dir(cfg, progress=progress)
    tokenizer = load_tokenizer(model_dir)
    correction = resolve_correction(cfg.correction)
    specs = resolve_fleet(cfg, correction, tokenizer.eos_token_id)
    firsts = [spec for spec in specs if spec.index == 0]
    from rlmix.assembly.parts import encode_prompts

    prompts = encode_prompts(tokenizer, tuple(problems), settings.samples_per_prompt, cfg.task.chat_template)
    ctx = ProbeContext(model_dir, tokenizer.pad_token_id, correction, cfg.trainer.precision, cfg.seed)
    results: list[PoolProbe] = []
    for i, spec in enumerate(firsts):
        start = time.perf_counter()
        result = probe_pool(ctx, spec, prompts, settings)
        results.append(result)
        progress(
            f"[{i + 1}/{len(firsts)}] {spec.pool} ({result.label}): kl_k3={result.kl_k3:.3g} "
            f"|dlogp|={result.logprob_abs_diff:.3g} {result.tokens_per_s:.0f} tok/s "
            f"({time.perf_counter() - start:.1f} s)"
        )
    return results, {
        "fleet": fleet_manifest(specs),
        "reference": {"definition": REFERENCE_DEFINITION, "view": ctx.reference.tags(),
                      "label": ctx.reference.label},
        "trainer": {"model_dir": str(model_dir), "autocast": cfg.trainer.precision.value, "dtype": "fp32"},
        "settings": dataclasses.asdict(settings) | {
            "temperature": cfg.loop.temperature,
            "max_new_tokens": cfg.loop.max_new_tokens,
            "correction": cfg.correction.mode.value,
            "prompt_set": "test",
            "task_ids": [p.task_id for p in problems],
        },
        "pools": {r.pool: dataclasses.asdict(r) for r in results},
        "versions": package_versions(),
    }


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
    from rlmix.commands.compose import compose_run_config
    from rlmix.metrics.console import CountedLines
    from rlmix.orchestration.hardware import check_machine

    cfg = compose_run_config(list(args), for_training=False)
    check_machine(cfg, one_per_pool=True)  # the probe builds its samplers here, one per pool
    out_dir = Path(cfg.probe.out_dir) if cfg.probe.out_dir else Path("outputs") / "probe" / time.strftime(
        "%Y-%m-%d_%H-%M-%S")
    with CountedLines("probe") as progress:
        results, summary = probe_fleet(cfg, progress)
    print(probe_table(results))
    print(f"reference: {summary['reference']['label']}; wrote {write_probe(out_dir, summary)}")
