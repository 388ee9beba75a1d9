"""``rlmix probe``: each pool's mismatch against the trainer, without training.

    rlmix probe fleet=emulated_hetero6 [Hydra overrides]

The prompt set is the task's fixed ``task.split`` (``test`` unless given: minicode's ``hard51``,
a dataset's ``train`` rows), thinned evenly to ``probe.prompts`` prompts, each sampled
``probe.samples_per_prompt`` times with ``loop.max_new_tokens`` and ``loop.temperature`` (for an
episode task, ``probe.samples_per_prompt`` whole episodes, each turn up to ``task.max_turn_tokens``);
K = ``probe.num_candidates`` (default ``correction.num_candidates``). Writes two console tables
(the pools' mismatch and its attribution; where it sits: by trainer probability, position, distance
after an environment token, router flips), then ``probe.json`` (fleet manifest, reference
definition, per-pool results) to ``probe.out_dir`` or ``outputs/probe/<time>/``. ``hydra.*`` overrides
(``hydra.run.dir``) are refused: the probe runs no Hydra app and would ignore them (``hydra.searchpath``
is honoured). The measurement itself is ``rlmix.eval.probe.probe_fleet``; how to read it, docs/probe.md.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from rlmix.assembly.plan import RunPlan
from rlmix.errors import ConfigError
from rlmix.eval.probe import FACTORS, PoolProbe, probe_fleet
from rlmix.eval.where import POSITION_EDGES, PROB_EDGES, MismatchBin, env_distance_labels

PROBE_FILE = "probe.json"
PROBE_LOG = "probe.log"  # what the libraries said while the probe ran (vLLM's engine start, warnings)
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


_PROB_HEADERS = (*(f"p<{b:g}" for b in PROB_EDGES[1:-1]), f"p>={PROB_EDGES[-2]:g}")
_POSITION_HEADERS = (*(f"t{a}-{b - 1}" for a, b in zip(POSITION_EDGES[:-1], POSITION_EDGES[1:])),
                     f"t{POSITION_EDGES[-1]}+")
_ENV_HEADERS = tuple(f"e{label}" for label in env_distance_labels())
_FLIP_HEADERS = ("flip", "tok_flip", "|d| flip/none", "flip_mass")
WHERE_LEGEND = ("where |dlogp| sits: p = trainer probability of the sampled token, t = position in the completion; "
                "cell = share of the pool's |dlogp| mass / share of its tokens. flip = share of (token, MoE layer) "
                "whose top-k experts differ, tok_flip = tokens with >= 1 flipped layer, flip_mass = their share "
                "of |dlogp| ('-': dense model). Episodes add e = policy tokens since the last environment token")


def _bin_cell(b: MismatchBin, tokens: int) -> str:
    mass = "-" if b.abs_diff_share is None else f"{100 * b.abs_diff_share:.0f}%"
    return f"{mass}/{100 * b.tokens / max(tokens, 1):.0f}%"


def _where_row(r: PoolProbe, episodes: bool) -> list[str]:
    f = r.router
    flips = ["-"] * 4 if f is None else [
        f"{f.layer_flip_rate:.3f}", f"{f.token_flip_rate:.3f}",
        f"{f.logprob_abs_diff_flipped:.2g}/{f.logprob_abs_diff_unflipped:.2g}",
        "-" if f.abs_diff_share_flipped is None else f"{100 * f.abs_diff_share_flipped:.0f}%"]
    env = [] if not episodes else ["-"] * len(_ENV_HEADERS) if r.by_env_distance is None else [
        _bin_cell(b, r.tokens) for b in r.by_env_distance]
    return [r.pool, *(_bin_cell(b, r.tokens) for b in (*r.by_trainer_prob, *r.by_position)), *env, *flips]


def where_table(results: list[PoolProbe]) -> str:
    """One row per pool: the share of |dlogp| mass and of tokens in each bin, then router flips.
    The distance-after-environment-token bins appear when some pool drew episodes."""
    from rlmix.report.table import render_table

    episodes = any(r.by_env_distance is not None for r in results)
    columns = ("pool", *_PROB_HEADERS, *_POSITION_HEADERS, *(_ENV_HEADERS if episodes else ()), *_FLIP_HEADERS)
    return render_table(columns, [_where_row(r, episodes) for r in results], right_from=1)


def write_probe(out_dir: Path, summary: dict) -> Path:
    """Write ``probe.json`` atomically (a reader never sees half a file)."""
    from rlmix.metrics.written import write_result

    return write_result(out_dir / PROBE_FILE, json.dumps(summary, indent=2))


def probe_split(plan: RunPlan, args: list[str]) -> str:
    """The split the probe samples: ``task.split``, read as ``rlmix eval`` reads it (a name the task lacks
    is refused when the prompts are drawn). minicode's default, ``train``, names its training stream,
    which has no fixed problems: it stands for ``test``; given, it is refused. A task without splits
    (a Harbor task set) samples its whole set, whatever the name."""
    from rlmix.commands.eval import check_given_split
    from rlmix.config.schema import MiniCodeTaskConfig

    check_given_split(plan, args)
    task = plan.cfg.task
    return "test" if isinstance(task, MiniCodeTaskConfig) and task.split == "train" else getattr(task, "split", "test")


def run_probe(args: list[str]) -> None:
    """The ``rlmix probe`` entry point: Hydra overrides in, tables on stdout, then ``probe.json`` on disk
    (its directory checked writable before the first sample, not after the last)."""
    from rlmix.assembly.rules import check_output_dir
    from rlmix.commands.compose import compose_plan
    from rlmix.commands.eval import refuse_hydra_overrides
    from rlmix.metrics.console import CountedLines
    from rlmix.metrics.quiet import library_logs_to, stderr_to
    from rlmix.orchestration.hardware import check_machine

    refuse_hydra_overrides(list(args), "probe", "probe.out_dir")
    plan = compose_plan(list(args), for_training=False)
    cfg = plan.cfg
    if cfg.checkpoint is not None:  # eval's key: the probe would measure model= and say nothing
        raise ConfigError(f"checkpoint={cfg.checkpoint}: rlmix probe does not read checkpoint= (the model rlmix eval "
                          "scores); give the model to measure as model.path=<HF model dir>")
    split = probe_split(plan, list(args))
    check_machine(cfg, one_per_pool=True)  # the probe builds its samplers here, one per pool
    out_dir = Path(cfg.probe.out_dir) if cfg.probe.out_dir else Path("outputs") / "probe" / time.strftime(
        "%Y-%m-%d_%H-%M-%S")
    check_output_dir("probe.out_dir", str(out_dir))
    # The libraries' messages (vLLM's engine start, above all; their stderr too) go to a file, not the console: beside
    # probe.json once it is written; until then in the temporary directory, so nothing of a failed probe
    # is left in probe.out_dir. logger.verbose=true streams them to the console instead.
    library_log = None
    if not cfg.logger.verbose:
        with tempfile.NamedTemporaryFile("w", prefix="rlmix-probe-", suffix=".log", delete=False) as file:
            library_log = Path(file.name)
        library_logs_to(library_log)
    with stderr_to(library_log), CountedLines("probe") as progress:
        results, summary = probe_fleet(plan, progress, split)
    print(probe_table(results))
    print(where_table(results))
    print(WHERE_LEGEND)
    written = write_probe(out_dir, summary)
    if library_log is not None and library_log.stat().st_size:
        library_log = Path(shutil.move(library_log, out_dir / PROBE_LOG))
        print(f"libraries' messages: {library_log}")
    elif library_log is not None:
        library_log.unlink()
    print(f"reference: {summary['reference']['label']}; wrote {written}")
