"""What ``resume=`` checks before Ray starts (a checkpoint of another trainer or model, ``loop.steps``
below its step), what it says of a gappy metrics.jsonl, and the paths and checkpoint summary.json names."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlmix.assembly import checkpoints as ck
from rlmix.assembly.checkpoints import RunState
from rlmix.config.schema import RunConfig, TrainerBackend
from rlmix.errors import ConfigError, RunFailed
from rlmix.orchestration import runner

V1 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2,
      "vocab_size": 32, "eos_token_id": 2, "dtype": "float32", "transformers_version": "5.19.0"}
V2 = V1 | {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1024}


def model(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def save(run_dir: Path, step: int, files: dict[str, bytes], config: dict = V1, written_by: dict | None = None) -> Path:
    tmp = ck.staging_dir(run_dir, step)
    model(tmp, config)
    for name, data in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    recorded = {"written_by": written_by} if written_by else {}  # (none: as a checkpoint from before the record)
    return ck.seal(tmp, RunState(step, 0, 0.0, **recorded), keep=2)


TORCH = {"trainer_state.pt": b"x"}
DS2 = {f"deepspeed/step/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt": b"x" for r in range(2)}


def config(resume: Path, backend=TrainerBackend.torch, ranks=1, zero_stage=1, steps=40) -> RunConfig:
    cfg = RunConfig()
    cfg.resume, cfg.loop.steps, cfg.trainer.backend = str(resume), steps, backend
    cfg.trainer.deepspeed.ranks, cfg.trainer.deepspeed.zero_stage = ranks, zero_stage
    return cfg


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_recorded_deepspeed_layout_resumed_with_another_trainer_is_one_line_naming_the_overrides(tmp_path):
    cfg = config(tmp_path / "run", TrainerBackend.deepspeed, ranks=2, zero_stage=2)
    written = ck.written_by(cfg, model(tmp_path / "model", V1))
    save(tmp_path / "run", 10, DS2, written_by=written)
    for asked in (config(tmp_path / "run"), config(tmp_path / "run", TrainerBackend.deepspeed, ranks=1, zero_stage=2)):
        with pytest.raises(ConfigError) as err:
            runner.check_continues(asked, tmp_path / "model")
        assert str(err.value).startswith(f"resume={tmp_path / 'run'}: its checkpoint step_10 was written by "
                                         "trainer=deepspeed (ranks 2, ZeRO 2); this run asks for trainer=")
        assert str(err.value).endswith(
            "add trainer=deepspeed trainer.deepspeed.ranks=2 trainer.deepspeed.zero_stage=2")
    runner.check_continues(cfg, tmp_path / "model")  # the same settings: no refusal


def test_checkpoints_without_the_record_are_told_by_their_files(tmp_path):
    """Written before the record existed: torch's trainer_state.pt, DeepSpeed's directory and its shards."""
    save(tmp_path / "torch_run", 5, TORCH)
    save(tmp_path / "ds_run", 5, DS2)
    model_dir = model(tmp_path / "model", V1)
    runner.check_continues(config(tmp_path / "torch_run"), model_dir)
    runner.check_continues(config(tmp_path / "ds_run", TrainerBackend.deepspeed, ranks=2, zero_stage=2), model_dir)
    with pytest.raises(ConfigError, match="written by trainer=torch; this run asks for trainer=deepspeed "
                                          r"\(ranks 1, ZeRO 1\): add trainer=torch$"):
        runner.check_continues(config(tmp_path / "torch_run", TrainerBackend.deepspeed), model_dir)
    with pytest.raises(ConfigError, match=r"written by trainer=deepspeed \(ranks 2, ZeRO 1 or 2: not recorded, and "
                                          r"its files do not tell which\); this run asks for trainer=torch: add "
                                          r"trainer=deepspeed trainer.deepspeed.ranks=2 "
                                          r"trainer.deepspeed.zero_stage=1\|2 \(whichever it was trained with\)$"):
        runner.check_continues(config(tmp_path / "ds_run"), model_dir)


def model_states(stage: int) -> bytes:
    """A model states file as DeepSpeed saves it, with the config its engine ran with (no weights here)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"module": {"w": torch.zeros(2)}, "ds_config": {"zero_optimization": {"stage": stage}},
                "ds_version": "0.19.8"}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_checkpoint_without_the_record_is_refused_at_another_zero_stage_its_files_tell(tmp_path, stage):
    """Written before the record: the ZeRO stage is read from the config DeepSpeed saved with the model
    states (resumed at another stage, it was loaded as if it fitted)."""
    states = "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
    files = {f"deepspeed/step/{states}": model_states(stage)}
    if stage:
        files |= {"deepspeed/step/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": b"x"}
    save(tmp_path / "run", 5, files)
    model_dir = model(tmp_path / "model", V1)
    assert runner.check_continues(config(tmp_path / "run", TrainerBackend.deepspeed, zero_stage=stage), model_dir) \
        is None  # the stage it was written with: nothing left unchecked
    other = 1 if stage == 2 else 2
    with pytest.raises(ConfigError) as err:
        runner.check_continues(config(tmp_path / "run", TrainerBackend.deepspeed, zero_stage=other), model_dir)
    assert str(err.value).endswith(f"was written by trainer=deepspeed ({'ranks 1, ' if stage else ''}ZeRO {stage}); "
                                   f"this run asks for trainer=deepspeed (ranks 1, ZeRO {other}): add trainer=deepspeed "
                                   f"{'trainer.deepspeed.ranks=1 ' if stage else ''}trainer.deepspeed.zero_stage={stage}")


def test_where_the_files_leave_the_zero_stage_open_the_names_narrow_it_and_the_run_is_told(tmp_path):
    """Without a readable config the names tell stage 3 (model states per rank) and 0 (no optimizer
    partitions) from 1 and 2, which name their files alike: resumed at 1 or 2, the run is told that
    its stage was not checked; at 0 or 3 it is refused."""
    ds = "deepspeed/step/"
    shards = {f"{ds}bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt": b"x" for r in range(2)}
    save(tmp_path / "zero3", 5, shards | {f"{ds}zero_pp_rank_{r}_mp_rank_00_model_states.pt": b"x" for r in range(2)})
    save(tmp_path / "zero0", 5, {f"{ds}mp_rank_00_model_states.pt": b"x"})
    save(tmp_path / "open", 5, shards | {f"{ds}mp_rank_00_model_states.pt": b"x"})
    assert ck.zero_stage_of(tmp_path / "zero3" / "checkpoints" / "step_5" / ds) == 3
    assert ck.zero_stage_of(tmp_path / "zero0" / "checkpoints" / "step_5" / ds) == 0
    assert ck.zero_stage_of(tmp_path / "open" / "checkpoints" / "step_5" / ds) == (1, 2)
    model_dir = model(tmp_path / "model", V1)
    for stage in (1, 2):
        told = runner.check_continues(config(tmp_path / "open", TrainerBackend.deepspeed, ranks=2, zero_stage=stage),
                                      model_dir)
        assert told == (f"resume={tmp_path / 'open'}: its checkpoint step_5 does not record its ZeRO stage, and its "
                        f"files tell only 1 or 2; loading it with trainer.deepspeed.zero_stage={stage} as this run "
                        "asks (give the stage it was trained with if not)")
    for stage in (0, 3):
        with pytest.raises(ConfigError, match=r"\(ranks 2, ZeRO 1 or 2: not recorded, and its files do not tell "
                                              rf"which\); this run asks for trainer=deepspeed \(ranks 2, ZeRO {stage}\)"):
            runner.check_continues(config(tmp_path / "open", TrainerBackend.deepspeed, ranks=2, zero_stage=stage),
                                   model_dir)
    recorded = ck.written_by(config(tmp_path / "x", TrainerBackend.deepspeed, ranks=2, zero_stage=2), model_dir)
    save(tmp_path / "recorded", 5, shards, written_by=recorded)
    assert runner.check_continues(config(tmp_path / "recorded", TrainerBackend.deepspeed, ranks=2, zero_stage=2),
                                  model_dir) is None  # recorded: nothing left unchecked


@pytest.mark.parametrize("recorded", [True, False])
def test_a_checkpoint_of_another_model_is_refused_naming_what_differs(tmp_path, recorded):
    cfg = config(tmp_path / "run")
    written = ck.written_by(cfg, model(tmp_path / "v1", V1)) if recorded else None
    save(tmp_path / "run", 7, TORCH, V1, written)
    with pytest.raises(ConfigError) as err:
        runner.check_continues(cfg, model(tmp_path / "v2", V2))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"resume={tmp_path / 'run'}: its checkpoint step_7 holds another "
                                                f"model than this run's {tmp_path / 'v2'} (architectures")
    assert "vocab_size 32 (this run's 1024)" in line
    assert line.endswith("add model.embedded_version=auto" if recorded else "it was trained from")
    # What save_pretrained rewrites (dtype, transformers_version) or adds is no other model.
    runner.check_continues(cfg, model(tmp_path / "v1_again", V1 | {"dtype": "bfloat16", "head_dim": 64}))


def test_loop_steps_below_the_checkpoint_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    run_dir = tmp_path / "run"
    save(run_dir, 9, TORCH)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 10)))
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted", "steps": 9}))
    before = snapshot(run_dir)
    with pytest.raises(ConfigError, match=r": the run is at step 9 \(step_9\); loop.steps=5 is below it: give "
                                          "loop.steps above 9 to train more$"):
        runner.check_continues(config(run_dir, steps=5), model(tmp_path / "model", V1))
    assert snapshot(run_dir) == before
    runner.check_continues(config(run_dir, steps=9), tmp_path / "model")  # trains nothing, writes its summary


def test_missing_rows_names_the_steps_metrics_jsonl_lacks():
    rows = [{"step": s} for s in (*range(1, 20), 25)]
    assert runner.missing_rows(rows, 25) == ("metrics.jsonl lacks steps 20-24 of the 25 the checkpoint has: "
                                             "the collapse monitor sees only the other 20")
    assert runner.missing_rows([{"step": 2}], 4).startswith("metrics.jsonl lacks steps 1, 3-4 of the 4")
    assert runner.missing_rows([{"step": s} for s in range(1, 5)], 4) == ""


class Trainer:
    class load_checkpoint:
        @staticmethod
        def remote(path):
            return path


def resumed(cfg: RunConfig, monkeypatch, tmp_path: Path):
    """``runner.resume`` with a trainer whose load does nothing."""
    import ray

    from rlmix.metrics.monitor import CollapseMonitor

    monkeypatch.setattr(ray, "get", lambda ref: None)
    return runner.resume(cfg, Trainer(), CollapseMonitor(cfg.monitor), tmp_path / "hydra_dir")


def test_a_relative_resume_continues_in_an_absolute_run_dir(tmp_path, monkeypatch):
    """summary.json's run_dir (and the checkpoint under it) hold wherever they are read from."""
    monkeypatch.chdir(tmp_path)
    save(tmp_path / "k3", 6, TORCH)
    state, run_dir, _ = resumed(config(Path("k3")), monkeypatch, tmp_path)
    assert state.step == 6 and run_dir == tmp_path / "k3"


@pytest.mark.parametrize("damage", ["rows_deleted", "file_deleted", "torn_last_line"])
def test_resume_warns_of_the_steps_metrics_jsonl_lacks(tmp_path, monkeypatch, caplog, damage):
    save(tmp_path / "run", 6, TORCH)
    rows = [json.dumps({"step": s, "reward/mean": 0.5}) for s in range(1, 7)]
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text({"rows_deleted": "\n".join(rows[:2] + rows[4:]) + "\n", "file_deleted": "",
                        "torn_last_line": "\n".join(rows[:5] + [rows[5][:9]])}[damage])
    if damage == "file_deleted":
        metrics.unlink()
    with caplog.at_level(logging.WARNING, logger="rlmix.orchestration.runner"):
        state, _, _ = resumed(config(tmp_path / "run"), monkeypatch, tmp_path)
    missing, others = {"rows_deleted": ("3-4", 4), "file_deleted": ("1-6", 0), "torn_last_line": ("6", 5)}[damage]
    steps = "step" if damage == "torn_last_line" else "steps"
    assert state.step == 6 and [r.getMessage() for r in caplog.records] == [
        f"metrics.jsonl lacks {steps} {missing} of the 6 the checkpoint has: the collapse monitor sees only the other "
        f"{others}"]


def test_a_failed_run_names_its_newest_complete_checkpoint(tmp_path):
    """Sampler deaths past loop.sampler_max_restarts after step 10: no final save, but step_10 resumes it."""
    import types

    from rlmix.metrics.verdict import MonitorVerdict
    from rlmix.orchestration.outcome import StopRequest, finish

    newest = save(tmp_path, 10, TORCH)
    save(tmp_path, 12, TORCH).joinpath("complete.json").unlink()  # a save cut short: not a checkpoint

    class Loop:
        version, sampler_restarts, requests_reissued, trainer_restarts = 12, 0, 0, 0

        def run(self, steps, on_step, stop):
            raise RunFailed("sampler P/0 died 1 times and no sampler is left")

    monitor = types.SimpleNamespace(verdict=MonitorVerdict(False, None, "", None))
    monitor.finish = lambda: monitor.verdict
    steps = types.SimpleNamespace(cfg=config(tmp_path), monitor=monitor, last={}, run_dir=tmp_path,
                                  logger=types.SimpleNamespace(finish=lambda summary, at_once=False: summary))
    stop = StopRequest()
    stop.training()
    summary = finish(Loop(), steps, stop, {})
    assert summary["status"] == "failed" and summary["checkpoint"] == str(newest) and summary["resumable"] is True


def test_a_resume_that_stretches_the_learning_rate_decay_says_so(tmp_path):
    """A finished run's printed "train N steps more" raises loop.steps; with trainer.lr_decay_steps null a cosine
    decay then stretches over the new total and the rate goes up at the resumed step: the resume says so."""
    from rlmix.config.schema import LRSchedule

    before = config(tmp_path / "run", steps=3)
    before.trainer.lr_schedule = LRSchedule.cosine
    state = RunState(step=3, next_request=6, wall_time_s=1.0, written_by=ck.written_by(before, tmp_path))
    assert state.written_by["schedule"] == {"lr_schedule": "cosine", "lr_decay_steps": 3}
    after = config(tmp_path / "run", steps=6)
    after.trainer.lr_schedule = LRSchedule.cosine
    assert ck.schedule_change(state, after) == (
        "trainer.lr_schedule=cosine decays over 6 trainer steps now, over 3 before: from step 3 the learning rate "
        "follows the new schedule (trainer.lr_decay_steps=3 keeps the old)")
    after.trainer.lr_decay_steps = 3  # the old horizon kept, or a constant rate, or a checkpoint from before the record
    assert ck.schedule_change(state, after) is None
    assert ck.schedule_change(state, config(tmp_path / "run", steps=6)) is None
    assert ck.schedule_change(RunState(step=3, next_request=6, wall_time_s=1.0), after) is None
