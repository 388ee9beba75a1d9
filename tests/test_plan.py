"""The run plan: a config resolved once (rlmix.assembly.plan), and the parts below read it, not the config."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlmix.assembly.fleet import resolve_fleet
from rlmix.assembly.parts import TASKS
from rlmix.assembly.plan import plan_run
from rlmix.assembly.task_kinds import EpisodeKind, SingleTurnKind, task_kind
from rlmix.commands.compose import compose_plan
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.schema import MiniCodeTaskConfig, MiniCodeTraceTaskConfig, SamplerBackend
from rlmix.config.swebench import AgentEnvConfig, MiniCodeAgentConfig, SwebenchProConfig
from rlmix.errors import ConfigError
from rlmix.samplers.accelerators import PrecisionView, resolve_view
from rlmix.samplers.checks import POOL_CHECKS
from rlmix.tasks.checks import TASK_CHECKS, task_check


def test_every_backend_and_every_task_has_its_rules():
    assert set(POOL_CHECKS) == set(SamplerBackend)
    assert all(set(cls.__mro__) & set(TASK_CHECKS) for cls in TASKS)  # its own rule or a base class's
    assert AgentEnvConfig in TASK_CHECKS  # an agent task never goes unchecked, whatever its subclass


def test_a_task_config_without_rules_is_a_programming_error_not_a_pass():
    @dataclasses.dataclass
    class Unknown:
        name: str = "unknown"

    with pytest.raises(KeyError, match="TASK_CHECKS"):
        task_check(Unknown())


@pytest.mark.parametrize("cls, kind", [
    (MiniCodeTaskConfig, SingleTurnKind), (MiniCodeTraceTaskConfig, SingleTurnKind), (DatasetTaskConfig, SingleTurnKind),
    (MiniCodeAgentConfig, EpisodeKind), (SwebenchProConfig, EpisodeKind), (AgentEnvConfig, EpisodeKind),
])
def test_each_task_config_resolves_to_its_kind(cls, kind):
    config = cls()
    resolved = task_kind(config)
    assert type(resolved) is kind and resolved.config is config


def test_every_task_has_a_kind_and_an_unknown_config_is_a_key_error():
    assert all(type(task_kind(cls())) in (SingleTurnKind, EpisodeKind) for cls in TASKS)

    @dataclasses.dataclass
    class Unknown:
        name: str = "unknown"

    with pytest.raises(KeyError, match="TASK_KINDS"):
        task_kind(Unknown())


def test_only_concurrent_episodes_are_a_caveat_to_a_controlled_lags_reruns():
    """tests/test_lag.py checks the exact reruns; this, which runs may not have them and say so."""
    assert task_kind(MiniCodeTaskConfig()).rerun_caveat() is None
    assert task_kind(MiniCodeAgentConfig(concurrent_episodes=1)).rerun_caveat() is None
    caveat = task_kind(MiniCodeAgentConfig(concurrent_episodes=8)).rerun_caveat()
    assert "task.concurrent_episodes=8" in caveat and "task.concurrent_episodes=1" in caveat


def test_the_plan_holds_the_task_bound_to_its_kind():
    assert type(compose_plan([]).task) is SingleTurnKind
    plan = compose_plan(["task=minicode_agent"])
    assert type(plan.task) is EpisodeKind and plan.task.config is plan.cfg.task


def test_each_pool_is_resolved_by_its_backend():
    plan = compose_plan(["fleet=emulated_hetero6"])
    assert set(plan.pools) == set(plan.cfg.fleet.pools)
    for name, pool in plan.pools.items():
        cfg = plan.cfg.fleet.pools[name]
        assert pool.config is cfg and pool.engine is None
        assert pool.view == resolve_view(cfg.accelerator, cfg.precision, cfg.kv_precision, cfg.allow_emulation)
        assert (pool.top_p, pool.top_k) == plan.cfg.fleet.truncation(cfg)
    assert plan.correction.variant.mode is plan.cfg.correction.mode


def test_a_vllm_pool_is_resolved_to_its_engine():
    plan = compose_plan(["fleet=vllm_cpu_smoke"])
    vllm, torch_pool = plan.pools["cpu_vllm_bf16"], plan.pools["a100_bf16"]
    assert vllm.view is None and vllm.engine.dtype == "bfloat16" and vllm.engine.quantization is None
    assert torch_pool.engine is None and torch_pool.view.label == resolve_view("A100", "bf16").label


def test_sampler_specs_take_the_plans_views_and_never_parse_a_precision_again():
    """Swap one pool's resolved view in the plan: the specs carry the swapped view, so nothing
    below the plan re-reads the pool's precision string."""
    plan = compose_plan(["fleet=smoke"])
    name = next(iter(plan.pools))
    exact = PrecisionView.exact()
    swapped = dataclasses.replace(plan, pools={**plan.pools, name: dataclasses.replace(plan.pools[name], view=exact)})
    specs = resolve_fleet(swapped, eos_id=2)
    assert {s.view for s in specs if s.pool == name} == {exact}
    assert all(s.params.num_candidates == plan.correction.head_size for s in specs)


def test_a_pool_the_backend_cannot_serve_is_refused_by_the_plan(tmp_path):
    model = tmp_path / "moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="model_type='gpt2'.*not supported by the torch sampler"):
        compose_plan(["fleet=smoke", f"model.path={model}"])


def test_validation_is_the_plan(tmp_path):
    """The config's own rules and the plan fail the same way: compose_plan is plan_run on the composed config."""
    plan = compose_plan(["+experiment=smoke"])
    assert plan_run(plan.cfg).pools.keys() == plan.pools.keys()
    with pytest.raises(ConfigError, match="loop.steps=0"):
        compose_plan(["+experiment=smoke", "loop.steps=0"])
    with pytest.raises(ConfigError, match="task.max_turns=0"):
        compose_plan(["task=minicode_agent", "task.max_turns=0"])
