"""The real `rlmix` command in a subprocess (help, Hydra's own flags), and bad input through the same
Typer app in this process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RLMIX = str(Path(sys.executable).with_name("rlmix"))


def rlmix(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([RLMIX, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def rlmix_refusing(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rlmix *args`` in this process, through the command's own Typer app, for input that is refused
    before Ray or a run directory: a subprocess would spend ~3 s importing for each refusal. An
    exception that would have reached the console as a traceback is raised here."""
    import os

    from typer.testing import CliRunner

    from rlmix.cli import app

    argv, here = sys.argv[:], os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), prog_name="rlmix")
    finally:
        os.chdir(here)
        sys.argv[:] = argv
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["rlmix", *args], result.exit_code, result.stdout, result.stderr)


def test_help_imports_nothing_heavy():
    code = (
        "import sys, rlmix.cli\n"
        "heavy = [m for m in ('torch', 'ray', 'hydra', 'vllm', 'deepspeed', 'wandb', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_lists_the_commands(tmp_path):
    out = rlmix("--help", cwd=tmp_path)
    assert out.returncode == 0
    for command in ("train", "eval", "probe", "report"):
        assert command in out.stdout


def test_train_help_is_hydras_and_lists_the_groups(tmp_path):
    out = rlmix("train", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for group in ("fleet:", "correction:", "trainer:", "model:", "task:", "logger:", "experiment:"):
        assert group in out.stdout
    assert "sc_mis_topp" in out.stdout


def test_cfg_job_prints_the_composed_config(tmp_path):
    out = rlmix("train", "--cfg", "job", "+experiment=icepop", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "mode: mis" in out.stdout and "objective: ppo_clip" in out.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["train", "fleet=nope"], "fleet"),
        (["train", "+experiment=sc_mis", "trainer.lrr=1"], "trainer.lrr"),
        (["train", "loop.steps=many"], "loop.steps"),
        (["train", "fleet.pools.a100_bf16.precision=nvfp4"], "fleet.pools.a100_bf16"),
        (["train", "-m", "correction=sc,nope"], "correction"),
        (["train", "model.path=/no/such/model"], "/no/such/model"),
        (["eval", "checkpoint=/no/such/run"], "checkpoint"),
    ],
)
def test_bad_input_one_line_nonzero_no_traceback_nothing_written(tmp_path, args, key):
    out = rlmix_refusing(*args, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "group", "options"),
    [
        (["train", "fleet=smok"], "fleet", ("emulated_hetero6", "smoke", "vllm_cpu_smoke")),
        (["train", "+experiment=sc_miss"], "experiment", ("sc_mis", "icepop", "smoke")),
        (["train", "-m", "trainer=torch,deepspeeed"], "trainer", ("torch", "deepspeed")),
    ],
)
def test_a_group_typo_lists_the_groups_options_in_the_users_terms(tmp_path, args, group, options):
    out = rlmix_refusing(*args, cwd=tmp_path)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    available = line.split("available: ")[1].split(", ")
    assert set(options) <= set(available), line
    assert f"{group}=" in line and "did you mean" in line
    for internal in ("provider", "pkg://", "structured://", "_schema", "search path"):
        assert internal not in line, line
