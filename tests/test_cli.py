"""The real `rlmix` command in a subprocess (help, Hydra's own flags), and bad input through the same
Typer app in this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.cli import RLMIX, rlmix, rlmix_refusing


def test_help_imports_nothing_heavy():  # a bare interpreter importing rlmix.cli: ~0.3 s, kept fast
    code = (
        "import sys, rlmix.cli\n"
        "heavy = [m for m in ('torch', 'ray', 'hydra', 'vllm', 'deepspeed', 'wandb', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_help_lists_the_commands(tmp_path):
    out = rlmix("--help", cwd=tmp_path)
    assert out.returncode == 0
    for command in ("train", "eval", "probe", "report"):
        assert command in out.stdout


def test_eval_and_probe_help_say_they_take_overrides_and_name_their_keys():
    from typer.testing import CliRunner

    from rlmix.cli import app

    for command, keys in (("eval", ("checkpoint=", "task.split=", "eval.k=", "eval.samples=")),
                          ("probe", ("fleet=", "probe.prompts=", "probe.samples_per_prompt=", "probe.out_dir="))):
        out = CliRunner().invoke(app, [command, "--help"], prog_name="rlmix", terminal_width=200)
        assert out.exit_code == 0, out.output
        assert f"rlmix {command} [KEY=VALUE]..." in out.output and all(k in out.output for k in keys), out.output


def test_help_shows_a_flag_without_a_value_and_each_command_in_full():
    from typer.testing import CliRunner

    from rlmix.cli import app

    top = CliRunner().invoke(app, ["--help"], prog_name="rlmix", terminal_width=200).output
    report = CliRunner().invoke(app, ["report", "--help"], prog_name="rlmix", terminal_width=200).output
    assert "<bool>" not in top + report, top + report  # a flag takes no value: `--where true` is refused
    assert "--where " in report and "PATH" in report and "{path}" not in report, report
    assert "`rlmix train +experiment=sc_mis seed=1`" in top, top  # not cut at "e.g."


@pytest.mark.slow
def test_train_help_is_hydras_and_lists_the_groups(tmp_path):
    out = rlmix("train", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for group in ("fleet:", "correction:", "trainer:", "model:", "task:", "logger:", "experiment:"):
        assert group in out.stdout
    assert "sc_mis_topp" in out.stdout
    assert "_schema" not in out.stdout.split("== Config ==")[0]  # a group's schema is not an option


@pytest.mark.slow
def test_cfg_job_prints_the_composed_config(tmp_path):
    out = rlmix("train", "--cfg", "job", "+experiment=icepop", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "mode: mis" in out.stdout and "objective: ppo_clip" in out.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_the_console_script_refuses_in_one_line_without_a_traceback(tmp_path):
    """The one refusal through the installed script: its exit code, its stderr, and its own imports
    (every other refusal test drives the same Typer app in-process)."""
    out = rlmix("train", "fleet=nope", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "fleet" in lines[0], out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "sigint"), [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                                               (signal.SIGINT, signal.SIG_IGN)],
                         ids=["ctrl_c", "sigterm", "sigint_started_ignored"])
def test_a_signal_during_eval_is_one_line_exit_128_plus_n_and_no_results_file(tmp_path, signum, sigint):
    # As from a terminal: SIGINT at its default (a pytest-xdist worker ignores it, and a child
    # inherits that), and no PYTHONUNBUFFERED for the progress lines to arrive through the pipe. A shell
    # script's `rlmix eval &` starts it ignoring SIGINT; `kill -INT` stops it all the same, as it stops train.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    # 16 samples a problem: the whole evaluation takes long enough that the signal lands inside it, however slowly
    # this process reads the first progress line on a loaded machine.
    proc = subprocess.Popen([RLMIX, "eval", "eval.samples=16", "eval.k=[1]"], cwd=tmp_path, text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    try:
        for line in proc.stdout:
            if line.startswith("[1/"):  # the first problem scored: the evaluation is under way
                os.killpg(proc.pid, signum)
                break
        assert proc.wait(timeout=120) == 128 + signum
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read()
    expected = f"interrupted ({signum.name}): rlmix eval stopped, no eval.json was written"
    assert err.strip().splitlines()[-1] == expected, err
    assert "Traceback" not in err and not list(tmp_path.rglob("eval.json"))


def test_a_signal_after_the_result_is_written_says_where_it_is(tmp_path, monkeypatch):
    """eval.json is written before W&B's upload and the closing lines: a signal there must not say
    that none was written. (``run_eval`` stands in for the evaluation: it writes the file as the
    real one does, then the handler's exception arrives.)"""
    import rlmix.commands.eval as eval_command
    from rlmix.cli import _Stopped
    from rlmix.metrics import written

    def run_eval(args):
        written.write_result(tmp_path / "eval.json", "{}")
        raise _Stopped(signal.SIGTERM)

    monkeypatch.setattr(eval_command, "run_eval", run_eval)
    out = rlmix_refusing("eval", cwd=tmp_path)
    assert out.returncode == 143
    assert out.stderr.strip() == f"interrupted (SIGTERM): rlmix eval stopped, after it wrote {tmp_path / 'eval.json'}"


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
