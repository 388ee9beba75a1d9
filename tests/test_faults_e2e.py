"""Fault injection through the real CLI: killed actors, a killed driver, a hung trainer, non-finite steps.

Each test starts ``rlmix train`` in its own session (tests/faults.py), waits for a condition on
disk (never a fixed sleep), injects the fault into a process of that session only, and checks what
the run left behind. Signals are test_signals_e2e.py's. docs/reliability.md maps each fault to its
test here.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.faults import SMOKE, Run, actor_pids, complete, rows, summary, title

pytestmark = pytest.mark.slow


def test_a_killed_sampler_is_restarted_and_every_step_is_trained_once(tmp_path):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=16", f"hydra.run.dir={run_dir}")
    # Killed in the middle of a request (Ray titles an actor's process ray::<Actor>.<method> while the
    # method runs): an idle sampler's death costs no request, so nothing would be re-issued.
    # Held inside generate before the kill: a request that ended between the look and the kill would
    # leave nothing to re-issue.
    generating = run.hold_inside(run_dir, "SamplerWorker.generate", 1, "a sampler generating after the first step")
    os.kill(generating, signal.SIGKILL)
    assert run.finish() == 0, run.text()
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, 17))
    assert summary(run_dir)["fault"]["requests_reissued"] >= 1  # the dead actor's request was served again
    assert summary(run_dir)["status"] in ("completed", "collapsed")  # the smoke toy may collapse: not a fault
    assert "sampler " in run.text() and " died " in run.text()  # the warning (logged to the console)


def test_a_sampler_killed_while_idle_is_restarted_and_costs_no_request(tmp_path):
    """Synchronous training (max_staleness=0) starts no request while the trainer trains, so a sampler
    is idle for as long as the trainer is held inside a step (SIGSTOP). Killed then, its death costs
    no request: the re-created process, which has served nothing, refuses the next one before
    generating, and the driver counts a restart. (Whether the killed process had been sent weights
    by then depends on which sampler served steps 1 and 2; the refusal does not.)"""
    run_dir = tmp_path / "run"
    steps = 40  # room to catch the trainer inside a 0.2 s step under load: 8 were sometimes all missed
    run = Run(tmp_path, *SMOKE, f"loop.steps={steps}", "loop.max_staleness=0", f"hydra.run.dir={run_dir}")
    stopped = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    try:
        samplers = actor_pids(run.proc.pid, "SamplerWorker")
        assert len(samplers) == 2 and all(title(p) == "ray::SamplerWorker" for p in samplers), samplers
        os.kill(samplers[0], signal.SIGKILL)

        # Ray re-creates it before the step ends, so the next request meets the new process.
        def restarted() -> bool:
            now = actor_pids(run.proc.pid, "SamplerWorker")
            return samplers[0] not in now and len(now) == 2 and all(title(p) == "ray::SamplerWorker" for p in now)

        run.wait_for(restarted, "Ray restarting the sampler")
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert run.finish() == 0, run.text()
    assert [r["step"] for r in rows(run_dir)] == list(range(1, steps + 1))
    fault = summary(run_dir)["fault"]
    assert fault == {"sampler_restarts": 1, "requests_reissued": 0, "trainer_restarts": 0}, fault
    assert "was restarted by Ray while idle" in run.out.read_text() + run.err.read_text()


def test_a_killed_driver_resumes_from_the_newest_complete_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    common = [*SMOKE, "loop.checkpoint_every=2"]
    first = Run(tmp_path, *common, "loop.steps=200", f"hydra.run.dir={run_dir}")
    first.wait_for(lambda: len(complete(run_dir)) >= 2, "two complete checkpoints")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.finish()
    newest, previous = complete(run_dir)[-1], complete(run_dir)[-2]
    weights = run_dir / "checkpoints" / f"step_{newest}" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # the newest checkpoint, cut short on disk
    total = newest + 3
    again = Run(tmp_path, *common, f"loop.steps={total}", f"resume={run_dir}")  # no hydra.run.dir: in place
    assert again.finish() == 0, again.text()
    out = again.out.read_text()
    assert f"skipping step_{newest}: model.safetensors is truncated" in out
    assert f"from step_{previous} at step {previous}" in out
    assert [r["step"] for r in rows(run_dir)] == list(range(1, total + 1))
    assert summary(run_dir)["status"] in ("completed", "collapsed") and summary(run_dir)["steps"] == total
    assert not (tmp_path / "outputs").exists()  # the resumed run wrote into its own directory


def test_a_resumed_run_drops_its_earlier_summary_while_it_runs(tmp_path):
    """summary.json says how a run ended; while a resumed run trains (or after it is killed) the earlier
    part's summary would tell `rlmix report` an outcome this part has not reached."""
    run_dir = tmp_path / "run"
    first = Run(tmp_path, *SMOKE, "loop.steps=2", f"hydra.run.dir={run_dir}")
    assert first.finish() == 0 and summary(run_dir)["status"] in ("completed", "collapsed"), first.text()
    again = Run(tmp_path, *SMOKE, "loop.steps=200", f"resume={run_dir}")
    again.wait_for(lambda: len(rows(run_dir)) >= 4, "two steps past the resume")
    assert not (run_dir / "summary.json").exists()
    os.kill(again.proc.pid, signal.SIGKILL)
    again.finish()
    assert not (run_dir / "summary.json").exists()


def test_a_run_whose_steps_are_all_non_finite_fails(tmp_path, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    poisoned = tmp_path / "nan_model"
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))  # every logit NaN, in the samplers and the trainer
    model.save_pretrained(poisoned)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_llama_dir / name).exists():
            (poisoned / name).write_bytes((tiny_llama_dir / name).read_bytes())
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=10", f"model.path={poisoned}", f"hydra.run.dir={run_dir}")
    assert run.finish() == 1, run.text()
    result = summary(run_dir)
    assert result["status"] == "failed" and result["steps"] == 3  # monitor.nonfinite.count
    assert "non-finite" in result["error"]
    errors = [line for line in run.err.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-finite" in errors[0]


def test_a_killed_trainer_is_restarted_from_the_newest_checkpoint_and_the_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    steps = 40  # room to catch the trainer inside a 0.2 s step under load
    run = Run(tmp_path, *SMOKE, f"loop.steps={steps}", "loop.checkpoint_every=3", f"hydra.run.dir={run_dir}")
    # Killed inside a step after step 5: the driver seals a step's checkpoint before it starts the
    # next step, so while the trainer is held inside one (SIGSTOP) the newest checkpoint is fixed.
    # Read before a bare kill, it could be overtaken by the next one (steps take ~0.2 s).
    stopped = run.hold_inside(run_dir, "TrainerWorker.train_step", 5, "the trainer stopped inside step 6 or later")
    saved = complete(run_dir)[-1]
    os.kill(stopped, signal.SIGKILL)
    assert run.finish() == 0, run.text()
    result = summary(run_dir)
    assert result["status"] in ("completed", "collapsed") and result["steps"] == steps  # the smoke toy may collapse
    assert result["fault"]["trainer_restarts"] == 1
    assert [r["step"] for r in rows(run_dir)] == list(range(1, steps + 1))  # the steps after the checkpoint, once
    assert f"restarted it (1 of 3) from checkpoint step_{saved}" in run.out.read_text()
    assert "Traceback" not in run.text()


def test_a_trainer_dead_past_max_restarts_fails_and_offers_only_commands_that_work(tmp_path):
    """No restart allowed and no checkpoint written: the run fails in one line that says how to
    start again, and the closing block lists neither ``rlmix eval`` nor ``resume=``."""
    run_dir = tmp_path / "run"
    off = ["trainer.max_restarts=0", "loop.checkpoint_every=0", "loop.checkpoint_every_min=0"]
    run = Run(tmp_path, *SMOKE, "loop.steps=500", *off, f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: rows(run_dir) and actor_pids(run.proc.pid, "TrainerWorker"), "the first step")
    os.kill(actor_pids(run.proc.pid, "TrainerWorker")[0], signal.SIGKILL)
    assert run.finish() == 1, run.text()
    result = summary(run_dir)
    assert result["status"] == "failed" and "trainer died" in result["error"] and not result["resumable"]
    errors = [line for line in run.err.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "trainer.max_restarts" in errors[0], errors
    assert errors[0].endswith("start again with: rlmix train " + " ".join([*SMOKE, "loop.steps=500", *off]))
    lines = run.out.read_text().splitlines()
    assert lines[lines.index("next:") + 1:] == [
        "  rlmix report run", "  rlmix train " + " ".join([*SMOKE, "loop.steps=500", *off])]
    assert "Traceback" not in run.text()


def test_a_stopped_trainer_trips_the_watchdog_which_names_it(tmp_path):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", "loop.step_timeout_s=15", f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: rows(run_dir) and actor_pids(run.proc.pid, "TrainerWorker"), "the first step")
    os.kill(actor_pids(run.proc.pid, "TrainerWorker")[0], signal.SIGSTOP)  # hangs, does not die
    assert run.finish() == 1, run.text()
    result = summary(run_dir)
    assert result["status"] == "failed" and "waiting on the trainer" in result["error"]
