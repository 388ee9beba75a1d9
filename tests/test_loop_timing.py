"""The loop's watchdog and its time accounting (rlmix/orchestration/loop.py), on a virtual clock.

Ray's calls are replaced by references that complete at set virtual times, and the actors by
objects that answer like the real ones: Ray is the transport, not what is tested here, and the
clock lets each test say exactly when a request, a trainer step or a publish ends.
"""

from __future__ import annotations

import dataclasses
import itertools
import types

import pytest
import ray
import torch

import rlmix.orchestration.loop as loop_module
from rlmix.config.schema import LoopConfig
from rlmix.embedded.minicode import MiniCode
from rlmix.errors import RunFailed
from rlmix.orchestration.loop import AsyncLoop, SamplerSlot
from rlmix.rollout import Rollouts


class Clock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass(eq=False)  # hashable by identity, as Ray's references are
class Ref:
    value: object
    done_at: float
    seq: int


class VirtualRay:
    """``ray.wait`` / ``ray.get`` over ``Ref``s: the earliest one is ready once the clock reaches it."""

    exceptions = ray.exceptions

    def __init__(self, clock: Clock):
        self.clock, self.seq = clock, itertools.count()

    def ref(self, value, after: float) -> Ref:
        return Ref(value, self.clock.now + after, next(self.seq))

    def wait(self, refs, num_returns=1, timeout=None, fetch_local=True):
        first = min(refs, key=lambda r: (r.done_at, r.seq))
        if timeout is not None and first.done_at > self.clock.now + timeout:
            self.clock.now += timeout
            return [], refs
        self.clock.now = max(self.clock.now, first.done_at)
        return [first], [r for r in refs if r is not first]

    @staticmethod
    def get(ref, timeout=None):
        return ref.value() if callable(ref.value) else ref.value

    @staticmethod
    def cancel(ref, force=False):
        pass


class Method:
    def __init__(self, fn):
        self.remote = fn


def rollouts(request, group_size: int, version: int, pool: str, reward) -> Rollouts:
    b = len(request.group_ids) * group_size
    return Rollouts(
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_lens=torch.full((b,), 2),
        completion_ids=torch.ones(b, 3, dtype=torch.long), mask=torch.ones(b, 3, dtype=torch.bool),
        sampler_logprobs=torch.zeros(b, 3), policy_version=torch.full((b,), version, dtype=torch.long),
        pool=(pool,) * b, finish_reason=("stop",) * b,
        group_ids=torch.tensor([g for g in request.group_ids for _ in range(group_size)]),
        rewards=reward(b), format_ok=torch.ones(b, dtype=torch.bool), reward_errors=torch.zeros(b, dtype=torch.bool))


class Sampler:
    def __init__(self, vray: VirtualRay, pool: str, seconds: float, reward):
        self.generate = Method(lambda request, group_size, weights, version, *rest: vray.ref(
            rollouts(request, group_size, version, pool, reward), seconds))


class Trainer:
    def __init__(self, vray: VirtualRay, step_s: float, publish_s: float):
        self.version = 0
        self._actor_id = types.SimpleNamespace(hex=lambda: "trainer")

        def step(batch):
            self.version += 1
            return vray.ref((self.version, {"train/tokens": float(batch.num_tokens)}), step_s)

        self.train_step = Method(step)
        self.published_weights = Method(lambda: vray.ref(f"weights {self.version}", publish_s))


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    vray = VirtualRay(clock)
    monkeypatch.setattr(loop_module, "ray", vray)
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(
        perf_counter=lambda: clock.now, monotonic=lambda: clock.now, sleep=clock.sleep))

    @dataclasses.dataclass
    class Window(loop_module._Window):
        start: float = dataclasses.field(default_factory=lambda: clock.now)

    monkeypatch.setattr(loop_module, "_Window", Window)
    clock.vray = vray
    return clock


def make_loop(clock: Clock, cfg: LoopConfig, *, samplers=2, request_s=0.1, step_s=1.0, publish_s=0.0,
              reward=lambda b: torch.arange(b, dtype=torch.float32) % 2) -> AsyncLoop:
    slots = [SamplerSlot(name=f"p{i}", pool=f"p{i}", actor=Sampler(clock.vray, f"p{i}", request_s, reward),
                         on_cpu=False) for i in range(samplers)]
    return AsyncLoop(cfg, Trainer(clock.vray, step_s, publish_s), slots, MiniCode(seed=0), seed=0, pad_id=0)


def run(loop: AsyncLoop, steps: int) -> list[dict[str, float]]:
    reports = []
    loop.run(steps, lambda report: reports.append(report.metrics) or True)
    return reports


def test_a_publish_is_its_own_steps_time_not_the_next_steps_idle(clock):
    # Batches are always ready (fast samplers), so the trainer never waits: every step's idle share
    # is 0, and the 2 s publish after every second step is that step's, in time/weight_sync_s.
    cfg = LoopConfig(steps=6, groups_per_step=4, group_size=2, groups_per_request=2, weight_sync_every=2)
    metrics = run(make_loop(clock, cfg, samplers=4, publish_s=2.0), 6)
    def column(key, first=0):
        return [round(m[key], 6) for m in metrics[first:]]

    assert column("time/weight_sync_s") == [0.0, 2.0, 0.0, 2.0, 0.0, 2.0]
    assert column("time/trainer_idle_frac", first=1) == [0.0] * 5
    assert column("time/step_s", first=1) == [3.0, 1.0, 3.0, 1.0, 3.0]
    # 24 tokens a step: 24/s on a 1 s step, 8/s on a step that also published for 2 s
    assert column("throughput/trainer_tokens_per_s", first=1) == [8.0, 24.0, 8.0, 24.0, 8.0]


def test_the_watchdog_fires_while_requests_keep_coming_back(clock):
    # Every group scores alike, so dynamic sampling drops them all: requests come back every 0.1 s
    # (no poll is ever empty) and no step is ever trained. The run must fail at loop.step_timeout_s.
    cfg = LoopConfig(steps=2, groups_per_step=4, group_size=2, groups_per_request=2, dynamic_sampling=True,
                     step_timeout_s=30)
    loop = make_loop(clock, cfg, reward=lambda b: torch.zeros(b))
    with pytest.raises(RunFailed, match="no trainer step finished in 30 s"):
        loop.run(2, lambda report: True, stop=lambda: clock.now > 300)
    assert 30 <= clock.now < 31


def test_a_trainer_step_that_raises_fails_the_run_in_one_line(clock):
    # Not a death (Ray would say RayActorError, and the trainer is replaced): the step itself raised.
    cfg = LoopConfig(steps=3, groups_per_step=4, group_size=2, groups_per_request=2)
    loop = make_loop(clock, cfg)

    def out_of_memory():
        raise ray.exceptions.RayTaskError("train_step", "Traceback ...", MemoryError("CPU out of memory"))

    loop.trainer.train_step = Method(lambda batch: clock.vray.ref(out_of_memory, 1.0))
    with pytest.raises(RunFailed, match=r"^the trainer failed step 1: MemoryError: CPU out of memory$"):
        run(loop, 3)


def test_every_key_the_loop_adds_is_a_named_metric(clock):
    """docs/architecture.md: every metric key is a constant of rlmix.metrics.names, or one with a
    suffix; the loop's own keys (the trainer's come from it) are checked here."""
    from rlmix.metrics import names

    constants = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    cfg = LoopConfig(steps=2, groups_per_step=4, group_size=2, groups_per_request=2)
    for metrics in run(make_loop(clock, cfg), 2):
        unnamed = [k for k in metrics if k not in constants and k.rsplit("/", 1)[0] not in constants]
        assert unnamed == [], unnamed
