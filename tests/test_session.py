"""A sweep's jobs share one Ray instance and reuse its actor processes, each starting from a clean state."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow


def _job(overrides: list[str], run_dir):
    import ray

    from rlmix.assembly.fleet import resolve_fleet
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.commands.compose import compose_run_config
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.orchestration.runner import core_plan, start_actors, start_ray

    run_dir.mkdir(parents=True)
    cfg = compose_run_config(["+experiment=smoke", "logger=disabled", *overrides])
    model_dir = resolve_model_dir(cfg)
    specs = resolve_fleet(cfg, load_fast_tokenizer(model_dir).eos_token_id)
    runtime_env = start_ray(cfg, specs, log_dir=run_dir)
    trainer, slots, ready = start_actors(cfg, specs, model_dir, core_plan(cfg, specs), runtime_env["env_vars"])
    return cfg, trainer, slots, ray.get(ready)


def _train_one_step(cfg, trainer, slots) -> int:
    import ray

    from rlmix.orchestration.workers import make_request, make_task
    from rlmix.rollout import concat_rollouts

    task = make_task(cfg.task, cfg.seed)
    parts = ray.get([s.actor.generate.remote(make_request(task, i, 2, cfg.seed), cfg.loop.group_size, None, 0)
                     for i, s in enumerate(slots)])
    version, _ = ray.get(trainer.train_step.remote(concat_rollouts(parts, 0)))
    return version


def test_jobs_of_a_sweep_reuse_ray_and_processes_with_fresh_state(tmp_path):
    import ray

    from rlmix.orchestration.session import SESSION

    try:
        cfg, trainer, slots, versions = _job([], tmp_path / "0")
        assert versions == [0, 0, 0]
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

        # Another seed changes the samplers' constructor arguments: Ray could restart a sampler
        # only from its first ones, so samplers are new processes; the trainer is still reused.
        cfg, trainer, slots, versions = _job(["seed=7"], tmp_path / "2")
        assert trainer._actor_id == ids[0]
        assert not {s.actor._actor_id for s in slots} & set(ids[1:])
        assert versions == [0, 0, 0]
        for slot in parked:  # the samplers no job took were ended, not left running
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(slot.actor.version.remote(), timeout=60)
        SESSION.release(keep=False)
        assert not ray.is_initialized()
    finally:
        SESSION.close()


def test_a_sampler_ray_restarted_while_idle_is_sent_the_weights_again(tmp_path):
    """Killed between requests, a sampler comes back (``max_restarts``) holding the initial weights
    while the driver believes it holds the newest: the next request must not be sampled from the
    initial policy. The worker refuses it; the loop queues it again and resends the weights."""
    import ray

    from rlmix.orchestration.loop import AsyncLoop
    from rlmix.orchestration.session import SESSION
    from rlmix.orchestration.workers import WeightsMissing, make_request, make_task

    try:
        cfg, trainer, slots, _ = _job([], tmp_path / "run")
        assert _train_one_step(cfg, trainer, slots) == 1
        slot = slots[0]
        weights = trainer.published_weights.remote()
        task = make_task(cfg.task, cfg.seed)
        ray.get(slot.actor.generate.remote(make_request(task, 0, 1, cfg.seed), cfg.loop.group_size, weights, 1))
        pid = ray.get(slot.actor.__ray_call__.remote(lambda worker: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # calls fail while Ray restarts it
            try:
                if ray.get(slot.actor.version.remote(), timeout=60) == 0:  # back, on the initial weights
                    break
            except ray.exceptions.RayActorError:
                time.sleep(0.5)
        else:
            pytest.fail("the killed sampler did not come back")

        loop = AsyncLoop(cfg.loop, trainer, slots, task, seed=cfg.seed, pad_id=0)
        loop.published, slot.version = 1, 1
        loop.weights_ref = weights
        request = make_request(task, 1, 1, cfg.seed)
        slot.inflight = request
        ref = slot.actor.generate.remote(request, cfg.loop.group_size, None, 1)
        with pytest.raises(ray.exceptions.RayTaskError) as refused:
            ray.get(ref)
        assert isinstance(refused.value.cause, WeightsMissing)
        loop._collect(ref, slot)
        assert list(loop.orphans) == [request] and slot.version == -1 and loop.sampler_restarts == 1
        assert loop._next_request(training=False) == request and loop.requests_reissued == 1
        part = ray.get(loop._submit(slot, request))  # stale now: the weights go with it
        assert set(part.policy_version.tolist()) == {1}
    finally:
        SESSION.close()
