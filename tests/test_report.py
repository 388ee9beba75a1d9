"""`rlmix report` on synthetic run directories laid out as `rlmix train -m` (Hydra multirun) writes them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from rlmix.errors import ConfigError
from rlmix.commands.report import run_report
from rlmix.report import ReportWindows, collect_runs, format_table, summarize, write_report
from rlmix.report.plots import arm_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = 20  # steps per fixture run


def write_run(
    run_dir: Path,
    name: str,
    seed: int,
    rows: list[dict],
    summary: dict | None = None,
    overrides: list[str] | None = None,
) -> Path:
    (run_dir / ".hydra").mkdir(parents=True)
    config = {"name": name, "seed": seed, "trainer": {"lr": 3e-5}, "monitor": {"action": "warn"}, "loop": {"steps": N}}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    overrides = overrides if overrides is not None else [f"+experiment={name}", f"seed={seed}"]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def collapsing_rows() -> list[dict]:
    """Reward 0.2 → 0.6 at step 10 → 0.1 at step 15; KL ×10 and format errors 0.2 → 0.7 at step 15."""
    rows = []
    for t in range(N):
        late = t >= 15
        rows.append({
            "step": t,
            "time": 3.0 * t,
            "reward/mean": 0.1 if late else (0.6 if t >= 10 else 0.2),
            "mismatch/kl_k3": 0.01 if late else 0.001,
            "format/error_rate": 0.7 if late else 0.2,
            "train/grad_norm": 1.0,
            "monitor/collapse": int(t >= 16),
            "monitor/reason": "reward_drop: reward EMA fell" if t >= 16 else "",
        })
    return rows


def stable_rows(offset: float = 0.0) -> list[dict]:
    """Reward rising 0.3 + 0.01 t (+ offset), constant KL and format errors, no collapse."""
    return [
        {
            "step": t,
            "time": 2.0 * t,
            "reward/mean": 0.3 + 0.01 * t + offset,
            "mismatch/kl_k3": 0.002,
            "format/error_rate": 0.1,
            "monitor/collapse": 0,
            "monitor/reason": "",
        }
        for t in range(N)
    ]


COLLAPSE_SUMMARY = {
    "status": "collapsed",
    "reward/mean": 0.1,
    "collapse": {"verdict": True, "step": 16, "reason": "reward_drop: reward EMA fell"},
    "wall_time_s": 123.4,
    "fleet": {"pools": {"h100_fp8": {"count": 1}}},
}


@pytest.fixture()
def multirun(tmp_path: Path) -> Path:
    """multirun/2026-12-02/10-00-00/{0,1}: grpo seed 0 (collapsed, finished), sc_mis seed 0 (no summary yet)."""
    sweep = tmp_path / "multirun" / "2026-12-02" / "10-00-00"
    write_run(sweep / "0", "grpo", 0, collapsing_rows(), COLLAPSE_SUMMARY)
    write_run(sweep / "1", "sc_mis", 0, stable_rows())
    write_multirun(sweep, ["+experiment=grpo,sc_mis", "seed=0"])
    return sweep


def write_multirun(sweep: Path, task: list[str], subdir: str = "${hydra.job.num}") -> None:
    """The parts of the multirun.yaml Hydra writes into a sweep directory that say which jobs it holds."""
    hydra = {
        "mode": "MULTIRUN",
        "sweep": {"dir": str(sweep), "subdir": subdir},
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "max_batch_size": None,
                    "params": None},
        "overrides": {"hydra": [f"hydra.sweep.dir={sweep}", "hydra.mode=MULTIRUN"], "task": task},
    }
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra, "name": "x", "seed": 0}))


def test_collect_runs_reads_a_multirun(multirun: Path) -> None:
    runs = collect_runs(multirun)
    assert [(r.label, r.arm, r.seed) for r in runs] == [("0", "grpo", 0), ("1", "sc_mis", 0)]
    assert runs[0].overrides == ("+experiment=grpo", "seed=0")
    assert runs[0].summary is not None and runs[1].summary is None
    assert len(runs[0].metrics) == N


def test_summarize_matches_hand_computed_values(multirun: Path) -> None:
    grpo, sc_mis = summarize(collect_runs(multirun))
    # grpo: last 5 steps are the collapsed level; the best 5-step mean is steps 10..14 (all 0.6);
    # KL over steps 15..19 is 0.01 vs 0.001 on the early window (rows 5..14).
    assert (grpo.arm, grpo.seed, grpo.steps) == ("grpo", 0, N)
    assert grpo.final_reward == pytest.approx(0.1)
    assert grpo.peak_reward == pytest.approx(0.6)
    assert grpo.kl_growth == pytest.approx(10.0)
    assert grpo.final_format_error == pytest.approx(0.7) and grpo.peak_format_error == pytest.approx(0.7)
    assert (grpo.collapse, grpo.collapse_step, grpo.wall_time_s) == (True, 16, 123.4)
    assert grpo.collapse_reason.startswith("reward_drop")
    # sc_mis: mean of 0.3 + 0.01 t over t = 15..19 is 0.47, also its peak (monotone); no summary, so
    # the wall time is the last row's time (2 s × 19) and the verdict comes from metrics.jsonl.
    assert sc_mis.final_reward == pytest.approx(0.47)
    assert sc_mis.peak_reward == pytest.approx(0.47)
    assert sc_mis.kl_growth == pytest.approx(1.0)
    assert sc_mis.final_format_error == pytest.approx(0.1) and sc_mis.peak_format_error == pytest.approx(0.1)
    assert (sc_mis.collapse, sc_mis.collapse_step, sc_mis.wall_time_s) == (False, None, 38.0)


def test_the_page_names_the_rows_kl_growth_is_measured_against(multirun: Path) -> None:
    text = (write_report(multirun) / "report.md").read_text()
    assert "rows 6..15 of metrics.jsonl" in text, text  # counted as a reader counts lines: from 1
    lines = (multirun / "0" / "metrics.jsonl").read_text().splitlines()
    kl = [json.loads(line)["mismatch/kl_k3"] for line in lines]
    early = sum(kl[5:15]) / 10  # lines 6..15
    assert summarize(collect_runs(multirun))[0].kl_growth == pytest.approx(sum(kl[-5:]) / 5 / early)


def test_windows_are_configurable(multirun: Path) -> None:
    grpo = summarize(collect_runs(multirun / "0"), ReportWindows(final_steps=10, skip_steps=0, early_steps=5))[0]
    assert grpo.final_reward == pytest.approx((5 * 0.6 + 5 * 0.1) / 10)  # steps 10..19
    assert grpo.peak_reward == pytest.approx((5 * 0.2 + 5 * 0.6) / 10)  # steps 5..14
    assert grpo.kl_growth == pytest.approx((5 * 0.001 + 5 * 0.01) / 10 / 0.001)


def test_write_report_writes_table_and_plots(multirun: Path) -> None:
    out = write_report(multirun)
    assert out == multirun / "report"
    md = (out / "report.md").read_text()
    assert "| arm | seed | status | steps |" in md
    assert "| grpo | 0 | collapsed | 20/20 | 0.100 | 0.600 | 10.00x | 0.700 | 0.700 | yes | 16 | 123.4 | 0 |" in md
    assert "| sc_mis | 0 | running or killed | 20/20 | 0.470 | 0.470 | 1.00x | 0.100 | 0.100 | no | - | 38.0 | 1 |" \
        in md
    assert "reward_drop: reward EMA fell" in md and "![Reward](reward.png)" in md
    with (out / "report.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["arm"] for r in table] == ["grpo", "sc_mis"]
    assert float(table[0]["kl_growth"]) == pytest.approx(10.0) and table[1]["collapse_step"] == ""
    assert json.loads((out / "report.json").read_text())[0]["collapse_step"] == 16
    for name in ("reward.png", "kl.png", "format_errors.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name
    # The uniform-groups and where/ plots: these runs logged none, so each is a "no data" plot, always
    # written and linked.
    for name in ("uniform_groups.png", "grad_top1pct.png", "grad_ratio_tail.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC and f"]({name})" in md, name


def test_report_over_several_multiruns_pools_seeds_into_bands(multirun: Path, tmp_path: Path) -> None:
    second = tmp_path / "multirun" / "2026-12-02" / "11-00-00"
    write_run(second / "0", "sc_mis", 1, stable_rows(offset=0.1))
    write_run(second / "1", "sc_mis", 2, stable_rows(offset=0.2))
    runs = collect_runs(tmp_path / "multirun")
    assert sorted((r.arm, r.seed) for r in runs) == [("grpo", 0), ("sc_mis", 0), ("sc_mis", 1), ("sc_mis", 2)]
    grpo, sc_mis = arm_curves(runs, "reward/mean")
    assert (grpo.arm, grpo.seeds, sc_mis.arm, sc_mis.seeds) == ("grpo", 1, "sc_mis", 3)
    assert grpo.collapse_steps == [16] and sc_mis.collapse_steps == []
    assert sc_mis.steps == list(range(N))
    assert sc_mis.mean[4] == pytest.approx(0.34 + 0.1) and sc_mis.low[4] == pytest.approx(0.34)
    assert sc_mis.high[4] == pytest.approx(0.54)
    out = write_report(tmp_path / "multirun", out_dir=tmp_path / "out")
    assert len((out / "report.md").read_text().splitlines()) > 6
    assert (out / "kl.png").read_bytes()[:8] == PNG_MAGIC


def test_runs_in_natural_order_and_arms_split_by_differing_overrides(tmp_path: Path) -> None:
    for job in (2, 10):
        lr = "1e-5" if job == 2 else "3e-5"
        overrides = ["+experiment=sc", f"trainer.lr={lr}", "fleet=emulated_hetero6", "seed=0"]
        write_run(tmp_path / str(job), "sc", 0, stable_rows(), overrides=overrides)
    runs = collect_runs(tmp_path)
    assert [r.label for r in runs] == ["2", "10"]
    assert [r.arm for r in runs] == ["sc trainer.lr=1e-5", "sc trainer.lr=3e-5"]  # shared fleet= dropped


def test_a_name_given_beside_swept_experiments_keeps_the_experiments_apart(tmp_path: Path) -> None:
    # `-m +experiment=grpo,sc_mis name=cmp`: both runs are named cmp; pooled, GRPO and SC+MIS read as two seeds.
    write_multirun(tmp_path, ["+experiment=grpo,sc_mis", "name=cmp"])
    for num, experiment in enumerate(("grpo", "sc_mis")):
        write_run(tmp_path / str(num), "cmp", 0, stable_rows(), overrides=[f"+experiment={experiment}", "name=cmp"])
    assert [r.arm for r in collect_runs(tmp_path)] == ["cmp experiment=grpo", "cmp experiment=sc_mis"]


def test_a_swept_key_stays_in_the_label_before_its_other_values_ran(tmp_path: Path) -> None:
    # `-m correction=mis,sc_mis seed=0,1` stopped in its second job: both runs so far are correction=mis.
    write_multirun(tmp_path, ["correction=mis,sc_mis", "seed=0,1"])
    for seed in (0, 1):
        write_run(tmp_path / str(seed), "default", seed, stable_rows(), overrides=["correction=mis", f"seed={seed}"])
    assert [r.arm for r in collect_runs(tmp_path)] == ["default correction=mis"] * 2


def test_a_resumed_run_stays_in_its_arm(tmp_path: Path) -> None:
    # A resumed run's overrides.yaml gains resume=<its own directory>: a path, not a setting.
    for seed in (0, 1):
        overrides = ["+experiment=sc", "trainer.lr=1e-4", f"seed={seed}"] + ([f"resume={tmp_path / '1'}"] if seed else [])
        write_run(tmp_path / str(seed), "sc", seed, stable_rows(), overrides=overrides)
    assert [r.arm for r in collect_runs(tmp_path)] == ["sc", "sc"]


def test_the_verdict_uses_the_runs_own_lasting_rule(tmp_path: Path) -> None:
    # Flagged, then 15% format errors at the end: collapsed by the default rule (10%), not by the
    # monitor.lasting.format_errors=0.2 the run was trained (and its monitor judged) with.
    rows = [{"step": t, "time": float(t), "reward/mean": 0.3, "format/error_rate": 0.5 if 20 <= t < 30 else
             (0.15 if t >= 30 else 0.02), "monitor/episode": int(20 <= t < 30)} for t in range(1, 50)]
    for name, errors in (("strict", 0.1), ("lenient", 0.2)):
        run = write_run(tmp_path / name, name, 0, rows)
        config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        config["monitor"]["lasting"] = {"window": 10, "format_errors": errors}
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    verdicts = {run.arm: run.collapse()[0] for run in collect_runs(tmp_path)}
    assert verdicts == {"strict": True, "lenient": False}


def test_the_search_stops_at_run_directories_and_skips_hidden_ones(multirun: Path) -> None:
    # A run directory's own folders (checkpoints, W&B files) and hidden ones (.git, .venv) hold no runs.
    write_run(multirun / "0" / "checkpoints" / "step_5", "inner", 0, stable_rows())
    write_run(multirun / ".venv" / "x", "hidden", 0, stable_rows())
    assert [r.label for r in collect_runs(multirun)] == ["0", "1"]
    assert [r.label for r in collect_runs(multirun / "0")] == ["0"]  # the run's own name, not "."


def test_log_axis_drops_non_positive_kl_and_missing_metric_still_plots(tmp_path: Path) -> None:
    rows = [{"step": t, "time": t, "reward/mean": 0.5, "mismatch/kl_k3": 0.0 if t < 3 else 1e-3} for t in range(8)]
    write_run(tmp_path / "run", "tiny", 0, rows)
    runs = collect_runs(tmp_path / "run")
    assert arm_curves(runs, "mismatch/kl_k3", positive_only=True)[0].steps == list(range(3, 8))
    assert arm_curves(runs, "format/error_rate") == []
    out = write_report(tmp_path / "run")
    assert (out / "format_errors.png").read_bytes()[:8] == PNG_MAGIC  # a "no data" plot
    (row,) = summarize(runs)
    assert row.final_format_error is None
    assert row.kl_growth is None  # its last 5 rows (3..7) and the early window (5..7) overlap


def test_kl_growth_is_none_when_the_early_window_is_empty_or_zero(tmp_path: Path) -> None:
    zero = [{"step": t, "mismatch/kl_k3": 0.0 if t < 15 else 0.01} for t in range(20)]
    short = [{"step": t, "mismatch/kl_k3": 0.01} for t in range(5)]
    write_run(tmp_path / "zero", "a", 0, zero)
    write_run(tmp_path / "short", "b", 0, short)
    rows = {r.arm: r for r in summarize(collect_runs(tmp_path))}
    assert rows["a"].kl_growth is None and rows["b"].kl_growth is None


def test_kl_growth_is_none_while_the_final_rows_reach_into_the_early_window(tmp_path: Path) -> None:
    """A 10-step run's last 5 rows are rows 5..9, the early window's own: the ratio is not 1.00x but n/a,
    and so up to 19 rows; from 20 rows on the windows [5, 15) and the last 5 are apart."""
    for n in (10, 19, 20):
        write_run(tmp_path / f"r{n}", f"n{n}", 0, [{"step": t, "mismatch/kl_k3": 0.001 * (1 + t)} for t in range(n)])
    rows = {r.arm: r for r in summarize(collect_runs(tmp_path))}
    assert rows["n10"].kl_growth is None and rows["n19"].kl_growth is None
    assert rows["n20"].kl_growth == pytest.approx(18.0 / 10.5)  # rows 15..19 (mean 18e-3) over 5..14 (10.5e-3)
    assert "n/a" in format_table([rows["n10"]])


def test_format_table_is_plain_text(multirun: Path) -> None:
    text = format_table(summarize(collect_runs(multirun)))
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["arm", "seed"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split()[:4] == ["grpo", "0", "collapsed", "20/20"] and "n/a" not in text and "|" not in text


def test_truncated_last_line_is_dropped_but_a_bad_middle_line_is_an_error(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "a", 0, stable_rows())
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 20, "reward/me')
    assert len(collect_runs(run)[0].metrics) == N
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[3] = "not json"
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ConfigError, match=r"metrics.jsonl:4"):
        collect_runs(run)


def test_bad_paths_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        collect_runs(tmp_path / "nope")
    (tmp_path / "empty" / "0").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no run directories"):
        write_report(tmp_path / "empty")


def test_run_report_prints_the_table_and_where_it_wrote(multirun: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_report(multirun, tmp_path / "elsewhere")
    printed = capsys.readouterr().out
    assert out == tmp_path / "elsewhere" and (out / "report.md").is_file()
    assert printed.splitlines()[0].split()[:2] == ["arm", "seed"] and str(out / "report.md") in printed


def test_cli_report_on_a_multirun(multirun: Path) -> None:
    from typer.testing import CliRunner

    from rlmix.cli import app

    result = CliRunner().invoke(app, ["report", str(multirun)])
    assert result.exit_code == 0, result.output
    assert "grpo" in result.output and (multirun / "report" / "kl.png").read_bytes()[:8] == PNG_MAGIC
    missing = CliRunner().invoke(app, ["report", str(multirun / "nope")])
    assert missing.exit_code == 2 and "not a directory" in missing.output and "Traceback" not in missing.output


def test_the_report_judges_collapse_by_the_lasting_rule(tmp_path: Path) -> None:
    """A run flagged mid-way that ends above its start is not a collapse in the table (the rule of
    rlmix.metrics.lasting, as the monitor's verdict and scripts/reproduce.py): an older summary whose
    verdict latched on the first alarm, and a run still going whose rows carry an open episode."""
    flagged = [dict(row, **{"monitor/collapse": int(t == 12), "monitor/reason": "reward_drop: dip" if t == 12 else ""})
               for t, row in enumerate(stable_rows())]
    old_summary = {"collapse": {"verdict": True, "step": 12, "reason": "reward_drop: dip"}}
    write_run(tmp_path / "old", "grpo", 0, flagged, old_summary)
    going = [dict(row, **{"monitor/episode": int(t >= 12)}) for t, row in enumerate(collapsing_rows())]
    for row in going:
        row["monitor/collapse"] = 0
    write_run(tmp_path / "going", "grpo", 1, going)
    rows = {row.run: row for row in summarize(collect_runs(tmp_path))}
    assert (rows["old"].collapse, rows["old"].collapse_step, rows["old"].collapse_reason) == (False, None, "")
    # Reward 0.1 over the last 10 steps' half: their mean (0.35) is above the first 10's (0.2), but the
    # format errors (0.7 x 5 + 0.2 x 5) / 10 = 0.45 are above 10%: still down, so collapsed from step 12.
    assert (rows["going"].collapse, rows["going"].collapse_step) == (True, 12)


def test_a_format_episode_that_recovered_shows_in_the_peak_not_the_final_rate(tmp_path: Path) -> None:
    rows = stable_rows()
    for t in range(5, 10):  # five steps of 90% format errors, then back to 10%
        rows[t]["format/error_rate"] = 0.9
    write_run(tmp_path / "run", "mis", 1, rows)
    (row,) = summarize(collect_runs(tmp_path / "run"))
    assert row.final_format_error == pytest.approx(0.1) and row.peak_format_error == pytest.approx(0.9)
    assert not row.collapse


def test_where_figures_one_per_run_with_steps_without_gradient_shaded(tmp_path: Path) -> None:
    """`rlmix report --where`: a figure per run, linked from report.md, for runs with the ratio
    bands, runs from before them, and steps with no gradient (their shares absent)."""
    from typer.testing import CliRunner

    from rlmix.cli import app
    from rlmix.metrics.where import prob_bin_names, ratio_bin_names
    from rlmix.report.where_plot import where_plot_name

    def with_where(t: int) -> dict:
        row = stable_rows()[t] | {"reward/uniform_groups_frac": 1.0 if t in (5, 6) else 0.7}
        if t in (5, 6):  # every group uniform: no gradient, no shares
            return row
        row |= {f"where/grad/{b}": 1 / 7 for b in ratio_bin_names()}
        return row | {f"where/grad/{b}": 1 / 6 for b in prob_bin_names()}

    sweep = tmp_path / "multirun"
    write_run(sweep / "0", "mis", 0, [with_where(t) for t in range(N)])
    write_run(sweep / "1", "mis", 1, stable_rows())  # before where/ existed
    result = CliRunner().invoke(app, ["report", str(sweep), "--where"])
    assert result.exit_code == 0, result.output
    md = (sweep / "report" / "report.md").read_text()
    for run in collect_runs(sweep):
        figure = sweep / "report" / "where" / where_plot_name(run)
        assert figure.read_bytes()[:8] == PNG_MAGIC and f"(where/{figure.name})" in md
    assert "2 figure(s) in where/" in result.output
    plain = tmp_path / "plain"
    write_report(sweep, plain)
    assert not (plain / "where").exists() and "where/" not in (plain / "report.md").read_text()


def test_a_report_without_where_never_imports_torch(multirun: Path, tmp_path: Path) -> None:
    """`rlmix report` reads JSON and draws with matplotlib; torch (~2.5 core-s to import) comes only
    with `--where`, whose bin names live beside the trainer's where/ metrics."""
    import subprocess
    import sys

    code = (f"import contextlib, io, sys\nfrom rlmix.commands.report import run_report\n"
            f"with contextlib.redirect_stdout(io.StringIO()): run_report({str(multirun)!r}, {str(tmp_path / 'r')!r})\n"
            f"assert 'torch' not in sys.modules, 'rlmix report imported torch'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _steps(n: int, start: int = 1) -> list[dict]:
    return [{"step": t, "time": float(t), "reward/mean": 0.1 * t, "format/error_rate": 0.02}
            for t in range(start, start + n)]


def ended(steps: int, status: str) -> dict:
    return {"status": status, "steps": steps, "wall_time_s": 1.0, "collapse": {"verdict": False, "episodes": []}}


@pytest.fixture()
def cut_sweep(tmp_path: Path) -> Path:
    """Three jobs of 4 steps (``correction=sc,sc_mis,mis``), stopped during job 1 at step 2: job 0
    completed, job 1 interrupted (or killed: no summary), job 2 never ran."""
    sweep = tmp_path / "sweep"
    write_multirun(sweep, ["+experiment=smoke", "loop.steps=4", "correction=sc,sc_mis,mis"],
                   subdir="${hydra.job.num}_${rlmix_job_label:${hydra.overrides.task},${name},${seed}}")
    for num, mode, rows, summary in ((0, "sc", _steps(4), ended(4, "completed")),
                                     (1, "sc_mis", _steps(2), ended(2, "interrupted"))):
        run = write_run(sweep / f"{num}_correction={mode}", "sc_mis", 0, rows, summary,
                        overrides=["+experiment=smoke", "loop.steps=4", f"correction={mode}"])
        config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config | {"loop": {"steps": 4}}))
    return sweep


def test_every_row_says_how_its_run_ended_and_its_steps_done_of_planned(cut_sweep: Path) -> None:
    done, cut = summarize(collect_runs(cut_sweep))
    assert (done.status, done.finished, done.steps, done.planned_steps) == ("completed", True, 4, 4)
    assert (cut.status, cut.finished, cut.steps, cut.planned_steps) == ("interrupted", False, 2, 4)
    (cut_sweep / "1_correction=sc_mis" / "summary.json").unlink()  # the driver killed: no summary
    killed = summarize(collect_runs(cut_sweep))[1]
    assert (killed.status, killed.finished, killed.steps_done) == ("running or killed", False, "2/4")
    text = format_table(summarize(collect_runs(cut_sweep)))
    assert text.splitlines()[2].split()[2:5] == ["0", "completed", "4/4"]
    assert text.splitlines()[3].split()[2:7] == ["0", "running", "or", "killed", "2/4"]
    assert "did not finish" in text


def test_a_sweep_stopped_part_way_names_the_jobs_that_never_ran(cut_sweep: Path) -> None:
    from typer.testing import CliRunner

    from rlmix.cli import app

    result = CliRunner().invoke(app, ["report", str(cut_sweep)])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if "2_correction=mis" in line]
    assert line.split()[:4] == ["-", "-", "not", "run"]
    md = (cut_sweep / "report" / "report.md").read_text()
    assert "3 job(s): 1 completed, 1 interrupted, 1 not run." in md
    assert "1 finished run(s) in 1 arm(s) are compared." in md
    assert "| - | - | not run | - | n/a |" in md and "| 2_correction=mis |" in md
    rows = json.loads((cut_sweep / "report" / "report.json").read_text())
    assert [(r["run"], r["status"], r["finished"]) for r in rows] == [
        ("0_correction=sc", "completed", True), ("1_correction=sc_mis", "interrupted", False),
        ("2_correction=mis", "not run", False)]


def test_a_job_directory_without_metrics_and_an_unreadable_sweep_are_said(cut_sweep: Path) -> None:
    (cut_sweep / "2_correction=mis" / ".hydra").mkdir(parents=True)  # Hydra made it; no step was logged
    out = write_report(cut_sweep)
    assert "| - | - | no steps logged | 0/? |" in (out / "report.md").read_text()
    other = cut_sweep.parent / "other"
    write_multirun(other, ["seed=0,1"], subdir="run_${seed}")
    write_run(other / "run_0", "a", 0, _steps(4), ended(4, "completed"))
    md = (write_report(other) / "report.md").read_text()
    assert "**Warning:** multirun.yaml: the sweep's jobs not checked" in md and "1 run(s): 1 completed" in md


def test_a_run_its_monitor_never_judged_says_so_instead_of_collapse_no(tmp_path: Path) -> None:
    summary = ended(8, "completed") | {"collapse": {"verdict": False, "judged": False, "updates": 8, "judged_from": 16}}
    write_run(tmp_path / "short", "sc_mis", 0, _steps(8), summary)
    write_run(tmp_path / "long", "sc_mis", 1, _steps(20), ended(20, "completed"))  # from before the field: judged
    rows = summarize(collect_runs(tmp_path))
    assert [(r.run, r.verdict, r.judged) for r in rows] == [("short", "not judged", False), ("long", "no", True)]
    assert "not judged" in format_table(rows)


def test_a_run_with_no_steps_says_so_instead_of_collapse_no(tmp_path: Path) -> None:
    write_run(tmp_path / "0", "a", 0, [])  # killed before step 1
    cut = write_run(tmp_path / "1", "a", 1, [])
    (cut / "metrics.jsonl").write_text('{"step": 1, "reward/me')  # its only line cut off
    rows = summarize(collect_runs(tmp_path))
    assert [(r.steps_done, r.collapse, r.status) for r in rows] == [("0/20", None, "running or killed")] * 2
    text = format_table(rows)
    assert all(line.split()[5:7] == ["0/20", "n/a"] and "no steps" in line for line in text.splitlines()[2:4])


def test_steps_that_go_back_in_one_file_refuse_the_run(tmp_path: Path) -> None:
    """Two runs appended into one directory ([1..4, 1..4]) are not one run of eight rows."""
    from typer.testing import CliRunner

    from rlmix.cli import app

    run = write_run(tmp_path / "run", "a", 0, _steps(4) + _steps(4))
    with pytest.raises(ConfigError, match=r"metrics.jsonl:5: step 1 after step 4"):
        collect_runs(tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and str(run / "metrics.jsonl") in result.output
    assert "Traceback" not in result.output
    write_run(tmp_path / "again", "a", 0, _steps(2) + _steps(1, start=2))  # a step written twice
    with pytest.raises(ConfigError, match=r"again/metrics.jsonl:3: step 2 after step 2"):
        collect_runs(tmp_path / "again")


def test_the_plots_average_finished_runs_only(cut_sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlmix.report.plots as plots

    averaged: list[list[str]] = []
    real = plots.arm_curves

    def recording(runs, *args, **kwargs):
        averaged.append([r.label for r in runs])
        return real(runs, *args, **kwargs)

    monkeypatch.setattr(plots, "arm_curves", recording)
    write_report(cut_sweep)
    assert averaged and all(labels == ["0_correction=sc"] for labels in averaged)
