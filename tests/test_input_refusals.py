"""Bad input to `rlmix train`, `eval`, `probe` and `report` is one line naming the key, exit 2, with nothing
written: a run directory's unreadable settings, an output path that is a file, a sweep with no jobs, a key
the command does not read, a swept value where one job runs, a sweep function that refuses its arguments."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from rlmix.commands.compose import compose_plan, compose_run_config, plan_jobs
from rlmix.errors import ConfigError
from tests.cli import rlmix_refusing

SMOKE = ["+experiment=smoke", "logger=disabled"]


def one_line(out) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()
    return line


def corrupt_run(path: Path, hydra_record: bool) -> Path:
    """A run directory whose composed config is not YAML; with or without its Hydra record."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text("{{{: bad\n")
    if hydra_record:
        (path / ".hydra" / "hydra.yaml").write_text(f"hydra: {{runtime: {{cwd: {path}, choices: {{}}}}}}\n")
    return path


def test_eval_of_a_run_whose_config_is_not_yaml_is_one_line(tmp_path):
    run = corrupt_run(tmp_path / "run", hydra_record=True)
    line = one_line(rlmix_refusing("eval", f"checkpoint={run}", cwd=tmp_path))
    assert line == f"error: checkpoint={run}: {run}/.hydra/config.yaml is not valid YAML (ParserError)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and sorted(p.name for p in run.iterdir()) == [".hydra"]


def test_the_eval_directory_of_a_checkpoint_whose_run_config_is_not_yaml_is_one_line(tmp_path):
    """Without ``.hydra/hydra.yaml`` the run's settings are not taken, but its task names eval's directory."""
    from rlmix.eval.evaluate import default_out_dir

    step = corrupt_run(tmp_path / "run", hydra_record=False) / "checkpoints" / "step_3"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    cfg = compose_run_config([f"checkpoint={step}"], for_training=False)
    with pytest.raises(ConfigError) as err:
        default_out_dir(cfg, "test")
    assert str(err.value) == f"checkpoint={step}: {tmp_path}/run/.hydra/config.yaml is not valid YAML (ParserError)"


def test_eval_of_a_file_says_it_is_a_file(tmp_path):
    (tmp_path / "weights.bin").write_text("x")
    line = one_line(rlmix_refusing("eval", "checkpoint=weights.bin", cwd=tmp_path))
    assert line == "error: checkpoint=weights.bin: a file, not a directory (give a run directory or an HF model dir)"


def a_run(path: Path, rows: list[dict], summary: str | None = None) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text("name: x\nseed: 0\nloop: {steps: 2}\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (path / "summary.json").write_text(summary)
    return path


def test_a_report_out_that_is_a_file_is_one_line(tmp_path):
    run = a_run(tmp_path / "run", [{"step": 1}])
    (tmp_path / "taken").write_text("mine")
    line = one_line(rlmix_refusing("report", str(run), "--out", str(tmp_path / "taken"), cwd=tmp_path))
    assert line == f"error: report: --out {tmp_path}/taken: {tmp_path}/taken is a file, not a directory " \
                   "(give a new or existing one)"
    line = one_line(rlmix_refusing("report", str(run), "--out", str(tmp_path / "taken" / "sub"), cwd=tmp_path))
    assert line.endswith(f"{tmp_path}/taken is a file, not a directory (give a new or existing one)")
    assert (tmp_path / "taken").read_text() == "mine" and sorted(p.name for p in run.iterdir()) == [".hydra",
                                                                                                   "metrics.jsonl"]


def test_a_report_of_a_summary_that_is_not_json_says_where_once(tmp_path):
    run = a_run(tmp_path / "run", [{"step": 1}], summary="{{{: bad")
    line = one_line(rlmix_refusing("report", str(run), cwd=tmp_path))
    assert line == (f"error: report: {run}/summary.json is not valid JSON "
                    "(Expecting property name enclosed in double quotes: line 1, column 2)")


def test_where_figures_of_a_run_without_steps_warn_of_nothing(tmp_path):
    from rlmix.report import write_report

    run = a_run(tmp_path / "run", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend"
        write_report(run, tmp_path / "out", where=True)
    assert list((tmp_path / "out" / "where").glob("*.png"))


def test_a_sweep_with_no_jobs_is_refused_before_its_directory(tmp_path):
    sweep = tmp_path / "m" / "k"
    args = ["-m", *SMOKE, "loop.steps=1", "seed=range(0,0)", f"hydra.sweep.dir={sweep}"]
    with pytest.raises(ConfigError, match=r"^the sweep has no jobs: seed=range\(0,0\) gives no value$"):
        plan_jobs(args)
    line = one_line(rlmix_refusing("train", *args, cwd=tmp_path))
    assert line == "error: the sweep has no jobs: seed=range(0,0) gives no value"
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_checkpoint_which_it_does_not_read(tmp_path):
    line = one_line(rlmix_refusing("train", *SMOKE, f"checkpoint={tmp_path}/notarun", cwd=tmp_path))
    assert line == (f"error: checkpoint={tmp_path}/notarun: rlmix train does not read checkpoint= (the model "
                    "rlmix eval scores); to continue a run use resume=<run dir>, to start from other weights use "
                    "model.path=<dir>")
    assert list(tmp_path.iterdir()) == []
    compose_plan([*SMOKE, f"checkpoint={tmp_path}"], for_training=False)  # eval's key, there


def test_probe_refuses_checkpoint_which_it_does_not_read(tmp_path):
    line = one_line(rlmix_refusing("probe", "fleet=smoke", f"checkpoint={tmp_path}", cwd=tmp_path))
    assert line == (f"error: checkpoint={tmp_path}: rlmix probe does not read checkpoint= (the model rlmix eval "
                    "scores); give the model to measure as model.path=<HF model dir>")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "expected"), [
    ([*SMOKE, "seed=0,1"], "seed=0,1 is a sweep: add -m (rlmix train -m ...), or write a list as seed=[0,1]"),
    (["+experiment=smoke,grpo"], "+experiment=smoke,grpo is a sweep: add -m (rlmix train -m ...), or write a list as "
                                 "+experiment=[smoke,grpo]"),
])
def test_a_swept_value_without_m_says_to_add_m(tmp_path, args, expected):
    assert one_line(rlmix_refusing("train", *args, cwd=tmp_path)) == f"error: {expected}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("command", "args", "expected"), [
    ("eval", ["eval.samples=2,4"], "eval.samples=2,4: rlmix eval runs one job; a list is written eval.samples=[2,4], "
                                   "sweeps are rlmix train -m"),
    ("probe", ["fleet=smoke,single_bf16"], "fleet=smoke,single_bf16: rlmix probe runs one job; a list is written "
                                           "fleet=[smoke,single_bf16], sweeps are rlmix train -m"),
    ("eval", ["seed=range(0,3)"], "seed=range(0,3): rlmix eval runs one job; sweeps are rlmix train -m"),
    ("eval", ["-m", "seed=0,1"], "-m: rlmix eval runs one job; -m/--multirun sweeps are rlmix train's "
                                 "(rlmix train -m ...)"),
    ("probe", ["--multirun", "fleet=smoke,single_bf16"], "--multirun: rlmix probe runs one job; -m/--multirun "
                                                         "sweeps are rlmix train's (rlmix train -m ...)"),
])
def test_eval_and_probe_say_they_run_one_job(tmp_path, command, args, expected):
    assert one_line(rlmix_refusing(command, *args, cwd=tmp_path)) == f"error: {expected}"
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_function_that_refuses_its_arguments_is_not_a_quoting_matter(tmp_path):
    line = one_line(rlmix_refusing("train", "-m", *SMOKE, "seed=choice()", cwd=tmp_path))
    assert line == "error: seed=choice(): empty choice is not legal (ValueError in choice())"
    assert list(tmp_path.iterdir()) == []


def test_a_fleet_wide_top_p_is_named_by_its_own_key():
    with pytest.raises(ConfigError, match=r"^fleet.top_p=1.5: must be in \(0, 1\]$"):
        compose_run_config([*SMOKE, "fleet.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"^fleet.top_k=-1: must be >= 0"):
        compose_run_config([*SMOKE, "fleet.top_k=-1"])
    pool = next(iter(compose_run_config(SMOKE).fleet.pools))
    with pytest.raises(ConfigError, match=rf"^fleet.pools.{pool}: top_p=1.5 must be in \(0, 1\]$"):
        compose_run_config([*SMOKE, f"fleet.pools.{pool}.top_p=1.5"])
