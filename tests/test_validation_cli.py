"""Settings that would corrupt training or crash half-way are refused before anything starts:
one line naming the key, exit status 2, no traceback, no run directory (one Hydra made for a check
that needs the model is removed again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import rlmix_refusing


def refused(out, key: str) -> None:
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], out.stderr
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.grad_clip=-1", "trainer.grad_clip"),  # clip_grad_norm_ would flip the gradient's sign
        ("trainer.grad_clip=0", "trainer.grad_clip"),
        ("trainer.betas=[1.0,0.95]", "trainer.betas"),
        ("trainer.weight_decay=1e10", "trainer.weight_decay"),
        ("trainer.lr=5", "trainer.lr"),
        ("trainer.num_threads=0", "trainer.num_threads"),
        ("loop.groups_per_step=0", "loop.groups_per_step"),
        ("loop.temperature=1e-38", "loop.temperature"),
        ("loop.checkpoint_every=-1", "loop.checkpoint_every"),
        ("loop.sampler_threads=0", "loop.sampler_threads"),
        ("loop.concurrent_requests=0", "loop.concurrent_requests"),
        ("loop.step_timeout_s=0", "loop.step_timeout_s"),
        ("monitor.ema_span=0", "monitor.ema_span"),
        ("correction.eps_low=0", "correction.eps_low"),
        ("trainer.min_lr_ratio=2", "trainer.min_lr_ratio"),
        ("trainer.lr_warmup_steps=-1", "trainer.lr_warmup_steps"),
        ("correction.kl_coef=-1", "correction.kl_coef"),
        ("correction.entropy_coef=nan", "correction.entropy_coef"),
        ("loop.overlong_penalty=-1", "loop.overlong_penalty"),
        ("loop.overlong=truncate", "loop.overlong"),
        ("trainer.max_restarts=-1", "trainer.max_restarts"),
    ],
)
def test_out_of_range_settings_are_one_line_exit_2_nothing_written(tmp_path, override, key):
    refused(rlmix_refusing("train", "+experiment=smoke", override, cwd=tmp_path), key)
    assert list(tmp_path.iterdir()) == []


def test_deepspeed_settings_are_checked_before_ray_starts(tmp_path):
    refused(rlmix_refusing("train", "+experiment=smoke", "trainer=deepspeed", "trainer.deepspeed.ranks=0", cwd=tmp_path),
            "trainer.deepspeed.ranks")
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_that_cannot_be_created_is_refused(tmp_path):
    (tmp_path / "a_file").write_text("")
    refused(rlmix_refusing("train", "+experiment=smoke", f"hydra.run.dir={tmp_path / 'a_file' / 'run'}", cwd=tmp_path),
            "hydra.run.dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_new_run_in_a_directory_that_holds_a_run_is_refused_and_the_run_left_as_it_was(tmp_path):
    # Started there, it pruned its own checkpoints in favour of the earlier run's, resumed from those
    # after a trainer restart, and appended its rows to the earlier run's.
    old = tmp_path / "old_run"
    (old / "checkpoints" / "step_100").mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    refused(rlmix_refusing("train", "+experiment=smoke", f"hydra.run.dir={old}", cwd=tmp_path), "hydra.run.dir")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # not even .hydra/


def test_resume_without_a_complete_checkpoint_is_refused(tmp_path):
    run = tmp_path / "old_run"
    (run / "checkpoints" / "step_3").mkdir(parents=True)  # a save that never finished
    refused(rlmix_refusing("train", "+experiment=smoke", f"resume={run}", cwd=tmp_path), "resume")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "old_run", "old_run/checkpoints", "old_run/checkpoints/step_3"]


def test_resume_of_a_directory_that_does_not_exist_is_refused(tmp_path):
    refused(rlmix_refusing("train", "+experiment=smoke", f"resume={Path(tmp_path) / 'nope'}", cwd=tmp_path), "resume")
    assert list(tmp_path.iterdir()) == []


def test_a_completion_budget_the_models_context_cannot_hold_is_refused(tmp_path):
    # The embedded model takes 256 positions, prompt included (checked once the model is there).
    refused(rlmix_refusing("train", "+experiment=smoke", "loop.max_new_tokens=256", cwd=tmp_path), "loop.max_new_tokens")
    assert list(tmp_path.iterdir()) == []  # the run directory Hydra had made is gone again


def test_dataset_prompts_too_long_for_the_models_context_are_refused(tmp_path):
    # The embedded v2 model takes 256 positions; one prompt of ~450 tokens would run past them.
    rows = [{"prompt": "What is 2 plus 2?", "answer": "4"}, {"prompt": "Please answer carefully. " * 60, "answer": "1"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = rlmix_refusing("train", "task=dataset", "task.train_files=train.jsonl", "logger=disabled", cwd=tmp_path)
    refused(out, "task.train_files")
    assert "1 of 2 prompts take more than" in out.stderr and "train.jsonl: line 2" in out.stderr, out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["train.jsonl"]


def test_a_sweep_refused_in_its_first_job_leaves_nothing_and_a_directory_in_use_is_kept(tmp_path):
    refused(rlmix_refusing("train", "-m", "+experiment=smoke", "loop.max_new_tokens=256", "seed=0,1", cwd=tmp_path),
            "loop.max_new_tokens")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine.txt").write_text("kept")  # hydra.run.dir=. on a directory that holds other files
    refused(rlmix_refusing("train", "+experiment=smoke", "loop.max_new_tokens=256", "hydra.run.dir=.", cwd=tmp_path),
            "loop.max_new_tokens")
    assert (tmp_path / "mine.txt").read_text() == "kept" and (tmp_path / ".hydra").is_dir()


@pytest.mark.parametrize("command", ["eval", "probe"])
def test_eval_and_probe_prompts_too_long_for_the_models_context_are_refused(tmp_path, command):
    from tests.byo_model import save_model

    model = save_model(tmp_path / "model", "llama")  # 256 positions
    rows = [{"prompt": "What is 2 plus 2?", "answer": "4"}, {"prompt": "Please answer carefully. " * 60, "answer": "1"}]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = ["task=dataset", "task.train_files=test.jsonl", "task.eval_files=test.jsonl"]
    if command == "eval":
        out = rlmix_refusing("eval", f"checkpoint={model}", *task, "eval.max_new_tokens=16", cwd=tmp_path)
        key, budget = "task.split=test", "eval.max_new_tokens=16"
    else:
        out = rlmix_refusing("probe", f"model.path={model}", *task, "probe.prompts=2", "loop.max_new_tokens=16",
                             cwd=tmp_path)
        key, budget = "the probe's prompts", "loop.max_new_tokens=16"
    refused(out, key)
    assert f"1 of 2 prompts take more than the 240 tokens that {budget} leaves" in out.stderr, out.stderr
    assert "task.eval_files=test.jsonl: line 2" in out.stderr and not (tmp_path / "outputs").exists()


def config_folder(tmp_path: Path) -> Path:
    """A folder of configs of one's own: a primary config built on rlmix's ``train`` and a fleet option."""
    conf = tmp_path / "conf"
    (conf / "fleet").mkdir(parents=True)
    (conf / "mine.yaml").write_text("defaults: [train, {override fleet: smoke}, {override logger: disabled}, _self_]\n"
                                    "name: mine\nloop: {steps: 2}\n")
    (conf / "fleet" / "two.yaml").write_text("defaults: [fleet_schema, _self_]\nname: two\n"
                                             "pools: {a100_bf16: {accelerator: A100, precision: bf16, count: 2}}\n")
    return conf


def test_config_dir_and_config_name_are_what_the_preflight_plans(tmp_path, monkeypatch):
    """The plan a job trains is the preflight's: composed from ``--config-name`` with ``--config-dir``
    added, as Hydra composes the config it records, not from rlmix's ``train`` alone."""
    from rlmix.commands.compose import plan_jobs

    monkeypatch.chdir(tmp_path)
    conf = config_folder(tmp_path)
    (job,) = plan_jobs(["--config-dir", str(conf), "--config-name", "mine"])
    assert (job.plan.cfg.name, job.plan.cfg.loop.steps, job.plan.cfg.fleet.name) == ("mine", 2, "smoke")
    (job,) = plan_jobs([f"-cd={conf}", "+experiment=smoke", "fleet=two"])  # an option of the added folder
    assert job.plan.cfg.fleet.name == "two" and job.plan.cfg.name == "smoke"


@pytest.mark.parametrize(("args", "key"), [(["-cp", "conf"], "-cp"), (["--config-path=conf"], "--config-path"),
                                           (["--config-dir", "nowhere"], "--config-dir nowhere"),
                                           (["--config-dir"], "--config-dir")])
def test_config_flags_rlmix_cannot_honour_are_refused_in_one_line(tmp_path, args, key):
    refused(rlmix_refusing("train", "+experiment=smoke", *args, cwd=tmp_path), key)
    assert not (tmp_path / "outputs").exists()


def test_adding_a_pool_under_a_name_the_fleet_has_is_refused(tmp_path):
    """``+fleet.pools.<name>={...}`` under an existing name would merge into that pool (Hydra's ``+`` on a
    dict): an fp8 pool turned bf16 with its other fields kept. Refused, with the way to change a pool."""
    out = rlmix_refusing("train", "+experiment=smoke", "+fleet.pools.h100_fp8={accelerator:H100,precision:bf16}",
                         cwd=tmp_path)
    refused(out, "+fleet.pools.h100_fp8")
    assert "fleet.pools.h100_fp8.<field>=" in out.stderr
    assert not (tmp_path / "outputs").exists()
