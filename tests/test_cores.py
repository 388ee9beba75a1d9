"""Threads from the cores Ray reports, and the loop's share-out of them between samplers."""

from __future__ import annotations

import pytest

from rlmix.config.schema import LoopConfig
from rlmix.orchestration.cores import is_synchronous, plan_cores
from rlmix.orchestration.loop import AsyncLoop, SamplerSlot, SlotState
from rlmix.embedded.minicode import MiniCode


@pytest.mark.parametrize("cpus,samplers,expected", [
    (2, 6, (1, 1, 1)),  # the default run here: one core trains, one generates
    (1, 2, (1, 1, 1)),  # one core cannot be split: both sides get one thread
    (16, 6, (8, 1, 6)),  # more sampler cores than samplers: all of them generate
    (16, 12, (8, 1, 8)),
])
def test_derived_plan_never_hands_out_more_threads_than_cores(cpus, samplers, expected):
    plan = plan_cores(cpus, samplers, None, None, None)
    assert (plan.trainer_threads, plan.sampler_threads, plan.generating) == expected
    if cpus > 1:
        assert plan.trainer_threads + plan.sampler_threads * plan.generating <= cpus  # trainer busy
        assert plan.sampler_threads * (plan.generating + plan.idle_lanes) <= cpus  # trainer waiting


def test_on_a_cluster_the_trainer_takes_half_of_one_node_and_the_samplers_the_rest():
    plan = plan_cores(64, 24, None, None, None, node_cpus=16)
    assert (plan.trainer_threads, plan.generating) == (8, 24)


def test_configured_values_win_and_gpu_only_fleets_are_not_held_back():
    plan = plan_cores(8, 6, trainer_threads=2, sampler_threads=2, generating=None)
    assert (plan.trainer_threads, plan.sampler_threads, plan.generating) == (2, 2, 3)
    assert plan_cores(8, 6, None, None, generating=5).generating == 5
    assert plan_cores(8, 0, None, None, None).generating is None


class _Recorder:
    """Stands in for a Ray actor handle: ``generate.remote`` returns a fresh key for the in-flight map."""

    def __init__(self):
        self.generate = self

    def remote(self, *args):
        return object()


def _loop(generating, on_cpu=(True,) * 6, groups_per_step=16, idle_lanes=0):
    cfg = LoopConfig(groups_per_step=groups_per_step, group_size=2, groups_per_request=2)
    slots = [SamplerSlot(name=f"p{i}/0", pool=f"p{i}", actor=_Recorder(), on_cpu=c) for i, c in enumerate(on_cpu)]
    return AsyncLoop(cfg, trainer=None, samplers=slots, task=MiniCode(seed=0), seed=0, pad_id=0,
                     generating=generating, idle_lanes=idle_lanes)


def _start_round(loop: AsyncLoop, training: bool = True) -> list[str]:
    """The pools ``AsyncLoop._fill`` starts a request on in one pass of the loop."""
    inflight: dict = {}
    loop._fill(inflight, training=training)
    return [slot.pool for slot in inflight.values()]


def test_a_limit_of_one_generates_one_request_at_a_time_from_every_pool_in_turn():
    loop = _loop(generating=1)
    order = []
    for _ in range(12):
        started = _start_round(loop)
        assert len(started) == 1  # never two CPU requests at once
        order += started
        next(s for s in loop.samplers if s.inflight).inflight = None  # that request finished
    assert order == [f"p{i % 6}" for i in range(12)]  # each pool in turn, none starved


def test_accelerator_samplers_are_not_counted_against_the_cpu_limit():
    loop = _loop(generating=1, on_cpu=(True, True, False, False))
    assert sorted(_start_round(loop)) == ["p0", "p2", "p3"]
    assert _loop(generating=None)._sampler_lanes() == 6
    assert loop._sampler_lanes() == 3  # one CPU lane + two accelerators


def test_while_the_trainer_waits_its_cores_generate_too():
    plan = plan_cores(2, 6, None, None, None)
    assert (plan.generating, plan.idle_lanes) == (1, 1)
    loop = _loop(generating=plan.generating, idle_lanes=plan.idle_lanes)
    assert _start_round(loop, training=False) == ["p0", "p1"]  # trainer idle: both cores generate
    loop.samplers[0].inflight = loop.samplers[1].inflight = None
    assert _start_round(loop, training=True) == ["p2"]  # trainer busy: one core is the samplers'


@pytest.mark.parametrize("loop,expected", [
    (LoopConfig(lag=0), True),
    (LoopConfig(lag=1), False),
    (LoopConfig(max_staleness=0), True),
    (LoopConfig(max_staleness=1), False),
    (LoopConfig(), False),  # the default: free-running, unbounded
    (LoopConfig(lag=0, weight_sync_every=2), False),  # the step between publications overlaps generation
    (LoopConfig(lag=2, max_staleness=0), False),  # the controlled lag decides, not the bound
])
def test_a_loop_is_synchronous_only_when_no_request_can_generate_during_a_step(loop, expected):
    assert is_synchronous(loop) is expected


def test_a_synchronous_loop_gives_every_core_to_whichever_side_is_working():
    plan = plan_cores(2, 6, None, None, None, synchronous=True)
    assert (plan.trainer_threads, plan.sampler_threads, plan.generating, plan.idle_lanes) == (2, 1, 2, 0)
    assert plan_cores(16, 6, None, None, None, synchronous=True).generating == 6  # never more than the samplers
    assert plan_cores(64, 24, None, None, None, node_cpus=16, synchronous=True).trainer_threads == 16
    configured = plan_cores(8, 6, trainer_threads=3, sampler_threads=2, generating=None, synchronous=True)
    assert (configured.trainer_threads, configured.generating) == (3, 4)
    assert "take turns" in plan.describe()


def test_a_dropped_sampler_holds_no_lane():
    # time/sampler_busy_frac divides by the lanes: two of four accelerator samplers dropped for good
    # leave two lanes, so the two left busy all the time read 1.0, not 0.5.
    loop = _loop(generating=None, on_cpu=(False,) * 4)
    for slot in loop.samplers[2:]:
        slot.state = SlotState.dropped
    assert loop._sampler_lanes() == 2
