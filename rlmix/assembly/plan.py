"""A run's config resolved once: the plan everything below the commands takes.

``plan_run(cfg)`` is validation. A config is valid when it resolves:

1. the config's own cross-field rules (``rlmix.assembly.rules.validate``: loop, trainer, monitor,
   paths, pool counts and truncation) — questions the schema alone can answer;
2. the correction, bound to its mode's row (``Correction``: weights, centring, head size);
3. each pool, by the backend that will serve it — a torch pool's precision view, a vLLM pool's
   engine settings (``rlmix.samplers.checks``) — read against the model's config.json, so an
   architecture or a format the backend cannot serve is refused before Ray starts;
4. the task's own rules (``rlmix.tasks.checks.TASK_CHECKS``: files load, rewards import), and its
   kind (``rlmix.assembly.task_kinds``: single-turn or episodes).

Each part is resolved here and nowhere else: the runner, the fleet's sampler specs, the probe and
the evaluation read the ``RunPlan``'s objects, never the config's strings, and ask the task's kind
what differs between tasks. Nothing is registered at import time; a backend or task without a rule,
or a task without a kind, is a ``KeyError`` here, in a test, not a skipped check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlmix.assembly.rules import model_fields, validate
from rlmix.config.schema import PoolConfig, RunConfig
from rlmix.correction import Correction
from rlmix.errors import ConfigError
from rlmix.assembly.task_kinds import TaskKind, task_kind
from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.checks import POOL_CHECKS
from rlmix.samplers.vllm_checks import VllmEngine
from rlmix.tasks.checks import task_check


@dataclass(frozen=True)
class PoolPlan:
    """One pool, resolved by its backend."""

    name: str
    config: PoolConfig
    view: PrecisionView | None  # torch backend: the emulated precision view
    engine: VllmEngine | None  # vllm backend: vLLM's dtype, quantisation and engine settings
    top_p: float
    top_k: int


@dataclass(frozen=True)
class RunPlan:
    """A validated run: its config and the parts resolved from it."""

    cfg: RunConfig
    correction: Correction
    pools: Mapping[str, PoolPlan]
    task: TaskKind  # the task config bound to its kind


def plan_pool(name: str, pool: PoolConfig, cfg: RunConfig, model: Mapping | None) -> PoolPlan:
    try:
        view, engine = POOL_CHECKS[pool.backend](name, pool, model)
    except ConfigError as err:
        if cfg.fleet.precision is not None and "precision" in str(err):  # the pool's format is fleet.precision's
            raise ConfigError(f"fleet.precision={cfg.fleet.precision}: {err}") from None
        raise
    top_p, top_k = cfg.fleet.truncation(pool)
    return PoolPlan(name, pool, view, engine, top_p, top_k)


def plan_run(cfg: RunConfig, for_training: bool = True) -> RunPlan:
    """``cfg`` resolved (see the module docstring), or the first ``ConfigError`` naming its keys.

    ``for_training=False`` (``rlmix eval``/``probe``): skip the rules only training needs (a
    dataset long enough for the run's steps, an agent task's training directory).
    """
    correction = validate(cfg, for_training)
    model = model_fields(cfg)
    pools = {name: plan_pool(name, pool, cfg, model) for name, pool in cfg.fleet.pools.items()}
    task_check(cfg.task)(cfg, for_training)
    return RunPlan(cfg, correction, pools, task_kind(cfg.task))
