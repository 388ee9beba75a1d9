"""scripts/reproduce.py's invocations: what a resume keeps, which page a shorter look writes, how a
stop by a signal ends, and the windows its page states. The runs themselves are outside the unit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_reproduce_plan import R  # the script, loaded once as a module
NO_PROBE = {"command": "rlmix probe", "reference": "", "pools": {}}


def summary(run_dir: Path, arm: str, seed: int, status: str, overrides: list[str] | None = None) -> None:
    """What a run leaves that the script reads: summary.json and, from Hydra, .hydra/overrides.yaml."""
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"name": arm, "seed": seed, "status": status}))
    if overrides is not None:
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def result(arm: str, seed: int, dose: str, steps: int, pool_kls: dict | None = None):
    fields = {k: float("nan") for k in R.RunResult.__dataclass_fields__}
    fields.update(arm=arm, seed=seed, dose=dose, collapsed=False, collapse_step=None, collapse_reason="",
                  rewards=[0.1] * steps, kls=[1e-4] * steps, pool_kls=pool_kls or {}, where={}, pass1=None)
    return R.RunResult(**fields)


def outside_the_unit(monkeypatch, tmp_path, argv: list[str], swept: list | None = None, sweeps: bool = True) -> None:
    """The script with its sweeps writing summaries only (``sweeps``; else the script's own, on its
    ``run``), its runs collected from them, ROOT in tmp_path."""
    def sweep(out, dose, arms, seeds, steps):
        if swept is not None:
            swept.append((dose, arms, seeds, steps))
        for arm in arms:
            for seed in seeds if not isinstance(seeds, int) else range(seeds):
                summary(out / f"{arm},{seed}", arm, seed, "completed",
                        R.sweep_overrides(dose, (arm,), (seed,), steps))
        return R.sweep_overrides(dose, arms, seeds, steps)

    def collect(run_dir, dose, eval_samples):
        got = json.loads((run_dir / "summary.json").read_text())
        return result(got["name"], got["seed"], dose, 3)

    for name, value in (("ROOT", tmp_path), ("collect", collect), ("plot_curves", lambda *a: None),
                        ("probe", lambda out, dose, done: NO_PROBE), *([("sweep", sweep)] if sweeps else [])):
        monkeypatch.setattr(R, name, value)
    monkeypatch.setattr(sys, "argv", ["reproduce.py", *argv])


def test_a_resume_with_other_steps_than_its_kept_runs_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    # A stopped invocation of 3-step runs: grpo ended, sc_mis was interrupted.
    stopped = tmp_path / "multirun" / "reproduce_x"
    dose = "v2_matched"
    summary(stopped / dose / "0_experiment=grpo", "grpo", 0, "completed", R.sweep_overrides(dose, ("grpo",), (0,), 3))
    summary(stopped / dose / "1_experiment=sc_mis", "sc_mis", 0, "interrupted",
            R.sweep_overrides(dose, ("sc_mis",), (0,), 3))
    swept: list = []
    args = ["--doses", dose, "--arms", "grpo,sc_mis", "--seeds", "1", "--resume", str(stopped)]
    outside_the_unit(monkeypatch, tmp_path, [*args, "--steps", "12"], swept)
    with pytest.raises(SystemExit) as stop:
        R.main()
    assert stop.value.code == 2 and swept == []
    err = capsys.readouterr().err
    assert "0_experiment=grpo was trained with `loop.steps=3` where this invocation gives `loop.steps=12`" in err
    assert "(--steps 3)" in err
    assert not (tmp_path / "docs").exists()

    # The stopped invocation's --steps: the ended run is kept, the interrupted one runs again.
    outside_the_unit(monkeypatch, tmp_path, [*args, "--steps", "3"], swept)
    R.main()
    assert swept == [(dose, ("sc_mis",), (0,), 3)]
    # A dose's overrides changed since the runs were trained: refused as well, with what differs.
    (stopped / "v2_matched_lr1e-3").mkdir()
    (stopped / dose / "0_experiment=grpo").rename(stopped / "v2_matched_lr1e-3" / "0_experiment=grpo")
    problem = R.resume_problem(stopped, [("v2_matched_lr1e-3", ("grpo",))], 1, 3)
    assert problem.endswith("was trained without `trainer.lr=1e-3`, which this invocation gives; give the options "
                            "the stopped invocation was started with, or start afresh without --resume")
    assert R.resume_problem(stopped, [("v2_matched_lr1e-3", ("sc_mis",))], 1, 3) is None  # not an arm it keeps


def test_a_shorter_look_writes_a_page_of_its_own_and_not_over_the_profile_s(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    (docs / "results_quick").mkdir(parents=True)
    (docs / "results_quick.md").write_text("the profile's page\n")
    (docs / "results_quick" / "runs.json").write_text("[]\n")
    outside_the_unit(monkeypatch, tmp_path, ["--seeds", "1", "--steps", "20"])
    R.main()
    assert (docs / "results_quick.md").read_text() == "the profile's page\n"
    assert (docs / "results_quick" / "runs.json").read_text() == "[]\n"
    page = (docs / "results_quick_1seed_20steps.md").read_text()
    assert "Steps per run: 20" in page
    assert len(json.loads((docs / "results_quick_1seed_20steps" / "runs.json").read_text())) == 4

    assert R.page_name("quick", None, None, R.SEEDS, 300) == "quick"  # the profile's own settings: its page
    assert R.page_name("v2_map", "v2_fp8", "grpo,sc_mis", 2, 300) == "v2_map_v2_fp8_grpo_sc_mis_2seeds"
    assert R.page_name("full", None, None, 3, 100) == "full_100steps"  # as docs/results_full_100steps.md


def rlmix_train(code: int, ended: bool):
    """``rlmix train -m`` outside the unit: it writes each job's summary into its sweep dir (every job
    ended, or the last one interrupted), then exits with ``code``."""
    def run(cmd, quiet=False):
        assert cmd[1:3] == ["train", "-m"], cmd
        out = Path(next(a for a in cmd if a.startswith("hydra.sweep.dir=")).split("=", 1)[1])
        arms = next(a for a in cmd if a.startswith("+experiment=")).split("=", 1)[1].split(",")
        for i, arm in enumerate(arms):
            summary(out / f"{i}_experiment={arm}", arm, 0, "completed" if ended or i < len(arms) - 1 else "interrupted")
        raise subprocess.CalledProcessError(code, cmd)
    return run


@pytest.mark.parametrize(("code", "exit_code", "stopped_by"), [(130, 130, "SIGINT"), (-2, 130, "SIGINT"),
                                                               (143, 143, "SIGTERM"), (-9, 137, "SIGKILL")])
def test_a_sweep_stopped_by_a_signal_ends_the_script_with_128_plus_the_signal(
        tmp_path, monkeypatch, capsys, code, exit_code, stopped_by):
    outside_the_unit(monkeypatch, tmp_path, ["--doses", "v2_matched", "--arms", "grpo,sc_mis", "--seeds", "1",
                                             "--steps", "3"], sweeps=False)
    monkeypatch.setattr(R, "run", rlmix_train(code, ended=False))
    with pytest.raises(SystemExit) as stop:
        R.main()
    assert stop.value.code == exit_code
    err = capsys.readouterr().err
    assert f"reproduce: interrupted ({stopped_by}) during `train -m`" in err and "to go on from here: --resume " in err
    assert "exited with" not in err


def test_sigterm_between_commands_ends_with_143_and_the_resume_line(tmp_path, monkeypatch, capsys):
    """SIGTERM or SIGHUP while no command runs (the page, a plot) ended the script with no line."""
    import signal

    outside_the_unit(monkeypatch, tmp_path, ["--doses", "v2_matched", "--arms", "grpo", "--seeds", "1",
                                             "--steps", "3"], sweeps=False)
    before = signal.getsignal(signal.SIGTERM)

    def stopped(*_):
        raise R.Stopped(signal.SIGTERM)

    monkeypatch.setattr(R, "reproduce", stopped)
    with pytest.raises(SystemExit) as stop:
        R.main()
    assert stop.value.code == 143 and signal.getsignal(signal.SIGTERM) is before  # the handlers are put back
    assert "reproduce: interrupted (SIGTERM); to go on from here: --resume " in capsys.readouterr().err


def test_a_signal_after_every_run_of_the_sweep_ended_says_the_dose_finished(tmp_path, monkeypatch, capsys):
    # Ctrl-C in `rlmix train -m`'s teardown, after its sweep block: Python ends on the signal (-2).
    outside_the_unit(monkeypatch, tmp_path, ["--doses", "v2_matched", "--arms", "grpo,sc_mis", "--seeds", "1",
                                             "--steps", "3"], sweeps=False)
    monkeypatch.setattr(R, "run", rlmix_train(-2, ended=True))
    with pytest.raises(SystemExit) as stop:
        R.main()
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert "stopped (SIGINT) after every run of dose `v2_matched` had ended: the dose finished" in err
    assert "to go on from here: --resume " in err and "exited with" not in err

    # A failure is still a failure: exit 1, with its status.
    monkeypatch.setattr(R, "ROOT", tmp_path / "another")
    monkeypatch.setattr(R, "run", rlmix_train(1, ended=False))
    with pytest.raises(SystemExit) as stop:
        R.main()
    assert "`train -m` exited with 1 (above); to go on from here: --resume " in str(stop.value.code)


def test_the_pool_paragraph_states_the_windows_of_the_runs_own_length(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "ROOT", tmp_path)
    monkeypatch.setattr(R, "plot_curves", lambda *a: None)
    pools = {"cpu_bf16_a": [1e-4] * 3}
    short = [result(arm, 0, R.HEADLINE, 3, pools) for arm in ("grpo", "sc_mis")]
    page = R.write("short", [], short, [R.HEADLINE], ("grpo", "sc_mis"), 3, None).read_text()
    assert "(k3), steps 1-3 → the 3 steps before the run was first flagged (never flagged: its last 3);" in page
    assert "steps 1-50" not in page
    full = [result(arm, 0, R.HEADLINE, 300, {"cpu_bf16_a": [1e-4] * 300}) for arm in ("grpo", "sc_mis")]
    page = R.write("long", [], full, [R.HEADLINE], ("grpo", "sc_mis"), 300, None).read_text()
    assert "(k3), steps 1-50 → the 20 steps before the run was first flagged (never flagged: its last 20);" in page
