"""The console's parts on their own: job names, the worker-warning summary, W&B's pool table, step lines."""

from __future__ import annotations

import io
import json
import shlex

import pytest

from rlmix.commands.naming import job_label, set_swept_keys, sweep_name
from rlmix.metrics.console import CountedLines, StepDisplay, collapse_text, next_commands, sweep_block
from rlmix.metrics.quiet import WORKERS_LOG, worker_warnings
from rlmix.metrics.wandb_tables import pool_rows, summary_fields


@pytest.fixture(autouse=True)
def _no_swept_keys():
    yield
    set_swept_keys(())


def test_a_sweep_job_is_named_by_its_swept_overrides_only():
    set_swept_keys(("correction.mode", "seed"))
    overrides = ["+experiment=smoke", "correction.mode=sc_mis", "loop.steps=2", "seed=1"]
    assert job_label(overrides, "smoke", 1) == "correction.mode=sc_mis,seed=1"
    set_swept_keys(("experiment", "model.path"))
    assert job_label(["+experiment=sc", "model.path=/m/a"], "sc", 0) == "experiment=sc,model.path=_m_a"


def test_a_sweep_without_swept_values_falls_back_to_name_and_seed():
    assert job_label(["loop.steps=2"], "smoke", 3) == "smoke_s3"


def test_the_sweep_name_carries_date_time_and_experiment():
    assert sweep_name("multirun/2026-12-03/07-14-05_smoke") == "2026-12-03_07-14-05_smoke"
    assert sweep_name("/tmp/x/my_sweep") == "my_sweep"


def test_worker_warnings_are_counted_once_per_kind(tmp_path):
    lines = [
        "(MainProcess pid=1) WARNING 12-03 07:04:02 [layerwise.py:266] RotaryEmbedding: Failed to load weights",
        "(MainProcess pid=1) WARNING 12-03 07:05:09 [layerwise.py:266] RotaryEmbedding: Failed to load weights",
        "(MainProcess pid=1) INFO 12-03 07:04:02 [inplace.py:91] Reloading weights inplace...",
        "[2026-12-03 07:03:37,908] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU.",
        "x.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated",
    ]
    (tmp_path / WORKERS_LOG).write_text("\n".join(lines) + "\n")
    assert worker_warnings(tmp_path) == (4, 3)
    assert worker_warnings(tmp_path / "absent") == (0, 0)


def test_the_pool_table_averages_each_pools_rows(tmp_path):
    rows = [
        {"step": 1, "mismatch/kl_k3/a": 1.0, "format/error_rate/a": 0.5, "throughput/sampler_tokens_per_s/a": 100},
        {"step": 2, "mismatch/kl_k3/a": 3.0, "mismatch/kl_k3/b": 2.0, "throughput/sampler_tokens_per_s/a": 300},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fleet = {"a": {"label": "emulated:A", "count": 2}, "b": {"label": "vllm:b", "count": 1}}
    assert pool_rows(fleet, path) == [["a", "emulated:A", 2, 2, 2.0, 0.5, 200.0], ["b", "vllm:b", 1, 1, 2.0, None, None]]


def test_the_collapse_verdict_is_a_flat_summary_field():
    fields = summary_fields({"steps": 4, "collapse": {"verdict": True, "step": 3, "reason": "kl"}, "fleet": {}})
    assert fields == {"steps": 4, "collapse/verdict": True, "collapse/step": 3, "collapse/reason": "kl"}
    assert collapse_text({"verdict": True, "step": 3, "reason": "kl"}) == "at step 3: kl"
    assert collapse_text({"verdict": False}) == "none"


EPISODE = {"start": 95, "end": 104, "steps": 10, "reward_fall": 0.052, "recovered": True, "reason": "reward_drop: x"}
WARNING = {"step": 78, "reason": "grad_spikes: 3 grad-norm spikes"}


def test_episodes_and_warnings_are_counts_and_text_in_the_wandb_summary():
    collapse = {"verdict": False, "step": None, "reason": "", "episodes": [EPISODE], "warnings": [WARNING]}
    fields = summary_fields({"steps": 150, "collapse": collapse})
    assert fields["collapse/verdict"] is False and fields["collapse/episodes"] == 1 and fields["collapse/warnings"] == 1
    assert fields["collapse/episodes_text"] == "steps 95-104 (10 steps, reward EMA fell 0.052, recovered): reward_drop: x"
    assert fields["collapse/warnings_text"] == "at step 78: grad_spikes: 3 grad-norm spikes"


def test_the_run_block_lists_recovered_episodes_and_warnings_under_a_clean_verdict(tmp_path):
    from rlmix.metrics.console import run_block

    summary = {"status": "completed", "name": "sc_mis", "steps": 150, "final": {},
               "collapse": {"verdict": False, "step": None, "reason": "", "episodes": [EPISODE], "warnings": [WARNING]}}
    block = run_block(summary, tmp_path, None, 150, [], log_dir=tmp_path)
    lines = {line.split()[0]: line.split(None, 1)[1] for line in block.splitlines()[1:] if line.startswith("  ")}
    assert lines["status"] == "completed" and lines["collapse"] == "none"
    assert lines["last"].startswith("step ")  # the last step's values, not the report's tail mean
    assert lines["episodes"].startswith("steps 95-104 (10 steps, reward EMA fell 0.052, recovered)")
    assert lines["warnings"] == "at step 78: grad_spikes: 3 grad-norm spikes"
    quiet = dict(summary, collapse={"verdict": False, "step": None, "reason": "", "episodes": [], "warnings": []})
    assert "episodes" not in run_block(quiet, tmp_path, None, 150, [], log_dir=tmp_path)


def test_the_run_block_counts_the_samples_the_reward_failed_on(tmp_path):
    """A reward that fails scores 0 and trains nothing: the block says so, not only workers.log."""
    from rlmix.metrics.console import run_block

    summary = {"status": "completed", "name": "x", "steps": 3, "final": {}, "collapse": None}
    rows = [{"step": 1, "reward/errors": 0.0}, {"step": 2, "reward/errors": 16.0}, {"step": 3, "reward/errors": 16.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    block = run_block(summary, tmp_path, None, 3, [], log_dir=tmp_path)
    assert "  reward errors  32 samples in 2 of 3 steps scored 0: the reward raised" in block, block
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/errors": 0.0}) + "\n")
    assert "reward errors" not in run_block(summary, tmp_path, None, 3, [], log_dir=tmp_path)


def test_resume_repeats_the_runs_overrides_but_not_its_directory(tmp_path):
    commands = next_commands(tmp_path / "run", ["+experiment=smoke", "hydra.run.dir=x", "loop.steps=5"])
    assert commands[-1] == f"rlmix train +experiment=smoke loop.steps=5 resume={tmp_path / 'run'}"
    assert commands[0].startswith(f"rlmix eval checkpoint={tmp_path / 'run'}")


def test_the_next_commands_are_only_those_that_can_work(tmp_path):
    """No checkpoint: nothing to evaluate or resume, so the run is started again; no rows: no report."""
    run, overrides = tmp_path / "run", ["+experiment=smoke", "hydra.run.dir=x", "loop.steps=5"]
    again = "rlmix train +experiment=smoke loop.steps=5"
    assert next_commands(run, overrides, checkpoint=False, rows=True) == [f"rlmix report {run}", again]
    assert next_commands(run, overrides, checkpoint=False, rows=False) == [again]
    assert [c.split()[1] for c in next_commands(run, overrides)] == ["eval", "report", "train"]


def test_a_failed_runs_continue_line_survives_a_shell(capsys):
    """The one line of a run that failed names a command a shell gives back whole: a run directory
    with a space in it used to come out bare, and the shell split it into two arguments."""
    from rlmix.commands.train import say

    run_dir = "/tmp/my runs/3_loop.lag=1,seed=2"
    say({"status": "failed", "steps": 4, "error": "boom", "resumable": True, "run_dir": run_dir},
        ["+experiment=smoke", "loop.steps=9"])
    line = capsys.readouterr().err.strip()
    command = line.split("continue with: ", 1)[1]
    assert shlex.split(command) == ["rlmix", "train", "+experiment=smoke", "loop.steps=9", f"resume={run_dir}"]


def test_the_printed_commands_keep_where_the_configs_came_from(tmp_path, monkeypatch, capsys):
    """Resuming or starting a run again repeats ``--config-dir``, ``--config-name`` and ``hydra.searchpath``
    (Hydra keeps the search path out of a job's task overrides): without them an option of the
    user's folder (``task=mymini``) is no option at all."""
    from rlmix.commands import train
    from rlmix.commands.compose import repeated_source

    conf = tmp_path / "my conf"
    conf.mkdir()
    args = ["-cd", str(conf), "--config-name=mine", "hydra.searchpath=[file://extra]", "task=mymini", "-m"]
    source = repeated_source(args)
    assert source == ["--config-dir", str(conf), "--config-name", "mine", "hydra.searchpath=[file://extra]"]
    run = tmp_path / "run"
    commands = next_commands(run, ["task=mymini", "hydra.run.dir=x"], config_args=source)
    assert shlex.split(commands[-1]) == ["rlmix", "train", *source, "task=mymini", f"resume={run}"]
    assert commands[0] == f"rlmix eval checkpoint={run}"  # eval finds the folders in the run (run_settings)
    monkeypatch.setattr(train, "_source", source)
    train.say({"status": "failed", "steps": 4, "error": "boom", "resumable": False, "run_dir": str(run)},
              ["task=mymini"])
    line = capsys.readouterr().err.strip()
    assert shlex.split(line.split("start again with: ", 1)[1]) == ["rlmix", "train", *source, "task=mymini"]


def test_a_console_whose_reader_went_is_let_go_of_and_the_command_goes_on():
    """``rlmix train | head``: once ``head`` has its lines, a write finds the pipe closed. The run
    goes on (as after its terminal closed): the stream now writes to /dev/null, no BrokenPipeError."""
    import io
    import os
    import sys

    from rlmix.metrics.console import StepDisplay, console_outlives_reader

    read, write = os.pipe()
    os.close(read)
    stream = io.TextIOWrapper(io.FileIO(write, "w"), line_buffering=True)
    saved = sys.stdout
    sys.stdout = stream
    try:
        with console_outlives_reader():
            StepDisplay(2, live=False).update(1, "step 1/2")
            print("the closing block")
        assert os.readlink(f"/proc/self/fd/{write}") == os.devnull
    finally:
        sys.stdout = saved
        stream.close()


def test_rewinding_the_logger_drops_the_rows_after_the_checkpoint_and_appends_after_them(tmp_path):
    from rlmix.config.schema import WandbConfig, WandbMode
    from rlmix.metrics.logger import RunLogger

    logger = RunLogger(tmp_path, WandbConfig(mode=WandbMode.disabled), "r", {}, None, 10, stream=io.StringIO())
    for step in range(1, 6):
        logger.log(step, {"reward/mean": float(step)})
    kept = logger.rewind(3)
    for step in range(4, 7):
        logger.log(step, {"reward/mean": 10.0 * step})
    logger.finish({"status": "completed"})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept] == [1, 2, 3]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]


def test_the_sweep_block_ends_with_the_report_command(tmp_path):
    jobs = [("correction.mode=mis", {"steps": 2, "final": {"reward/mean": 0.5}}, tmp_path / "0_correction.mode=mis")]
    text = sweep_block(jobs, tmp_path)
    assert "correction.mode=mis  completed  steps 2  reward 0.500" in text
    assert text.splitlines()[-1] == f"  rlmix report {tmp_path}"


@pytest.mark.parametrize("live", [False, True])
def test_step_lines_every_n_steps_and_always_the_last(live):
    out = io.StringIO()
    display = StepDisplay(total=5, every=2, stream=out, live=live)
    for step in range(1, 6):
        display.update(step, f"step {step}")
    display.close()
    assert [ln for ln in out.getvalue().splitlines() if ln.startswith("step")] == ["step 2", "step 4", "step 5"]


@pytest.mark.parametrize("live", [False, True])
def test_eval_and_probe_lines_drive_a_bar_on_a_terminal_and_print_elsewhere(live):
    out = io.StringIO()
    with CountedLines("eval", stream=out, live=live) as progress:
        progress("[1/2] minicode/l1/0: 3/8 correct")
        progress("[2/2] minicode/l1/1: 0/8 correct")
        progress("wrote outputs/eval/eval.json")
    lines = out.getvalue().splitlines()
    assert "wrote outputs/eval/eval.json" in lines
    assert ("[1/2] minicode/l1/0: 3/8 correct" in lines) is not live  # on a terminal the bar shows it


def test_the_wandb_run_id_outlives_a_wandb_failure(tmp_path, monkeypatch):
    """A checkpoint records the W&B run id so that a resume continues that run; one failed
    ``wandb.log`` drops the live object, and used to drop the id with it."""
    import rlmix.metrics.logger as logger_module
    from rlmix.config.schema import WandbConfig, WandbMode

    class Flaky:
        id = "run-abc"

        def log(self, metrics, step):
            raise ConnectionError("network blip")

    monkeypatch.setattr(logger_module, "start_wandb", lambda *args: Flaky())
    logger = logger_module.RunLogger(tmp_path, WandbConfig(mode=WandbMode.offline), "r", {}, None, 10,
                                     stream=io.StringIO())
    logger.log(1, {"reward/mean": 0.5})
    assert logger.wandb is None and logger.wandb_id == "run-abc"
    monkeypatch.setattr(logger_module, "start_wandb", lambda *args: None)  # W&B did not start on resume
    resumed = logger_module.RunLogger(tmp_path / "again", WandbConfig(mode=WandbMode.offline), "r", {}, None, 10,
                                      stream=io.StringIO(), run_id="run-abc")
    assert resumed.wandb_id == "run-abc"


def test_the_block_of_a_run_that_had_ended_shows_its_own_steps_not_a_lower_loop_steps(tmp_path):
    """Resumed with loop.steps=2, a run that completed 3 steps trains nothing: its block says 3/3."""
    from rlmix.metrics.console import run_block

    def steps_row(summary: dict, total_steps: int) -> str:
        block = run_block(summary, tmp_path, None, total_steps, [], log_dir=tmp_path)
        return next(line.split(None, 1)[1] for line in block.splitlines() if line.startswith("  steps "))

    for status in ("completed", "collapsed"):
        ended = {"status": status, "name": "smoke", "steps": 3, "final": {}, "collapse": None, "wall_time_s": 1}
        assert steps_row(ended, 2) == "3/3 in 1 s"
        assert steps_row(ended, 3) == "3/3 in 1 s"
    # a run that stopped short shows the steps it was asked for
    stopped = {"status": "interrupted", "name": "smoke", "steps": 2, "final": {}, "collapse": None, "wall_time_s": 1}
    assert steps_row(stopped, 5) == "2/5 in 1 s"
    # so does a collapsed run the monitor stopped early (monitor.action=stop), and its resume goes on
    early = {"status": "collapsed", "name": "smoke", "steps": 2, "final": {}, "collapse": None, "wall_time_s": 1}
    assert steps_row(early, 5) == "2/5 in 1 s"
    block = run_block(early, tmp_path, tmp_path / "checkpoints" / "step_2", 5, ["loop.steps=5"], log_dir=tmp_path)
    assert block.splitlines()[-1].endswith("loop.steps=5 resume=" + str(tmp_path)), block


def test_a_finished_runs_resume_command_asks_for_more_steps(tmp_path):
    """A completed (or collapsed) run resumed as it was trains nothing ("nothing is left to train"):
    its printed resume command doubles ``loop.steps``, under a line saying so. An interrupted or failed
    run's resume command continues it as it was."""
    from rlmix.metrics.console import run_block

    run, overrides = tmp_path / "run", ["+experiment=smoke", "loop.steps=3", "hydra.run.dir=x"]
    checkpoint = run / "checkpoints" / "step_3"

    def next_lines(status: str, steps: int) -> list[str]:
        summary = {"status": status, "name": "smoke", "steps": steps, "final": {}, "collapse": None}
        block = run_block(summary, run, checkpoint, 3, overrides, log_dir=run).splitlines()
        return block[block.index("next:") + 1:]

    for status in ("completed", "collapsed"):
        assert next_lines(status, 3)[-2:] == ["  # the run ran all 3 steps it was asked for; to train 3 steps more:",
                                              f"  rlmix train +experiment=smoke loop.steps=6 resume={run}"]
    for status in ("interrupted", "failed"):
        assert next_lines(status, 2)[-1] == f"  rlmix train +experiment=smoke loop.steps=3 resume={run}"
    one = next_commands(run, ["++loop.steps=1"], ended_at=1)
    assert one[-2:] == ["# the run ran all 1 step it was asked for; to train 1 step more:",
                        f"rlmix train loop.steps=2 resume={run}"]
    assert [c.split()[1] for c in next_commands(run, overrides, ended_at=0)] == ["eval", "report"]  # nothing to double
