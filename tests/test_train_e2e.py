"""The real CLI end to end on the CPU: Ray actors, emulated fleet, BF16 trainer, metrics, sweeps.

Two runs go through the installed console script (a user's view: the printed block, a console free
of engine noise); the others through the same Typer app in this process, sharing one Ray instance
and its warm actor processes (``warm_ray``), as the jobs of a sweep do."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli import rlmix_in_process

pytestmark = pytest.mark.slow

RLMIX = str(Path(sys.executable).with_name("rlmix"))
REQUIRED_KEYS = {
    "step", "time", "reward/mean", "reward/pass_rate", "reward/uniform_groups_frac", "format/error_rate",
    "mismatch/kl_k3", "mismatch/kl_k1", "mismatch/logprob_abs_diff", "mismatch/ratio_tail_frac",
    "correction/weight_mean", "correction/masked_frac",
    "correction/ess", "correction/sc_tail_ratio", "correction/sc_head_mass", "correction/sc_coef_l1", "train/loss",
    "train/grad_norm", "train/entropy", "train/response_len", "staleness/mean", "staleness/max",
    "throughput/trainer_tokens_per_s", "time/step_s", "time/weight_sync_s", "time/trainer_idle_frac",
    "monitor/collapse", "monitor/episode", "monitor/reason", "monitor/warnings",
}
POOLS = ("h100_fp8", "a100_bf16")


def rlmix_train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([RLMIX, "train", *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def rlmix_train_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = rlmix_in_process("train", *args, cwd=cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_smoke_run_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    out = rlmix_train("+experiment=smoke", "loop.steps=5", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert "step    5/5" in out.stdout  # the live progress line
    # The closing block says where the run, its checkpoint and its W&B files went, and what to run next.
    tail = out.stdout.strip().splitlines()[-12:]
    assert "  run dir     run" in tail and "  checkpoint  run/checkpoints/step_5" in tail, tail
    assert any(ln.startswith("  W&B") and "wandb sync run/wandb/offline-run-" in ln for ln in tail), tail
    assert tail[-4:] == ["  rlmix eval checkpoint=run", "  rlmix report run",
                         "  # the run ran all 5 steps it was asked for; to train 5 steps more:",
                         "  rlmix train +experiment=smoke loop.steps=10 resume=run"], tail
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for row in rows:
        missing = REQUIRED_KEYS - row.keys()
        assert not missing, missing
        assert any(k.startswith("mismatch/kl_k3/lag_") for k in row)
    seen = set().union(*rows)  # a batch holds the pools whose requests finished first
    for pool in POOLS:
        for key in ("mismatch/kl_k3/", "format/error_rate/", "throughput/sampler_tokens_per_s/"):
            assert key + pool in seen
    # A sampler picked up a version the trainer published after the first step.
    assert max(r["policy_version/max"] for r in rows) >= 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 5 and set(summary["fleet"]) == set(POOLS)
    assert summary["fleet"]["h100_fp8"]["label"].startswith("emulated:H100/fp8_e4m3")
    # The weights changed.
    base = load_file(Path(summary["model_dir"]) / "model.safetensors")
    final = load_file(run_dir / "checkpoints" / "step_5" / "model.safetensors")
    assert any(not torch.equal(base[k].float(), final[k].float()) for k in base)
    assert list((run_dir / "wandb").glob("offline-run-*"))  # W&B, offline by default


def test_multirun_over_two_correction_modes(tmp_path, warm_ray):
    sweep = tmp_path / "sweep"
    out = rlmix_train_here(
        "-m", "+experiment=smoke", "correction=mis,sc_mis", "loop.steps=2", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )
    runs = sorted(p.parent for p in sweep.glob("*/summary.json"))
    # Directories and W&B runs carry what differs between the jobs; the W&B group is the sweep's name.
    assert [run.name for run in runs] == ["0_correction=mis", "1_correction=sc_mis"]
    for run in runs:
        [record] = (run / "wandb").glob("offline-run-*/run-*.wandb")
        data = record.read_bytes()
        assert run.name.split("_", 1)[1].encode() in data and b"sweep" in data
    assert out.stdout.strip().splitlines()[-1] == "  rlmix report sweep"
    modes = []
    for run in runs:
        assert len(read_metrics(run)) == 2
        assert (run / "checkpoints" / "step_2" / "model.safetensors").is_file()
        modes.append((run / ".hydra" / "overrides.yaml").read_text())
    assert "correction=mis" in modes[0] and "correction=sc_mis" in modes[1]


def test_max_staleness_zero_matches_a_synchronous_loop(tmp_path, warm_ray):
    """max_staleness=0 is on-policy: the first update equals sampling then training in one process."""
    from rlmix.commands.compose import compose_plan
    from rlmix.models.io import load_causal_lm, load_tokenizer
    from rlmix.assembly.fleet import resolve_fleet
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.orchestration.workers import SamplerWorker, TrainerWorker, make_request
    from rlmix.assembly.parts import make_task
    from rlmix.seeds import derive_seed
    from rlmix.rollout import concat_rollouts

    overrides = ["+experiment=smoke", "fleet=single_bf16", "fleet.pools.h100_bf16.count=1",
                 "loop.max_staleness=0", "loop.steps=1", "logger=disabled", "seed=3"]
    run_dir = tmp_path / "run"
    rlmix_train_here(*overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)

    plan = compose_plan(overrides)
    cfg, correction = plan.cfg, plan.correction
    model_dir = resolve_model_dir(plan)
    [spec] = resolve_fleet(plan, load_tokenizer(model_dir).eos_token_id)
    sampler = SamplerWorker(spec, str(model_dir), plan.task, derive_seed(cfg.seed, spec.name), cfg.loop.sampler_threads)
    task = make_task(cfg.task, cfg.seed)
    requests = cfg.loop.groups_per_step // cfg.loop.groups_per_request
    parts = [
        sampler.generate(make_request(task, i, cfg.loop.groups_per_request, cfg.seed), cfg.loop.group_size, None, 0)
        for i in range(requests)
    ]
    trainer = TrainerWorker(str(model_dir), cfg.trainer, correction, cfg.seed)
    trainer.train_step(concat_rollouts(parts, trainer.trainer.pad_id))
    expected = trainer.trainer.model.state_dict()
    actual = load_causal_lm(run_dir / "checkpoints" / "step_1").state_dict()
    base = load_causal_lm(model_dir).state_dict()
    assert any(not torch.equal(base[k], expected[k]) for k in expected)  # the step did something
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=1e-6, msg=name)


def test_resume_continues_from_the_last_checkpoint(tmp_path, warm_ray):
    """A stopped run resumes in its own directory: same step count, no duplicated metric rows."""
    run_dir = tmp_path / "run"
    common = ["+experiment=smoke", "logger=disabled", "loop.checkpoint_every=2"]
    rlmix_train_here(*common, "loop.steps=3", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    # step_2 is the last periodic checkpoint; pretend the run died after it (step 3 is re-run).
    import shutil

    shutil.rmtree(run_dir / "checkpoints" / "step_3")
    out = rlmix_train_here(*common, "loop.steps=5", f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'again'}", cwd=tmp_path)
    assert "from step_2 at step 2" in out.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert (run_dir / "checkpoints" / "step_5" / "trainer_state.pt").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 5
    # Resumed once more, as the closing block prints it, a completed run trains nothing and keeps
    # what its summary reported (its final metrics were lost to an empty dict before).
    out = rlmix_train_here(*common, "loop.steps=5", f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'third'}",
                           cwd=tmp_path)
    assert "the run ended at step 5 (completed); nothing is left to train at loop.steps=5" in out.stdout
    assert "Ray and" not in (tmp_path / "third" / "train.log").read_text()  # ... so nothing was started
    again = json.loads((run_dir / "summary.json").read_text())
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert again["status"] == "completed" and again["steps"] == 5
    assert again["final"] == summary["final"] and "reward/mean" in again["final"]
    # ... and so with a lower loop.steps: its block shows the steps the run did, not 5/4.
    out = rlmix_train_here(*common, "loop.steps=4", f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'fourth'}",
                           cwd=tmp_path)
    assert re.search(r"^  steps +5/5 in ", out.stdout, re.MULTILINE), out.stdout
    assert "nothing is left to train at loop.steps=4 (raise it above 5 to go on)" in out.stdout


def test_the_vllm_and_deepspeed_console_holds_only_rlmix_lines(tmp_path):
    """Engine banners, DeepSpeed memory dumps and per-sync warnings go to the run's log files."""
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    run_dir = tmp_path / "run"
    out = rlmix_train("+experiment=smoke", "fleet=vllm_cpu_smoke", "trainer=deepspeed", "loop.steps=2",
                      "logger=disabled", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    console = out.stdout + out.stderr
    for noise in ("WARNING", "Warning", "(SamplerWorker", "(TrainerWorker", "Token authentication", "MA ", "INFO"):
        assert noise not in console, console
    workers = (run_dir / "workers.log").read_text()
    assert "vLLM" in workers or "vllm" in workers  # the engine's own lines are kept, in the run dir
    assert (run_dir / "train.log").is_file()
    assert "warnings of" in console  # ... and summarised once, in the closing block


def test_training_on_a_held_out_split_says_so(tmp_path):
    out = rlmix_train_here("+experiment=smoke", "task.split=hard51", "loop.steps=1", "logger=disabled",
                           f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert "task.split=hard51: training on a held-out split" in out.stdout + out.stderr


def test_a_config_of_ones_own_is_what_trains_and_its_printed_commands_work(tmp_path, warm_ray, monkeypatch):
    """``--config-dir``/``--config-name`` and ``hydra.searchpath``: the job trains the plan the preflight
    made from the config Hydra records (not rlmix's ``train``), and the printed commands keep the
    folders: resume repeats them, eval finds the run's task option through the run."""
    import shlex

    import rlmix.orchestration.runner as runner
    from rlmix.commands import train as train_command
    from rlmix.commands.compose import plan_jobs
    from rlmix.commands.eval import eval_plan

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text(
        "defaults: [train, {override fleet: smoke}, {override logger: disabled}, _self_]\n"
        "name: mine\nloop: {steps: 2, groups_per_step: 4, group_size: 4, max_new_tokens: 16}\n")
    (tmp_path / "extra" / "task").mkdir(parents=True)
    (tmp_path / "extra" / "task" / "tiny.yaml").write_text("defaults: [minicode_schema, _self_]\nlevels: [1, 2]\n")
    planned = []
    real_train = runner.train

    def spy(plan, **kwargs):
        planned.append(plan is train_command._jobs[0].plan)
        return real_train(plan, **kwargs)

    monkeypatch.setattr(runner, "train", spy)
    out = rlmix_train_here("--config-dir", "conf", "--config-name", "mine", "hydra.searchpath=[file://extra]",
                           "task=tiny", "hydra.run.dir=run", cwd=tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert planned == [True] and summary["steps"] == 2 and "── run mine " in out.stdout
    assert set(summary["fleet"]) == set(POOLS)
    tail = out.stdout.strip().splitlines()[-4:]
    assert tail == ["  rlmix eval checkpoint=run", "  rlmix report run",
                    "  # the run ran all 2 steps it was asked for; to train 2 steps more:",
                    "  rlmix train --config-dir conf --config-name mine 'hydra.searchpath=[file://extra]' task=tiny "
                    "loop.steps=4 resume=run"], tail
    monkeypatch.chdir(tmp_path)
    (job,) = plan_jobs(shlex.split(tail[-1])[2:])
    assert (job.plan.cfg.name, job.plan.cfg.task.levels, job.plan.cfg.resume) == ("mine", [1, 2], "run")
    assert eval_plan(shlex.split(tail[0])[2:]).cfg.task.levels == [1, 2]


def test_a_run_whose_stdout_reader_goes_away_trains_to_its_end(tmp_path):
    """``rlmix train | head -4``: the pipe closes after the start-up lines; the run goes on as after
    its terminal closed (its summary and checkpoint written, exit 0), with nothing on stderr."""
    proc = subprocess.Popen([RLMIX, "train", "+experiment=smoke", "logger=disabled", "loop.steps=2",
                             "hydra.run.dir=run"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    head = [proc.stdout.readline() for _ in range(4)]
    proc.stdout.close()
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0 and "Traceback" not in err, head + [err[-3000:]]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and (tmp_path / "run" / "checkpoints" / "step_2").is_dir()
