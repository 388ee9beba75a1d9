"""How a run's torch threads are assigned from the CPU cores Ray reports (docs/performance.md).

Every process of a run computes on the same cores: the trainer between steps, each sampler while
it generates. Six single-threaded samplers plus a two-threaded trainer on two cores made the
trainer step take 2.9x its isolated time, and the six samplers together reached 0.59x of one
isolated sampler — threads that time-slice one core lose their caches and wait on each other's
spin locks. The plan below never hands out more threads than cores: the trainer gets its share,
the samplers the rest, and the loop lets only as many requests generate at once as the samplers'
cores hold (taking the samplers in turn, so every pool keeps contributing) — plus the trainer's
share while the trainer waits for a batch, so its cores are not left idle.

A synchronous loop (``loop.lag=0``, or the free-running loop at ``loop.max_staleness=0``, weights
published every step) never generates while the trainer trains: each batch needs the weights the
step is about to produce. There the two sides take turns on every core instead of splitting them.

A pool that runs on an accelerator (a vLLM engine on a GPU) computes off the CPU: it takes no
share of the cores and its requests are never held back.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlmix.config.schema import LoopConfig


@dataclass(frozen=True)
class CorePlan:
    cpus: int  # what Ray reports for the run
    trainer_threads: int
    sampler_threads: int  # per CPU sampler actor
    generating: int | None  # CPU-sampler requests generating at once; None = no limit
    idle_lanes: int = 0  # more of them while the trainer waits for a batch (its cores are free)
    synchronous: bool = False  # trainer and samplers take turns on every core

    def describe(self) -> str:
        limit = "unlimited" if self.generating is None else str(self.generating)
        shared = ("synchronous loop, the two take turns" if self.synchronous
                  else f"+{self.idle_lanes} while the trainer waits")
        return (f"{self.cpus} cores: trainer {self.trainer_threads} thread(s), samplers {self.sampler_threads} "
                f"thread(s) each, {limit} CPU request(s) generating at once ({shared})")


def is_synchronous(loop: LoopConfig) -> bool:
    """No request can generate while the trainer trains (see the module docstring)."""
    if loop.weight_sync_every != 1:
        return False  # a step between publications trains while the next batch generates
    return loop.lag == 0 if loop.lag is not None else loop.max_staleness == 0


def plan_cores(cpus: float, cpu_samplers: int, trainer_threads: int | None, sampler_threads: int | None,
               generating: int | None, node_cpus: float | None = None, synchronous: bool = False) -> CorePlan:
    """Split ``cpus`` between the trainer and ``cpu_samplers`` CPU sampler actors.

    A value given in the config wins; ``None`` is derived: the trainer takes half the cores
    (its step and a step's generation cost about the same here) — at most half of the largest
    node's (``node_cpus``), since its threads share one machine — and the samplers the rest, one
    thread each, as many generating as there are sampler cores. ``synchronous``: the two never
    run at once, so the trainer takes every core of its node and the samplers every core.
    """
    cores = max(int(cpus), 1)
    node = min(cores, int(node_cpus or cores))
    if synchronous:
        trainer = trainer_threads or node
        per_sampler = sampler_threads or 1
        if cpu_samplers == 0:
            return CorePlan(cores, trainer, per_sampler, None, synchronous=True)
        at_once = min(generating or max(cores // per_sampler, 1), cpu_samplers)
        return CorePlan(cores, trainer, per_sampler, at_once, synchronous=True)
    trainer = trainer_threads or max(node // 2, 1)
    sampler_cores = max(cores - trainer, 1)
    per_sampler = sampler_threads or 1
    if cpu_samplers == 0:
        return CorePlan(cores, trainer, per_sampler, None)
    at_once = generating or max(sampler_cores // per_sampler, 1)
    lent = 0 if generating else max(trainer // per_sampler, 0) if cores > 1 else 0
    at_once = min(at_once, cpu_samplers)
    return CorePlan(cores, trainer, per_sampler, at_once, min(lent, cpu_samplers - at_once))
