"""A sweep's jobs share one Ray instance and reuse its actor processes, each starting from a clean state."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlmix.orchestration.session import _children
from tests.faults import parent, title

pytestmark = pytest.mark.slow


def _job(overrides: list[str], run_dir):
    import ray

    from rlmix.assembly.fleet import resolve_fleet
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.commands.compose import compose_plan
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.orchestration.runner import core_plan, start_actors, start_ray

    run_dir.mkdir(parents=True)
    plan = compose_plan(["+experiment=smoke", "logger=disabled", *overrides])
    cfg, correction = plan.cfg, plan.correction
    model_dir = resolve_model_dir(plan)
    specs = resolve_fleet(plan, load_fast_tokenizer(model_dir).eos_token_id)
    env_vars = start_ray(cfg, specs, log_dir=run_dir)
    trainer, slots, ready = start_actors(plan, specs, model_dir, core_plan(cfg, specs), env_vars)
    return cfg, trainer, slots, ray.get(ready)


def _train_one_step(cfg, trainer, slots) -> int:
    import ray

    from rlmix.orchestration.workers import make_request
    from rlmix.assembly.parts import make_task
    from rlmix.rollout import concat_rollouts

    task = make_task(cfg.task, cfg.seed)
    parts = ray.get([s.actor.generate.remote(make_request(task, i, 2, cfg.seed), cfg.loop.group_size, None, 0, s.job)
                     for i, s in enumerate(slots)])
    version, _ = ray.get(trainer.train_step.remote(concat_rollouts(parts, 0)))
    return version


def _holds(slot) -> tuple[int, int]:
    """(job token, task seed) the sampler process holds now."""
    import ray

    return ray.get(slot.actor.__ray_call__.remote(lambda worker: (worker.job(), worker.produce.task.seed)))


def _kill_and_await_restart(slot) -> None:
    """SIGKILL the sampler's process and wait until Ray has restarted it (``max_restarts``)."""
    import ray

    pid = ray.get(slot.actor.__ray_call__.remote(lambda worker: os.getpid()))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # calls fail while Ray restarts it
        try:
            if ray.get(slot.actor.version.remote(), timeout=60) == 0:  # back, on the initial weights
                return
        except ray.exceptions.RayActorError:
            time.sleep(0.5)
    pytest.fail("the killed sampler did not come back")


def _ray_helpers_started() -> list[str]:
    """The Ray helper scripts among this process's children (the local instance's processes)."""
    helpers = ("autoscaler/_private/monitor.py", "dashboard/dashboard.py", "_private/log_monitor.py")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if parent(int(pid)) != os.getpid():
                continue
            argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:  # ended meanwhile
            continue
        found += [h for h in helpers if any(a.endswith(h) for a in argv)]
    return found


def test_jobs_of_a_sweep_reuse_ray_and_processes_with_fresh_state(tmp_path):
    import ray

    from rlmix.seeds import derive_seed
    from rlmix.orchestration.session import SESSION

    try:
        cfg, trainer, slots, versions = _job([], tmp_path / "0")
        assert versions == [0, 0, 0]
        # No runtime_env (each would start through a second interpreter); the actors took theirs.
        assert not ray.get_runtime_context().runtime_env and (tmp_path / "0" / "workers.log").is_file()
        # Nor the helpers a local instance never uses (the autoscaler, the dashboard, the log monitor).
        assert _ray_helpers_started() == [] and ray.get_runtime_context().get_node_id()
        gcs = ray.get_runtime_context().gcs_address
        assert _train_one_step(cfg, trainer, slots) == 1
        ids = [trainer._actor_id] + [s.actor._actor_id for s in slots]
        SESSION.release(keep=True)

        # Same samplers, another learning rate: every process is reused, every state is fresh.
        cfg, trainer, slots, versions = _job(["trainer.lr=1e-4"], tmp_path / "1")
        assert ray.get_runtime_context().gcs_address == gcs
        assert [trainer._actor_id] + [s.actor._actor_id for s in slots] == ids
        assert versions == [0, 0, 0] and ray.get(trainer.version.remote()) == 0
        assert _train_one_step(cfg, trainer, slots) == 1
        SESSION.release(keep=True)
        parked = slots
        # A reused process writes its output to its own job's run directory.
        assert (tmp_path / "1" / "workers.log").is_file()

        # Another seed changes the samplers' constructor arguments: they are reused too, and hold
        # this job's seed and token.
        cfg, trainer, slots, versions = _job(["seed=7"], tmp_path / "2")
        assert [trainer._actor_id] + [s.actor._actor_id for s in slots] == ids
        assert versions == [0, 0, 0] and ray.get(trainer.version.remote()) == 0
        assert [_holds(s) for s in slots] == [(s.job, derive_seed(7, s.name)) for s in slots]
        assert _train_one_step(cfg, trainer, slots) == 1
        SESSION.release(keep=True)

        # A fleet without the A100 pool: its sampler is ended, not left running.
        cfg, trainer, slots, versions = _job(["seed=7", "~fleet.pools.a100_bf16"], tmp_path / "3")
        assert [s.actor._actor_id for s in slots] == [ids[1]] and versions == [0, 0]
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(parked[1].actor.version.remote(), timeout=60)
        raylet = next(pid for pid in _children(os.getpid()) if title(pid).endswith("/raylet"))
        under_raylet = _children(raylet)  # its agents, the job's workers
        assert under_raylet
        SESSION.release(keep=False)
        assert not ray.is_initialized()
        # Ended without Ray's graceful second per process, and nothing the raylet started outlives it.
        deadline = time.monotonic() + 30
        while (left := [pid for pid in under_raylet if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, [title(pid) for pid in left]
    finally:
        SESSION.close()


def _alive(pid: int) -> bool:
    """Running, not only a zombie left for its parent to reap."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _until_ready(loop, slot) -> list[str]:
    """Answer a restarting slot's probes and resets as ``AsyncLoop.run`` does, until it takes
    requests again; returns the states it went through."""
    import ray

    from rlmix.orchestration.loop import SlotState

    probes: dict = {}
    states: list[str] = []
    deadline = time.monotonic() + 120
    while slot.state is not SlotState.ready:
        assert time.monotonic() < deadline, f"sampler {slot.name} still {slot.state.value}"
        if not states or states[-1] != slot.state.value:
            states.append(slot.state.value)
        loop._probe_restarting(probes)
        for ref in ray.wait(list(probes), num_returns=1, timeout=1.0)[0]:
            loop._probed(ref, probes.pop(ref), probes)
    return states


def _refused(ref) -> str:
    """The message of a sampler's refusal (``NotHeld``)."""
    import ray

    from rlmix.orchestration.workers import NotHeld

    with pytest.raises(ray.exceptions.RayTaskError) as refused:
        ray.get(ref)
    assert isinstance(refused.value.cause, NotHeld)
    return str(refused.value.cause)


def test_a_process_that_has_served_nothing_refuses_a_driver_that_saw_it_serve(tiny_llama_dir):
    """A sampler Ray re-created while idle, when the old process held only the initial weights,
    holds what the driver believes: the next request would be served rightly and the death never
    counted. A process that has served nothing refuses a driver that saw its sampler serve."""
    from rlmix.assembly.fleet import SamplerSpec, sampling_params
    from rlmix.assembly.parts import make_task
    from rlmix.assembly.plan import plan_pool
    from rlmix.assembly.rules import resolve_correction
    from rlmix.assembly.task_kinds import task_kind
    from rlmix.config.schema import MiniCodeTaskConfig, PoolConfig, RunConfig
    from rlmix.orchestration.workers import NotHeld, SamplerWorker, make_request

    pool = PoolConfig(accelerator="A100", precision="bf16")
    cfg = RunConfig(task=MiniCodeTaskConfig())
    cfg.loop.max_new_tokens = 4
    planned = plan_pool("a100", pool, cfg, None)
    spec = SamplerSpec("a100", 0, pool, sampling_params(planned, cfg, resolve_correction(cfg.correction), (2,)),
                       planned.view)
    task = make_task(cfg.task, 0)

    def worker() -> SamplerWorker:
        return SamplerWorker(spec, str(tiny_llama_dir), task_kind(cfg.task), seed=0, threads=1)

    first = worker()
    assert len(first.generate(make_request(task, 0, 1, 0), 2, None, 0, served=False)) == 2
    assert len(first.generate(make_request(task, 1, 1, 0), 2, None, 0, served=True)) == 2
    with pytest.raises(NotHeld, match="has served none"):  # the process Ray made in its place
        worker().generate(make_request(task, 1, 1, 0), 2, None, 0, served=True)


def test_a_sampler_ray_restarted_while_idle_is_sent_the_weights_again(tmp_path):
    """Killed between requests, a sampler comes back (``max_restarts``) holding the initial weights
    while the driver believes it holds the newest: the next request must not be sampled from the
    initial policy. The worker refuses it; the loop queues it again and resends the weights."""
    import ray

    from rlmix.orchestration.loop import AsyncLoop
    from rlmix.orchestration.session import SESSION
    from rlmix.orchestration.workers import make_request
    from rlmix.assembly.parts import make_task

    try:
        cfg, trainer, slots, _ = _job([], tmp_path / "run")
        assert _train_one_step(cfg, trainer, slots) == 1
        slot = slots[0]
        weights = trainer.published_weights.remote()
        task = make_task(cfg.task, cfg.seed)
        request = make_request(task, 0, 1, cfg.seed)
        ray.get(slot.actor.generate.remote(request, cfg.loop.group_size, weights, 1, slot.job))
        _kill_and_await_restart(slot)

        loop = AsyncLoop(cfg.loop, trainer, slots, task, seed=cfg.seed, pad_id=0)
        loop.published, slot.version = 1, 1  # the driver believes it holds version 1: no weights go
        loop.weights_ref = weights
        request = make_request(task, 1, 1, cfg.seed)
        ref = loop._submit(slot, request)
        assert "holds weight version 0" in _refused(ref)
        loop._collect(ref, slot)
        assert list(loop.orphans) == [request] and slot.version == -1
        assert _until_ready(loop, slot) == ["restarting"]  # created by this job: nothing to re-initialise
        assert loop.sampler_restarts == 1
        assert loop._next_request(training=False) == request
        assert loop.requests_reissued == 0  # refused before generating: sent again, nothing lost
        part = ray.get(loop._submit(slot, request))  # stale now: the weights go with it
        assert set(part.policy_version.tolist()) == {1}
    finally:
        SESSION.close()


def test_a_reused_sampler_ray_restarts_from_an_earlier_job_is_reset_to_this_jobs_arguments(tmp_path):
    """Job 2 of a sweep reuses job 1's sampler process with another seed and completion length.
    Killed, Ray re-creates it from the arguments it was created with: job 1's. It must not sample
    for job 2 like that: it refuses, the loop re-initialises it with job 2's arguments, and the
    request is served by job 2's sampler with job 2's weights."""
    import ray

    from rlmix.seeds import derive_seed
    from rlmix.orchestration.loop import AsyncLoop
    from rlmix.orchestration.session import SESSION
    from rlmix.orchestration.workers import make_request
    from rlmix.assembly.parts import make_task

    try:
        first, _, slots, _ = _job([], tmp_path / "1")
        first_job = slots[0].job
        SESSION.release(keep=True)
        cfg, trainer, slots, _ = _job(["seed=7", "loop.max_new_tokens=4"], tmp_path / "2")
        slot = slots[0]
        assert slot.job == first_job + 1 and _holds(slot) == (slot.job, derive_seed(7, slot.name))
        assert _train_one_step(cfg, trainer, slots) == 1
        _kill_and_await_restart(slot)
        assert _holds(slot) == (first_job, derive_seed(first.seed, slot.name))

        task = make_task(cfg.task, cfg.seed)
        loop = AsyncLoop(cfg.loop, trainer, slots, task, seed=cfg.seed, pad_id=0)
        loop.version = loop.published = slot.version = 1
        loop.weights_ref = trainer.published_weights.remote()
        request = make_request(task, 0, 1, cfg.seed)
        ref = loop._submit(slot, request)
        assert f"holds job {first_job}'s arguments" in _refused(ref)
        loop._collect(ref, slot)
        assert _until_ready(loop, slot) == ["restarting", "resetting"]
        assert _holds(slot) == (slot.job, derive_seed(7, slot.name)) and loop.sampler_restarts == 1
        part = ray.get(loop._submit(slot, loop._next_request(training=False)))
        assert set(part.policy_version.tolist()) == {1}  # the weights went with the request
        assert part.completion_ids.shape[1] <= 4 < first.loop.max_new_tokens  # job 2's length, not job 1's
    finally:
        SESSION.close()


def test_weights_that_died_with_the_trainer_are_its_death_not_the_samplers(tmp_path):
    """A sampler sent the weights of a trainer that died while publishing them fails with the
    trainer's death: the loop restarts the trainer instead of counting (and dropping) a sampler."""
    import ray

    from rlmix.errors import TrainerDied
    from rlmix.orchestration.loop import AsyncLoop, SlotState
    from rlmix.orchestration.session import SESSION
    from rlmix.orchestration.workers import make_request
    from rlmix.assembly.parts import make_task

    try:
        cfg, trainer, slots, _ = _job([], tmp_path / "run")
        os.kill(ray.get(trainer.__ray_call__.remote(lambda worker: os.getpid())), signal.SIGKILL)
        task = make_task(cfg.task, cfg.seed)
        loop = AsyncLoop(cfg.loop, trainer, slots, task, seed=cfg.seed, pad_id=0)
        loop.weights_ref, loop.published = trainer.published_weights.remote(), 1
        slot, request = slots[0], make_request(task, 0, 1, cfg.seed)
        ref = loop._submit(slot, request)
        ray.wait([ref], timeout=120)
        with pytest.raises(TrainerDied, match="publishing step 1's weights"):
            loop._collect(ref, slot)
        assert slot.deaths == 0 and slot.state is SlotState.ready
        assert list(loop.orphans) == [request]  # served again once a trainer publishes weights
    finally:
        SESSION.close()
