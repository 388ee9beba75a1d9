"""Reproduce the study's comparison on the embedded default (docs/math.md §5, docs/results.md).

    python scripts/reproduce.py --profile quick     # make reproduce-quick: the headline, v2 at lag 0 (12 runs of 300 steps)
    python scripts/reproduce.py --profile v2_map    # make reproduce: the map on v2, 10 arms x 6 doses (177 runs, ~10-12 h on 2 cores)
    python scripts/reproduce.py --profile v2_map --doses v2_fp8 --arms grpo,sc_mis   # one slice of it
    python scripts/reproduce.py --profile full      # v1's map (8 arms x 2 doses) and SC at K = 2 (54 runs)
    python scripts/reproduce.py --profile v1_quick  # v1's free-running headline regime: 5 arms x 3 seeds
    python scripts/reproduce.py --profile sc        # v1: SC alone and SC+MIS at K = 32 (exact) and K = 2 (a real tail)
    python scripts/reproduce.py --doses v2_fleet    # one dose, with the profile's arms
    python scripts/reproduce.py --arms mis,icepop   # other arms (any experiment preset) at the headline dose
    python scripts/reproduce.py --steps 500         # longer runs
    python scripts/reproduce.py --seeds 1 --steps 20   # a look, not a result: page results_quick_1seed_20steps
    python scripts/reproduce.py --merge docs/results_a/runs.json,docs/results_b/runs.json --name v2_map
                                                    # one page (tables, map) from earlier invocations' runs
                                                    # (of one machine: it refuses pages of two CPU models)
    python scripts/reproduce.py --profile quick --resume multirun/reproduce_<stamp>
                                                    # an invocation that was stopped: its finished runs are
                                                    # kept, the rest are run, then the page is written
                                                    # (give the options it was started with: a kept run
                                                    # trained with other overrides, --steps say, is refused)
    python scripts/reproduce.py --profile v2_map --probes-only   # each dose's fleet probed, no runs (for --merge)

Every run is an ordinary ``rlmix train -m`` sweep (one per dose: the overrides in ``DOSES``); every
final checkpoint is scored with ``rlmix eval`` on the held-out ``test`` split (pass@1, the fp32
reference sampler). The v2 doses run under the controlled lag (``loop.lag=0``: each batch from the
trainer's current weights; ``v2_fp8kv_lag4``: from the weights 4 versions back; one seed one
run); the v1 doses free-running, with the staleness set by
the buffer depth. Seeds are fixed before the runs (0, 1, 2) and every run is reported. Each dose's
fleet is also measured at fixed weights, once, by ``rlmix probe`` (``probe``). What is written:
``docs/results_<name>.md`` (tables), its figures in ``docs/results_<name>/``, the raw per-run
records in ``docs/results_<name>/runs.json`` and the probes' in ``probes.json`` beside it. The name
is the profile's, then each of ``--doses`` and ``--arms`` given, then ``--seeds`` and ``--steps`` where
they are not the profile's (``quick_1seed_20steps``), so a shorter look never writes over the page
of the profile's runs (page_name).

Ctrl-C (or SIGTERM, SIGHUP, to the script or its process group) stops the running command as it stops
``rlmix`` (the run saves and says so; the script passes the signal on once); the script then ends with
128 + the signal's number (130 for Ctrl-C) and the ``--resume`` line, also where the command ended
meanwhile of its own accord.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlmix.config.monitor import LastingRule
from rlmix.machine import cpu_model
from rlmix.metrics import names
from rlmix.metrics.lasting import lasting as is_lasting
from rlmix.report.table import trailing_means

ROOT = Path(__file__).resolve().parents[1]
RLMIX = str(Path(sys.executable).with_name("rlmix"))

# Uncorrected: REINFORCE and the study's GRPO (ratio 1 against the trainer's own log-probs).
# Corrections: the study's IcePop, PPO clipped against the sampler (bypass), SC+MIS.
HEADLINE_ARMS = ("reinforce", "grpo", "icepop", "ppo_bypass", "sc_mis")
# ... with MIS alone at token and sequence level, and the other published remedy: FP16 trainer
# and samplers, no correction.
MAP_ARMS = ("reinforce", "grpo", "icepop", "ppo_bypass", "mis", "mis_seq", "sc_mis", "fp16")
SC_ARMS = ("sc", "sc_mis")  # when centering matters over masking (MIS alone: the map's stale2 row; K-free)
# The v2 map's arms: v1's, SC alone (K = 128 is below v2's 1,024 tokens, so its tail is modelled) and
# SC+MIS with routing replay (the trainer reuses each sampler's experts).
V2_MAP_ARMS = ("reinforce", "grpo", "icepop", "ppo_bypass", "mis", "mis_seq", "sc", "sc_mis", "sc_mis_replay", "fp16")

# The v1 doses: every sampler generates at once, as on a real fleet where each has its own
# accelerator: the samplers then run ahead of the trainer and the buffer depth sets the staleness.
# (The default thread plan lets one request generate per free core, which keeps a 2-core run
# sampler-bound and its staleness under 1 whatever the buffer.) How far behind a sample is then
# depends on how fast each process ran, so these doses are not reproducible run to run.
FREE_RUNNING = ["fleet=emulated_hetero6", "loop.concurrent_requests=6", "loop.max_staleness=null"]
# The v2 doses: the v2 workload (model=embedded_v2, docs/embedded.md) under the controlled lag
# (loop.lag, docs/architecture.md): the batch trained at version k comes from version k − lag
# whatever the machine's speed, so one seed gives one run and the lag is a number in the command.
# The attention backward pinned to the one every v2 run on the results pages was trained with
# (trainer.attention_backward: dense is the default since; the two differ at bf16 rounding), so the
# pages repeat bit for bit and a new cell of the map is trained as its neighbours were.
V2 = ["model=embedded_v2", "trainer.attention_backward=fused"]
NVFP4_POOLS = ("b200_nvfp4", "b300_nvfp4")
QUANTISED_POOLS = ("h100_fp8", "h200_fp8", *NVFP4_POOLS)  # the fleet's fp8 and nvfp4 pools
# fp8 KV cache (unit scale, as vLLM stores one without calibrated scales) on the fp8 and nvfp4 pools.
FP8_KV = [f"fleet.pools.{pool}.kv_precision=fp8_e4m3" for pool in QUANTISED_POOLS]
# The coarsest physical formats the fleet's pools can run: the fp8 KV cache in e5m2 (vLLM's
# kv_cache_dtype=fp8_e5m2: two mantissa bits, no scale), and the nvfp4 pools' GEMMs W4A4, their inputs
# in nvfp4 as Blackwell's FP4 kernels take them (rlmix probe: ~2e-3 KL per token on these pools).
E5M2_KV = [f"fleet.pools.{pool}.kv_precision=fp8_e5m2" for pool in QUANTISED_POOLS]
W4A4 = [f"fleet.pools.{pool}.linear_inputs=nvfp4" for pool in NVFP4_POOLS]
# Mismatch doses: each an ordinary list of config overrides (physical knobs only: how far behind
# the samplers run, how hard each step moves the policy, the samplers' number formats).
DOSES: dict[str, list[str]] = {
    # v2, lag removed: the fleet's numbers are the only mismatch (beside the matched control's bf16),
    # in rising dose (a map's rows come in this order).
    "v2_matched": [*V2, "fleet=matched_bf16", "loop.lag=0"],  # every pool computes as the trainer does
    "v2_fleet": [*V2, "fleet=emulated_hetero6", "loop.lag=0"],  # the six-pool fleet as configured
    "v2_fp8": [*V2, "fleet=emulated_fp8", "loop.lag=0"],  # every pool fp8 W8A8, six kernel families' worth
    "v2_fp8kv": [*V2, "fleet=emulated_hetero6", "loop.lag=0", *FP8_KV],  # hetero6 with fp8 KV caches (the headline)
    "v2_nvfp4_fp8kv": [*V2, "fleet=emulated_nvfp4", "loop.lag=0"],  # every pool nvfp4 with an fp8 KV cache
    "v2_e5m2kv_w4a4": [*V2, "fleet=emulated_hetero6", "loop.lag=0", *E5M2_KV, *W4A4],  # ~2x the headline's KL in training
    # The lag dose beside them: the headline's numbers, every batch drawn from weights 4 versions old.
    "v2_fp8kv_lag4": [*V2, "fleet=emulated_hetero6", "loop.lag=4", *FP8_KV],
    # A step 3.3x the default's: uncorrected GRPO collapses here on the matched control too
    # (docs/results.md), so these doses test the optimizer, not the numbers.
    "v2_fp8kv_lr1e-3": [*V2, "fleet=emulated_hetero6", "loop.lag=0", *FP8_KV, "trainer.lr=1e-3"],
    "v2_matched_lr1e-3": [*V2, "fleet=matched_bf16", "loop.lag=0", "trainer.lr=1e-3"],
    # v1, free-running (docs/results.md's earlier pages).
    "stale2": [*FREE_RUNNING, "loop.buffer_groups=32"],  # the default buffer: staleness ~1.5
    "stale2_lr1e-3": [*FREE_RUNNING, "loop.buffer_groups=32", "trainer.lr=1e-3"],  # the same step size with little lag
    "stale2_int4": [*FREE_RUNNING, "loop.buffer_groups=32", "fleet.precision=int4"],  # little lag, every pool int4
    "stale8": [*FREE_RUNNING, "loop.buffer_groups=136"],  # samplers ~8 versions behind the trainer
    "stale8_lr1e-3": [*FREE_RUNNING, "loop.buffer_groups=136", "trainer.lr=1e-3"],
    "stale8_lr1e-3_int4": [*FREE_RUNNING, "loop.buffer_groups=136", "trainer.lr=1e-3",
                           "fleet.pools.b200_nvfp4.precision=int4", "fleet.pools.b300_nvfp4.precision=int4",
                           "fleet.pools.h100_fp8.kv_precision=fp8_e4m3", "fleet.pools.h200_fp8.kv_precision=fp8_e4m3"],
    # The v1 vocabulary has 32 symbols, so the default K = 128 head is all of it and SC is exact;
    # with K = 2 the head misses tail mass and SC runs on its modelled tail (ρ).
    "stale2_k2": [*FREE_RUNNING, "loop.buffer_groups=32", "correction.num_candidates=2"],
}
Plan = list[tuple[str, tuple[str, ...]]]


@dataclass(frozen=True)
class Profile:
    plan: Plan  # (dose, arms) sweeps, run in this order
    steps: int  # per run, unless --steps says otherwise
    about: str


# The headline (docs/results.md leads with it): on the v2 workload with the lag removed, the
# uncorrected arms and SC+MIS on the fleet as configured, and the uncorrected GRPO on the matched
# control.
HEADLINE = "v2_fp8kv"
# v1's headline regime (docs/results_v1_quick.md): uncorrected REINFORCE collapsed in 3 of 3 seeds there.
V1_HEADLINE = "stale8_lr1e-3"
PROFILES: dict[str, Profile] = {
    "quick": Profile([(HEADLINE, ("reinforce", "grpo", "sc_mis")), ("v2_matched", ("grpo",))], 300,
                     "the headline: v2, lag 0, the fleet and the matched control (12 runs)"),
    "v1_quick": Profile([(V1_HEADLINE, HEADLINE_ARMS)], 60, "v1's free-running headline regime, 5 arms (15 runs)"),
    # The stability map on v1: the fleet as configured, and the lag and step size under which the
    # failure shows; eight arms -- and SC alone against SC+MIS where the head misses mass (K = 2;
    # MIS is K-free, so the map's stale2 row is its comparison). (The int4 dose of earlier pages,
    # docs/results_full_100steps.md and docs/results_stale2_int4*, is `--doses stale8_lr1e-3_int4`.)
    "full": Profile([("stale2", MAP_ARMS), (V1_HEADLINE, MAP_ARMS), ("stale2_k2", SC_ARMS)], 60,
                    "v1's stability map: 8 arms x 2 doses and SC at K = 2 (54 runs)"),
    "sc": Profile([("stale2", SC_ARMS), ("stale2_k2", SC_ARMS)], 60, "v1: SC and SC+MIS at K = 32 (exact) and K = 2"),
    # The map on v2 (make reproduce): every arm at each precision dose, in rising mismatch, and at the
    # lag dose. FP16 asks every pool for fp16, which the matched control's CPU pools lack; its cell
    # there is the control itself.
    "v2_map": Profile([("v2_matched", tuple(a for a in V2_MAP_ARMS if a != "fp16")), ("v2_fp8", V2_MAP_ARMS),
                       (HEADLINE, V2_MAP_ARMS), ("v2_nvfp4_fp8kv", V2_MAP_ARMS), ("v2_e5m2kv_w4a4", V2_MAP_ARMS),
                       ("v2_fp8kv_lag4", V2_MAP_ARMS)], 300,
                      "the map on v2: 10 arms x 5 precision doses and a lag dose, lag 0 otherwise (177 runs)"),
}
# v1: 60 steps kept `make reproduce` within an hour on the 2 cores of docs/results_full.md (a run: ~55 s
# of training, ~7 s of evaluation; 5-7 min and ~20 s on the slower AMD EPYC of docs/results_v1_quick.md).
# The failures it looks for have happened by then: docs/results.md reads the 100-step map at step 60
# ("Run length") and finds the same arms failing where they fail. v2: 300 steps (docs/results.md: at
# lr 1e-3 the fleet's one lasting collapse came at step 267).
LASTING_FORMAT_ERRORS = LastingRule().format_errors  # the lasting rule's, for the page text
POOL_KL = "mismatch/kl_k3/"  # + a pool's name: its per-token KL
# The where/ series a page keeps (rlmix/metrics/where.py): shares of the step's tokens, mismatch and
# squared logit gradient held by low-probability tokens (the trainer's p < 0.1), and where the gradient sat:
# the down-weighted tokens (p/q < 0.8, the bands under lag carried most of it: docs/results.md).
LOW_P_BINS = ("p0-0.001", "p0.001-0.01", "p0.01-0.1")
LOW_RATIO_BANDS = ("r0-0.2", "r0.2-0.5", "r0.5-0.8")
WHERE_COLUMNS = {  # series name -> (page column, where/ keys summed)
    "tokens_low_p": ("tokens at p < 0.1", [f"{names.WHERE_TOKENS}/{b}" for b in LOW_P_BINS]),
    "mismatch_low_p": ("their share of Σ \\|Δ log p\\|", [f"{names.WHERE_MISMATCH}/{b}" for b in LOW_P_BINS]),
    "grad_low_p": ("their share of the gradient", [f"{names.WHERE_GRAD}/{b}" for b in LOW_P_BINS]),
    "grad_top1pct": ("gradient held by the top 1% of tokens", [names.WHERE_GRAD_TOP]),
    "grad_ratio_tail": ("gradient held by p/q outside [0.2, 5]", [names.WHERE_GRAD_RATIO_TAIL]),
    "grad_low_ratio": ("gradient held by p/q < 0.8", [f"{names.WHERE_GRAD}/{b}" for b in LOW_RATIO_BANDS]),
}


SEEDS = 3  # seeds 0, 1, 2 per arm, unless --seeds says otherwise


def page_name(profile: str, doses: str | None, arms: str | None, seeds: int, steps: int) -> str:
    """The page's name (``docs/results_<name>.md``): the profile's, then the ``--doses`` and ``--arms``
    given, then the seeds and the steps where they are not the profile's (``quick_1seed_20steps``), so
    that a shorter look is a page of its own and leaves the profile's page as its runs made it."""
    name = profile + "".join(f"_{'_'.join(v.split(','))}" for v in (doses, arms) if v)
    if seeds != SEEDS:
        name += f"_{seeds}seed{'s' * (seeds != 1)}"
    if steps != PROFILES[profile].steps:
        name += f"_{steps}steps"
    return name


def plan_arms(plan: Plan) -> tuple[str, ...]:
    """Every arm of a plan, in the order the plan first names it."""
    return tuple(dict.fromkeys(arm for _, arms in plan for arm in arms))


@dataclass
class RunResult:
    arm: str
    seed: int
    dose: str
    collapsed: bool
    collapse_step: int | None
    collapse_reason: str
    reward_first: float  # mean reward over the first 10 steps
    reward_last: float  # ... and the last 10
    kl_last: float
    format_last: float
    format_peak: float  # the worst 5-step mean of format errors: an episode the run recovered from shows here
    masked_frac: float  # MIS: fraction of tokens masked, mean over the run
    tail_ratio_max: float  # SC: the largest per-step mean tail ratio ρ (1 = consistent tail)
    clip_frac: float  # PPO: share of tokens on the clipped branch, mean over the run
    pass1: float | None  # held-out test split
    pass1_se: float | None
    rewards: list[float]
    kls: list[float]
    pool_kls: dict[str, list[float]]  # mismatch/kl_k3/<pool> per step (older pages: absent)
    where: dict[str, list[float]]  # WHERE_COLUMNS' series per step (runs before where/ existed: absent)
    run_s: float  # the run's own wall time (summary.json's wall_time_s)

    @property
    def lasting(self) -> bool:
        """Flagged and still down at the end: over the last 10 steps, reward below the first 10
        steps' or format errors above 10% (healthy runs: 1-3%). A flagged run that climbed back is
        not a lasting collapse. The one rule the monitor's verdict and ``rlmix report`` use too."""
        return is_lasting(self.collapsed, self.reward_first, self.reward_last, self.format_last)


def run(cmd: list[str], quiet: bool = False) -> None:
    """Run an ``rlmix`` command to its end; CalledProcessError when it fails.

    The command runs in a session of its own, and each Ctrl-C, SIGTERM or SIGHUP this script gets is
    passed on to it once: the command finishes its step, saves and prints how it stopped, and this
    waits for that instead of killing it (as ``subprocess.run`` does a quarter second after a
    KeyboardInterrupt, which left the run's Ray processes behind and no line to go on with). A signal
    that came while the command finished anyway is not lost: ``Interrupted`` once it has ended."""
    print("+", " ".join(cmd), flush=True)
    got: list[int] = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL if quiet else None,
                          start_new_session=True) as proc:
        def forward(signum: int, _frame) -> None:
            got.append(signum)
            if proc.returncode is None:
                proc.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
        try:
            code = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if code != 0:
        raise subprocess.CalledProcessError(code, cmd)
    if got:
        raise Interrupted(got[0], f"`{' '.join(cmd[1:3])}` had ended ({signal_name(got[0])} came as it did)")


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = cpu_model()
    return f"{platform.machine()}{f' {cpu}' if cpu else ''}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, no GPU"


def sweep_overrides(dose: str, arms: tuple[str, ...], seeds: int | tuple[int, ...], steps: int) -> list[str]:
    """The ``rlmix train -m`` overrides of one dose's sweep: every arm x seeds 0 .. seeds-1 (or x the
    seeds given)."""
    seeds = tuple(range(seeds)) if isinstance(seeds, int) else seeds
    return [f"+experiment={','.join(arms)}", f"seed={','.join(map(str, seeds))}", f"loop.steps={steps}",
            "loop.checkpoint_every=0", "logger.wandb.mode=disabled", *DOSES[dose]]


def plan_problem(plan: list[tuple[str, tuple[str, ...]]], steps: int) -> str | None:
    """The first arm x dose of ``plan`` that cannot run (one line), or None: checked before anything
    runs, so a cell no machine can train (``fp16`` on the CPU pools of ``v2_matched``) does not end
    an invocation halfway through."""
    from rlmix.commands.compose import compose_run_config, expand_jobs
    from rlmix.errors import ConfigError

    for dose, arms in plan:
        for arm in arms:
            try:
                compose_run_config(expand_jobs(sweep_overrides(dose, (arm,), 1, steps), multirun=True)[0])
            except ConfigError as err:
                return f"{arm} at {dose}: {err}"
    return None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP between commands, as KeyboardInterrupt is SIGINT there (``stop_between``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_between(signum: int, _frame) -> None:
    raise Stopped(signum)


class Interrupted(Exception):
    """A command stopped by ``signum`` after its work was done (``what``: the line saying so)."""

    def __init__(self, signum: int, what: str) -> None:
        super().__init__(what)
        self.signum, self.what = signum, what


def stop_signal(code: int) -> int | None:
    """The signal that stopped a command, from its exit status: killed by it (negative), or ended
    by rlmix on it (128 + N: SIGHUP, SIGINT, SIGTERM); None where it ended otherwise."""
    if code < 0:
        return -code
    if code - 128 in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        return code - 128
    return None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def sweep(out: Path, dose: str, arms: tuple[str, ...], seeds: int | tuple[int, ...], steps: int) -> list[str]:
    """One dose's ``rlmix train -m``. Stopped by a signal after every one of its runs had ended (in
    the sweep's teardown): Interrupted, which says the dose finished; stopped earlier, or failed:
    CalledProcessError."""
    overrides = sweep_overrides(dose, arms, seeds, steps)
    try:
        run([RLMIX, "train", "-m", *overrides, f"hydra.sweep.dir={out}"])
    except subprocess.CalledProcessError as err:
        signum = stop_signal(err.returncode)
        jobs = [(arm, seed) for arm in arms for seed in (range(seeds) if isinstance(seeds, int) else seeds)]
        ended = runs_in(out)
        if signum is None or not all(ended.get(job, (False,))[0] for job in jobs):
            raise
        raise Interrupted(signum, f"`train -m` was stopped ({signal_name(signum)}) after every run of dose "
                                  f"`{dose}` had ended: the dose finished, and its runs are kept") from err
    return overrides


# The fleet's mismatch at fixed weights, measured once per dose by `rlmix probe` (docs/probe.md) on
# the model the runs start from: every test prompt, 8 samples each, seed 0. How far behind the
# samplers run and how the trainer steps (`loop.*`, `trainer.*`) do not change what it measures, so
# doses that differ only there (the lag dose and the headline) share one probe.
PROBE_PROMPTS = 60


def probe_overrides(dose: str) -> tuple[str, ...]:
    return (*(o for o in DOSES[dose] if not o.startswith(("loop.", "trainer."))), f"probe.prompts={PROBE_PROMPTS}")


def probe(out: Path, dose: str, done: dict[tuple[str, ...], dict]) -> dict:
    """The dose's probe (``probe_summary``): ``out/probe/probe.json``, run unless it is there (a resumed
    invocation keeps it) or an earlier dose of the same fleet has one (``done``)."""
    overrides = probe_overrides(dose)
    if overrides not in done:
        path = out / "probe" / "probe.json"
        if not path.is_file():
            run([RLMIX, "probe", *overrides, f"probe.out_dir={path.parent}"], quiet=True)
        done[overrides] = probe_summary(path, overrides)
    return done[overrides]


def probe_summary(path: Path, overrides: tuple[str, ...]) -> dict:
    """What a page tables of one ``probe.json``: per pool, its view, the KL per token (k3, and exact
    where the pool has a torch view), the mean |Δ log p|, the router flips (token × MoE layer) and the
    attribution's shares of the KL (weights, KV cache, kernel)."""
    data = json.loads(path.read_text())
    pools = {name: {"label": p["label"], "kl_k3": p["kl_k3"], "kl_exact": p["kl_exact"],
                    "logprob_abs_diff": p["logprob_abs_diff"],
                    "router_flip": (p.get("router") or {}).get("layer_flip_rate"),
                    "shares": (p.get("attribution") or {}).get("shares")}
             for name, p in data["pools"].items()}
    return {"command": f"rlmix probe {' '.join(overrides)}", "reference": data["reference"]["label"], "pools": pools}


def probe_table(probes: dict[str, dict], doses: list[str]) -> str:
    """One row per dose and set of pools that measured alike (pools of one kernel family compute
    identically at these settings)."""
    def sci(x: float | None) -> str:
        return "—" if x is None else f"{x:.1e}".replace("e-0", "e-")

    rows = ["| dose | pools | KL per token (k3) | exact KL | mean \\|Δ log p\\| | router flips | KL's share: "
            "weights / KV cache / kernel |", "|---|---|---|---|---|---|---|"]
    first: dict[str, str] = {}  # command -> the first dose it probed
    for dose in (d for d in doses if d in probes):
        if (earlier := first.setdefault(probes[dose]["command"], dose)) != dose:
            rows.append(f"| `{dose}` | as `{earlier}`: the same fleet | | | | | |")
            continue
        alike: dict[tuple, list[str]] = {}
        for pool, p in probes[dose]["pools"].items():
            shares = " / ".join(f"{v:.2f}" for v in p["shares"].values()) if p["shares"] else "—"
            flips = "—" if p["router_flip"] is None else f"{p['router_flip']:.1%}"
            key = (sci(p["kl_k3"]), sci(p["kl_exact"]), f"{p['logprob_abs_diff']:.4f}", flips, shares)
            alike.setdefault(key, []).append(pool)
        rows += [f"| `{dose}` | {', '.join(pools)} | {' | '.join(key)} |" for key, pools in alike.items()]
    return "\n".join(rows)


def load_probes(runs: Path) -> dict[str, dict]:
    """The ``probes.json`` beside an earlier invocation's ``runs.json`` (none before pages had one)."""
    path = runs.with_name("probes.json")
    return json.loads(path.read_text()) if path.is_file() else {}


def runs_in(out: Path) -> dict[tuple[str, int], tuple[bool, Path]]:
    """A dose directory's runs by (arm, seed), each with whether it ended (completed or collapsed):
    the sweep's own and those of the sweeps that resumed it (in subdirectories). A run that ended
    wins over one that did not (interrupted, failed: a resume runs it again); among equals, the
    newest. A run killed outright wrote no summary and is not here."""
    runs: dict[tuple[str, int], tuple[bool, float, Path]] = {}
    for path in out.rglob("summary.json"):
        summary = json.loads(path.read_text())
        rank = (summary.get("status") in ("completed", "collapsed"), path.stat().st_mtime, path.parent)
        key = (summary["name"], summary["seed"])
        runs[key] = max(runs.get(key, rank), rank)
    return {key: (ended, run_dir) for key, (ended, _, run_dir) in runs.items()}


def trained_with(run_dir: Path) -> list[str] | None:
    """The overrides a run was trained with (its ``.hydra/overrides.yaml``, Hydra's own and a
    ``resume=`` left out), or None where the run does not say."""
    import yaml

    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    return [o for o in yaml.safe_load(path.read_text()) or []
            if not o.startswith(("hydra.", "+hydra.", "resume="))]


def resume_problem(base: Path, plan: Plan, seeds: int, steps: int) -> str | None:
    """Why ``--resume base`` cannot go on with this plan (one line), or None: a run it would keep
    (one that ended) was trained with other overrides than this invocation gives the same arm and
    seed (another ``--steps``, a dose changed since), so the page would state one plan of runs of
    another. Checked before anything runs."""
    for dose, arms in plan:
        for (arm, seed), (ended, run_dir) in sorted(runs_in(base / dose).items()):
            if not ended or arm not in arms or seed >= seeds or (theirs := trained_with(run_dir)) is None:
                continue
            ours = sweep_overrides(dose, (arm,), (seed,), steps)
            if set(theirs) == set(ours):
                continue
            was, asked = " ".join(o for o in theirs if o not in ours), " ".join(o for o in ours if o not in theirs)
            differ = (f"with `{was}` where this invocation gives `{asked}`" if was and asked else
                      f"with `{was}` as well, which this invocation does not give" if was else
                      f"without `{asked}`, which this invocation gives")
            hint = next((f" (--steps {o.split('=', 1)[1]})" for o in theirs
                         if o.startswith("loop.steps=") and o not in ours), "")
            return (f"--resume: {run_dir.relative_to(base)} was trained {differ}; give the options the stopped "
                    f"invocation was started with{hint}, or start afresh without --resume")
    return None


def missing_sweeps(done: set[tuple[str, int]], arms: tuple[str, ...], seeds: int) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """The (arms, seeds) sweeps that make a dose's missing runs: one per set of missing seeds, with
    every arm that misses exactly those."""
    wanted: dict[tuple[int, ...], list[str]] = {}
    for arm in arms:
        missing = tuple(seed for seed in range(seeds) if (arm, seed) not in done)
        if missing:
            wanted.setdefault(missing, []).append(arm)
    return [(tuple(group), missing) for missing, group in wanted.items()]


def mean_of(rows: list[dict], key: str, part: slice) -> float:
    values = [r[key] for r in rows[part] if key in r and r[key] == r[key]]
    return statistics.fmean(values) if values else float("nan")


def collect(run_dir: Path, dose: str, eval_samples: int) -> RunResult:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    pass1 = se = None
    if summary.get("checkpoint"):
        score = evaluation(run_dir, eval_samples)
        pass1, se = score["mean"], score["stderr"]
    collapse = summary["collapse"]
    return RunResult(
        # Flagged: the monitor raised any episode (recovered or not); its verdict is the lasting one.
        arm=summary["name"], seed=summary["seed"], dose=dose,
        collapsed=bool(collapse["verdict"] or collapse.get("episodes")),
        collapse_step=collapse["step"] or next((e["start"] for e in collapse.get("episodes") or []), None),
        collapse_reason=collapse["reason"] or "; ".join(e.get("reason", "") for e in collapse.get("episodes") or []),
        reward_first=mean_of(rows, "reward/mean", slice(0, 10)), reward_last=mean_of(rows, "reward/mean", slice(-10, None)),
        kl_last=mean_of(rows, "mismatch/kl_k3", slice(-10, None)),
        format_last=mean_of(rows, "format/error_rate", slice(-10, None)),
        format_peak=worst_window(rows, "format/error_rate", 5),
        masked_frac=mean_of(rows, "correction/masked_frac", slice(None)),
        tail_ratio_max=max((r["correction/sc_tail_ratio"] for r in rows if "correction/sc_tail_ratio" in r),
                           default=float("nan")),
        clip_frac=mean_of(rows, "ppo/clip_frac", slice(None)),
        pass1=pass1, pass1_se=se,
        rewards=[r["reward/mean"] for r in rows], kls=[r.get("mismatch/kl_k3", float("nan")) for r in rows],
        run_s=summary.get("wall_time_s", float("nan")),
        pool_kls={key.removeprefix(POOL_KL): [r.get(key, float("nan")) for r in rows]
                  for key in dict.fromkeys(k for r in rows for k in r if k.startswith(POOL_KL) and "/lag_" not in k)},
        where=where_series(rows),
    )


def worst_window(rows: list[dict], key: str, n: int) -> float:
    """The largest mean of ``key`` over ``n`` consecutive rows that have it (NaN where none has): the
    peak ``rlmix report`` reads."""
    return max(trailing_means([r[key] for r in rows if key in r and r[key] == r[key]], n), default=float("nan"))


def where_series(rows: list[dict]) -> dict[str, list[float]]:
    """Each WHERE_COLUMNS series per step (NaN where a step left it out); empty for a run without where/."""
    if not any(key.startswith("where/") for key in rows[0]):
        return {}
    return {name: [sum(r.get(k, float("nan")) for k in keys) for r in rows] for name, (_, keys) in WHERE_COLUMNS.items()}


def evaluation(run_dir: Path, eval_samples: int) -> dict:
    """pass@1 of a run's final checkpoint on the test split: ``rlmix eval``, or the evaluation an
    earlier invocation already made of this run (a resume re-draws the page without re-scoring)."""
    path = run_dir / "eval_test" / "eval.json"
    if not (path.exists() and path.stat().st_mtime >= (run_dir / "summary.json").stat().st_mtime
            and json.loads(path.read_text()).get("samples") == eval_samples):
        run([RLMIX, "eval", f"checkpoint={run_dir}", "task.split=test", "eval.k=[1]", f"eval.samples={eval_samples}",
             "logger=disabled"], quiet=True)
    return json.loads(path.read_text())["pass_at_k"]["1"]


def mean_se(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and v == v]
    if not values:
        return float("nan"), float("nan")
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return statistics.fmean(values), se


def arm_table(results: list[RunResult], arms: tuple[str, ...]) -> str:
    lines = ["| arm | collapsed | collapse steps | reward, first 10 | reward, last 10 | kl_k3, last 10 | "
             "format errors, last 10 | format errors, worst 5 steps | MIS masked | SC ρ, max | PPO clipped | pass@1 test |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [r for r in results if r.arm == arm]
        if not mine:
            continue
        steps = ", ".join(str(r.collapse_step) for r in mine if r.collapsed) or "—"
        recovered = sum(r.collapsed and not r.lasting for r in mine)
        cells = [f"{sum(r.collapsed for r in mine)}/{len(mine)}" + (f" ({recovered} recovered)" if recovered else ""),
                 steps]
        for values, fmt in (([r.reward_first for r in mine], ".3f"), ([r.reward_last for r in mine], ".3f"),
                            ([r.kl_last for r in mine], ".1e"), ([r.format_last for r in mine], ".3f"),
                            ([r.format_peak for r in mine], ".3f"),
                            ([r.masked_frac for r in mine], ".1e"), ([r.tail_ratio_max for r in mine], ".2f"),
                            ([r.clip_frac for r in mine], ".1e"), ([r.pass1 for r in mine], ".3f")):
            m, se = mean_se(values)
            # nan: the arm does not have it; one run has no standard error
            cells.append("—" if m != m else f"{m:{fmt}}" + ("" if se != se else f" ± {se:{fmt}}"))
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    return "\n".join(lines)


def map_table(results: list[RunResult], arms: tuple[str, ...], doses: list[str]) -> str:
    """One row per dose, one column per arm: flagged / lasting collapses and mean held-out pass@1."""
    lines = ["| dose | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for dose in doses:
        cells = []
        for arm in arms:
            mine = [r for r in results if r.arm == arm and r.dose == dose]
            n = len(mine)
            cells.append(f"{sum(r.collapsed for r in mine)}/{n} · {sum(r.lasting for r in mine)}/{n} · "
                         f"{mean_se([r.pass1 for r in mine])[0]:.3f}" if mine else "—")
        lines.append(f"| `{dose}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


EARLY, LATE = 50, 20  # the steps early_and_late reads: the run's first, and those before its first flag


def early_and_late(runs: list[RunResult], series_of: Callable[[RunResult], list[float]]) -> tuple[float, float]:
    """A per-step series early in the run (steps 1-50) and just before the run was first flagged
    (the 20 steps before; a run never flagged: its last 20): medians over the steps, then the runs."""
    early, late = [], []
    for r in runs:
        series = series_of(r)
        end = (r.collapse_step - 1) if r.collapsed and r.collapse_step else len(series)
        for out, part in ((early, series[:EARLY]), (late, series[max(0, end - LATE):end])):
            if values := [v for v in part if v == v]:
                out.append(statistics.median(values))
    return (statistics.median(early) if early else float("nan"), statistics.median(late) if late else float("nan"))


def windows(results: list[RunResult]) -> str:
    """early_and_late's windows in the page's words, for the runs' own length: a 3-step run's are
    steps 1-3 and its last 3."""
    steps = max((len(r.rewards) for r in results), default=0) or EARLY
    shorter = " (a shorter run: all its steps)" if any(len(r.rewards) < min(EARLY, steps) for r in results) else ""
    late = min(LATE, steps)
    return (f"steps 1-{min(EARLY, steps)}{shorter} → the {late} steps before the run was first flagged "
            f"(never flagged: its last {late})")


def pool_table(results: list[RunResult], arms: tuple[str, ...]) -> str:
    """Where the mismatch sat: each pool's per-token KL (k3), early → before the first flag."""
    pools = list(dict.fromkeys(pool for r in results for pool in r.pool_kls))
    if not pools:
        return ""
    lines = ["| arm | " + " | ".join(pools) + " |", "|---|" + "---|" * len(pools)]
    for arm in arms:
        mine = [r for r in results if r.arm == arm and r.pool_kls]
        if mine:
            cells = []
            for pool in pools:
                if pool not in mine[0].pool_kls:
                    cells.append("—")
                    continue
                early, late = early_and_late(mine, lambda r: r.pool_kls.get(pool, []))
                cells.append(f"{early:.1e} → {late:.1e}")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def where_table(results: list[RunResult], arms: tuple[str, ...]) -> str:
    """Which tokens held the mismatch and carried the gradient (WHERE_COLUMNS), early → before the first
    flag. A column none of the runs logged (runs from before its metric existed) is left out."""
    logged = [name for name in WHERE_COLUMNS if any(v == v for r in results for v in r.where.get(name, []))]
    lines = ["| arm | " + " | ".join(WHERE_COLUMNS[name][0] for name in logged) + " |", "|---|" + "---|" * len(logged)]
    for arm in arms:
        mine = [r for r in results if r.arm == arm and r.where]
        if mine:
            cells = ("{:.3f} → {:.3f}".format(*early_and_late(mine, lambda r: r.where.get(name, []))) for name in logged)
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def paired_table(results: list[RunResult], against: str = "sc_mis") -> str:
    """Per seed, ``against`` minus each other arm on held-out pass@1: the same seed sees the same problems."""
    by = {(r.arm, r.seed): r for r in results}
    if against not in {r.arm for r in results}:
        return f"(no `{against}` arm in these runs)"
    seeds = sorted({r.seed for r in results})
    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± se |", "|---|" + "---|" * (len(seeds) + 1)]
    for arm in sorted({r.arm for r in results} - {against}):
        diffs = [by[(against, s)].pass1 - by[(arm, s)].pass1 for s in seeds
                 if (arm, s) in by and (against, s) in by and by[(arm, s)].pass1 is not None
                 and by[(against, s)].pass1 is not None]
        m, se = mean_se(diffs)
        lines.append(f"| {against} − {arm} | " + " | ".join(f"{d:+.3f}" for d in diffs) + f" | {m:+.3f} ± {se:.3f} |")
    return "\n".join(lines)


def plot_curves(results: list[RunResult], arms: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, arm in enumerate(arms):
        color = f"C{i}"
        for r in (r for r in results if r.arm == arm):
            smooth = [statistics.fmean(r.rewards[max(0, i - 9):i + 1]) for i in range(len(r.rewards))]
            axes[0].plot(range(1, len(smooth) + 1), smooth, color=color, alpha=0.7,
                         label=arm if r.seed == 0 else None)
            axes[1].semilogy(range(1, len(r.kls) + 1), r.kls, color=color, alpha=0.6)
    axes[0].set(xlabel="step", ylabel="reward/mean, mean of the last 10 steps", title="reward, every seed")
    axes[1].set(xlabel="step", ylabel="mismatch/kl_k3", title="sampler–trainer KL (k3)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_map(results: list[RunResult], arms: tuple[str, ...], doses: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, arm in enumerate(arms):
        def rate(flag, d):
            return statistics.fmean([flag(r) for r in results if r.arm == arm and r.dose == d] or [float("nan")])

        pass1 = [mean_se([r.pass1 for r in results if r.arm == arm and r.dose == d])[0] for d in doses]
        axes[0].plot(doses, [rate(lambda r: r.lasting, d) for d in doses], marker="o", color=f"C{i}", label=arm)
        axes[0].plot(doses, [rate(lambda r: r.collapsed, d) for d in doses], ls=":", color=f"C{i}", alpha=0.6)
        axes[1].plot(doses, pass1, marker="o", color=f"C{i}", label=arm)
    axes[0].set(ylabel="lasting collapses (dotted: flagged)", title="collapse rate by mismatch dose",
                ylim=(-0.05, 1.05))
    axes[1].set(ylabel="pass@1, test split", title="held-out pass@1 by mismatch dose")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_runs(path: Path) -> list[RunResult]:
    """An earlier invocation's ``runs.json``; columns it predates are NaN (shown as —)."""
    fields = RunResult.__dataclass_fields__
    return [RunResult(**{k: row.get(k, {} if k in ("pool_kls", "where") else float("nan")) for k in fields})
            for row in json.loads(path.read_text())]


def runs_json(results: list[RunResult]) -> str:
    """One run per line; the per-pool series at 4 significant digits (the page reads medians)."""
    def digits(series: dict[str, list[float]]) -> dict[str, list[float]]:
        return {name: [float(f"{v:.4g}") for v in values] for name, values in series.items()}

    rows = [dict(r.__dict__, pool_kls=digits(r.pool_kls), where=digits(r.where)) for r in results]
    return "[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n"


def write(profile: str, how: list[str], results: list[RunResult], doses: list[str], arms: tuple[str, ...],
          steps: int, wall_s: float | None, machines: str | None = None, probes: dict[str, dict] | None = None) -> Path:
    """The page ``docs/results_<profile>.md``, its figures, runs.json and (``probes``: each dose's
    ``probe_summary``) probes.json. ``machines``: what the runs ran on, where that is not this machine
    (a merge of earlier pages)."""
    out = ROOT / "docs" / f"results_{profile}.md"  # profile: page_name's, or --merge's --name
    figures = out.with_suffix("")
    figures.mkdir(parents=True, exist_ok=True)
    (figures / "runs.json").write_text(runs_json(results))
    probes = probes or {}
    if probes:
        (figures / "probes.json").write_text(json.dumps(probes, indent=1) + "\n")
    probe_part = ["## Mismatch at fixed weights (`rlmix probe`)\n",
                  f"Each dose's fleet against the trainer, on the model the runs start from: the {PROBE_PROMPTS} test "
                  "prompts, 8 samples each, seed 0, temperature 1 (docs/probe.md). KL per token: k3 over the "
                  "sampled tokens, and the exact full-vocabulary KL(pool ‖ trainer); router flips: (token, MoE "
                  "layer) pairs whose experts differ from the trainer's; the shares: the KL each factor causes "
                  "alone. The lag and the step size are not the fleet's numbers: a dose differing only in those "
                  "shares its probe. Commands:\n",
                  *[f"- `{dose}`: `{probes[dose]['command']}`" for dose in doses if dose in probes], "",
                  probe_table(probes, doses), ""] if probes else []
    if results:
        parts = results_parts(profile, how, results, doses, arms, steps, wall_s, machines, figures) + probe_part \
            + dose_parts(results, doses, arms)
    else:  # a page of probes alone (--probes-only), for --merge
        parts = [f"# Reproduction on the embedded default — `{profile}`\n", f"Machine: {machines or machine()}\n",
                 *how, "", *probe_part]
    out.write_text("\n".join(parts) + "\n")
    print(f"wrote {out}")
    return out


def headline_dose(doses: list[str]) -> str:
    return next((d for d in (HEADLINE, V1_HEADLINE) if d in doses), doses[0])


def results_parts(profile: str, how: list[str], results: list[RunResult], doses: list[str], arms: tuple[str, ...],
                  steps: int, wall_s: float | None, machines: str | None, figures: Path) -> list[str]:
    """The page's runs: the headline dose's tables and curves, then the map across doses (and its plot)."""
    headline = headline_dose(doses)
    run_min = sum(r.run_s for r in results) / 60  # NaN where a page predates it
    head = [r for r in results if r.dose == headline]
    plot_curves(head, arms, figures / "headline.png")
    parts = [f"# Reproduction on the embedded default — profile `{profile}`\n",
             f"Machine: {machines or machine()}  \n"
             + (f"Wall time: {wall_s / 60:.1f} min  \n" if wall_s is not None else "")
             + (f"Run time: {run_min:.1f} min, the runs' own wall times added up  \n" if run_min == run_min else "")
             + f"Steps per run: {steps}\n",
             *how,
             f"\n## {'Headline regime' if headline in (HEADLINE, V1_HEADLINE) else 'Dose'}: `{headline}` ({' '.join(DOSES[headline])})\n",
             arm_table(head, arms), "\nPaired by seed (held-out pass@1):\n", paired_table(head),
             *([f"\nWhere the mismatch sat: each pool's KL per token (k3), {windows(head)}; medians over steps, "
                "then seeds.\n",
                pool_table(head, arms)] if any(r.pool_kls for r in head) else []),
             *(["\nWhich tokens held the mismatch and carried the gradient (`where/`, docs/monitor_and_report.md): "
                "the tokens the trainer gives p < 0.1, their share of the step's tokens, of its Σ |log p − log q| "
                "and of its squared logit gradient; the share of that gradient the largest 1% of tokens held, "
                "the tokens whose p/q lay outside [0.2, 5], and (where the runs logged the ratio bands) those "
                "at p/q < 0.8, the down-weighted ones. The same windows and medians.\n",
                where_table(head, arms)] if any(r.where for r in head) else []),
             f"\n![reward and KL]({figures.name}/headline.png)\n"]
    # The map's axis is the mismatch dose: the doses the uncorrected arm ran at (a K variant for the
    # SC arms is not a dose of it, and has its own table below).
    map_doses = [d for d in doses if any(r.dose == d and r.arm == "reinforce" for r in results)] or doses
    if len(map_doses) > 1:
        map_arms = tuple(a for a in arms if any(r.arm == a and r.dose in map_doses for r in results))
        plot_map(results, map_arms, map_doses, figures / "map.png")
        parts += ["## Stability map\n", "Each cell: runs flagged by the collapse monitor · runs still down at the end "
                  f"(reward below its start, or format errors over {LASTING_FORMAT_ERRORS:.0%}) · mean pass@1 on the test split.\n",
                  map_table(results, map_arms, map_doses), "", f"![map]({figures.name}/map.png)\n"]
    return parts


def dose_parts(results: list[RunResult], doses: list[str], arms: tuple[str, ...]) -> list[str]:
    """One section per dose other than the headline's (which results_parts shows)."""
    headline = headline_dose(doses)
    parts: list[str] = []
    for dose in (d for d in doses if d != headline and any(r.dose == d for r in results)):
        mine = [r for r in results if r.dose == dose]
        parts += [f"### `{dose}`: {' '.join(DOSES[dose])}\n", arm_table(mine, arms), "",
                  *([pool_table(mine, arms), ""] if any(r.pool_kls for r in mine) else []),
                  *([where_table(mine, arms), ""] if any(r.where for r in mine) else [])]
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick",
                        help="; ".join(f"{name}: {profile.about}" for name, profile in PROFILES.items()))
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--steps", type=int, help="steps per run (default: the profile's)")
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--doses", help=f"comma-separated, instead of the profile's (of {', '.join(DOSES)})")
    parser.add_argument("--arms", help="comma-separated experiment presets, instead of the profile's")
    parser.add_argument("--merge", help="comma-separated runs.json files to draw one page from (runs nothing)")
    parser.add_argument("--name", help="the page's name with --merge: docs/results_<name>.md")
    parser.add_argument("--probes-only", action="store_true",
                        help="run only each dose's `rlmix probe` and write a page of them (with an empty runs.json, "
                             "for --merge)")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help="a stopped invocation's multirun/reproduce_<stamp>: keep its finished runs, run the rest "
                             "(give the same --profile, --doses, --arms, --seeds and --steps; refused, before "
                             "anything runs, where a run it would keep was trained with other overrides, "
                             "another --steps say)")
    args = parser.parse_args()
    if args.merge:
        paths = [Path(p) for p in args.merge.split(",")]
        if missing := [str(p) for p in paths if not p.is_file()]:
            parser.error(f"--merge: no such runs.json: {', '.join(missing)}")
        return merge(paths, args.name or "merged")
    if args.doses and not set(args.doses.split(",")) <= set(DOSES):
        parser.error(f"--doses: each of {', '.join(DOSES)}")

    if args.resume and not args.resume.is_dir():
        parser.error(f"--resume: {args.resume} is not a directory (multirun/reproduce_<stamp>)")
    base = args.resume.resolve() if args.resume else ROOT / "multirun" / f"reproduce_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    plan = PROFILES[args.profile].plan
    for flag, value in (("--seeds", args.seeds), ("--steps", args.steps), ("--eval-samples", args.eval_samples)):
        if value is not None and value < 1:  # --steps 0 ran the profile's 300; --seeds 0 probed for no run
            parser.error(f"{flag} {value}: must be at least 1")
    args.steps = args.steps or PROFILES[args.profile].steps
    if args.doses:
        plan = [(dose, dict(plan).get(dose, plan_arms(plan))) for dose in args.doses.split(",")]
    if args.arms:
        plan = [(dose, tuple(args.arms.split(","))) for dose, _ in plan]
    problem = plan_problem(plan, args.steps)
    if args.resume and not problem:
        problem = resume_problem(base, plan, args.seeds, args.steps)
    if problem:
        parser.error(problem)
    previous = {s: signal.signal(s, stop_between) for s in STOP_SIGNALS[1:]}
    try:
        reproduce(args, plan, base)
    except subprocess.CalledProcessError as err:  # rlmix printed why; the runs that ended are kept
        command = " ".join(err.cmd[1:3])
        if (signum := stop_signal(err.returncode)) is None:
            sys.exit(f"reproduce: `{command}` exited with {err.returncode} (above); "
                     f"to go on from here: --resume {base}")
        print(f"reproduce: interrupted ({signal_name(signum)}) during `{command}`, which stopped (above); the runs "
              f"that ended are kept; to go on from here: --resume {base}", file=sys.stderr)
        sys.exit(128 + signum)
    except Interrupted as stopped:  # a sweep whose runs had all ended
        print(f"reproduce: interrupted: {stopped.what}; to go on from here: --resume {base}", file=sys.stderr)
        sys.exit(128 + stopped.signum)
    except KeyboardInterrupt as err:  # between commands (the page, a plot): what ended is kept as well
        signum = err.signum if isinstance(err, Stopped) else signal.SIGINT
        print(f"reproduce: interrupted ({signal_name(signum)}); to go on from here: --resume {base}", file=sys.stderr)
        sys.exit(128 + signum)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def reproduce(args: argparse.Namespace, plan: list[tuple[str, tuple[str, ...]]], base: Path) -> None:
    """Run ``plan``'s sweeps under ``base`` (keeping the runs a stopped invocation finished there),
    evaluate every run and write the page."""
    runs = sum(len(arms) for _, arms in plan) * args.seeds
    start, how, results, ran = time.time(), [], [], False
    probes: dict[str, dict] = {}
    done: dict[tuple[str, ...], dict] = {}  # one probe per fleet
    name = page_name(args.profile, args.doses, args.arms, args.seeds, args.steps)
    if args.probes_only:  # a probe does not depend on the seeds or the steps
        for dose, _ in plan:
            probes[dose] = probe(base / dose, dose, done)
        plain = page_name(args.profile, args.doses, args.arms, SEEDS, PROFILES[args.profile].steps)
        write(f"{plain}_probes", [f"Probes of `{base.name}`, no runs (`--probes-only`).\n"], [], [d for d, _ in plan],
              (), args.steps, None, probes=probes)
        return
    for i, (dose, arms) in enumerate(plan, 1):
        pace = sum(r.run_s for r in results) / len(results) if results else float("nan")
        left = f", ~{(runs - len(results)) * pace / 3600:.1f} h of runs left at {pace:.0f} s a run" if pace == pace else ""
        print(f"[reproduce] dose {i}/{len(plan)} `{dose}`: {len(arms) * args.seeds} runs "
              f"({len(results)}/{runs} done, {(time.time() - start) / 60:.1f} min{left})", flush=True)
        out = base / dose
        began = time.time()
        kept = {key for key, (ended, _) in runs_in(out).items() if ended and key[0] in arms and key[1] < args.seeds}
        stamp, existed = time.strftime("%H-%M-%S"), out.exists()  # a resume never sweeps over a stopped run
        commands = [sweep(out / f"resumed_{stamp}_{k}" if existed else out, dose, group, seeds, args.steps)
                    for k, (group, seeds) in enumerate(missing_sweeps(kept, arms, args.seeds))]
        ran = ran or bool(commands)
        here = f", {(time.time() - began) / 60:.1f} min in this invocation" if commands or not kept else ""
        found = runs_in(out)
        for arm in arms:
            for seed in range(args.seeds):
                if (arm, seed) in found:  # every run that wrote a summary, failed ones too
                    results.append(collect(found[arm, seed][1], dose, args.eval_samples))
        full = f"`rlmix train -m {' '.join(sweep_overrides(dose, arms, args.seeds, args.steps))}`"
        if kept and commands:  # what the stopped invocation ran, then what this one ran
            full += f", stopped after {len(kept)} run{'s' * (len(kept) != 1)}" + "".join(
                f"; then `rlmix train -m {' '.join(overrides)}`" for overrides in commands)
        run_min = sum(r.run_s for r in results if r.dose == dose) / 60
        how.append(f"- `{dose}` ({len(arms) * args.seeds} runs: {run_min:.1f} min of run time{here}): {full}")
        probes[dose] = probe(out, dose, done)
    how.insert(0, "Commands (one sweep per dose; then `rlmix eval task.split=test eval.k=[1]` per run; each fleet's "
                  "`rlmix probe` in the last section):\n")
    if args.resume:
        how.insert(1, f"Resumed `{args.resume.name}`: the wall time above is this invocation's; each run's own "
                      "is `wall_time_s` in its summary.json.\n" if ran else
                      f"Re-drawn from `{args.resume.name}`, where every run had ended; the run time above is the "
                      "runs' own.\n")
    write(name, how, results, [dose for dose, _ in plan], plan_arms(plan), args.steps,
          time.time() - start if ran else None, probes=probes)


def page_machine(runs_json: Path) -> str | None:
    """The Machine line of the page a runs.json belongs to (``docs/results_v2_map/runs.json`` ->
    ``docs/results_v2_map.md``), or None where the page is missing or has none."""
    page = runs_json.parent.with_suffix(".md")
    lines = page.read_text().splitlines() if page.exists() else []
    return next((line.removeprefix("Machine:").strip() for line in lines if line.startswith("Machine:")), None)


def merge_problem(machines: dict[Path, str | None]) -> str | None:
    """Why the pages cannot be merged (one line), or None. The embedded models build, and runs train,
    differently on different CPUs, so runs of two named CPU models are not cells of one map. A page
    from before the Machine line named the CPU (``x86_64, 2 cores, ...``) does not say, and merges."""
    def cpu(line: str) -> str:  # "x86_64 AMD EPYC, 2 cores, ..." -> "AMD EPYC"; "" where not named
        return line.partition(",")[0].partition(" ")[2]

    named = [(path, cpu(line)) for path, line in machines.items() if line and cpu(line)]
    other = next(((path, name) for path, name in named if name != named[0][1]), None)
    if other is None:
        return None
    (a, ca), (b, cb) = named[0], other
    return (f"--merge: {a.parent.name} ran on {ca}, {b.parent.name} on {cb}; the embedded model builds "
            f"differently on each CPU, so merge the pages of one machine")


def merge(paths: list[Path], name: str) -> None:
    """One page from the runs of earlier invocations (each page keeps its commands and wall time)."""
    machines = {path: page_machine(path) for path in paths}
    if problem := merge_problem(machines):
        sys.exit(problem)
    runs = {path: load_runs(path) for path in paths}
    results = [r for path in paths for r in runs[path]]
    probes = {dose: found for path in paths for dose, found in load_probes(path).items()}  # a later page's wins
    known = list(dict.fromkeys(MAP_ARMS + SC_ARMS))
    arms = tuple(sorted({r.arm for r in results}, key=lambda a: (known.index(a) if a in known else len(known), a)))
    doses = [d for d in DOSES if any(r.dose == d for r in results) or d in probes]
    how = ["Drawn from the runs of earlier invocations (their pages hold the commands and wall times):\n",
           *[f"- [{p.parent.name}.md]({p.parent.name}.md) ({len(runs[p])} runs)" for p in paths]]
    stated = sorted({line for line in machines.values() if line})
    write(name, how, results, doses, arms, max((len(r.rewards) for r in results), default=0), None,
          machines="; ".join(stated) + " (as the pages drawn from state)" if stated else "not stated by the pages drawn from",
          probes=probes)


if __name__ == "__main__":
    main()
