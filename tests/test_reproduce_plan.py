"""scripts/reproduce.py's plans compose: every sweep of every profile, and every dose, is a valid
``rlmix train -m`` (a typo in a dose's key would otherwise surface an hour into `make reproduce`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rlmix.commands.compose import compose_run_config, expand_jobs

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce.py"


def load_script():
    spec = importlib.util.spec_from_file_location("reproduce", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations through it
    spec.loader.exec_module(module)
    return module


R = load_script()
SWEEPS = sorted({(dose, arms) for profile in R.PROFILES.values() for dose, arms in profile.plan}
                | {(dose, ("reinforce",)) for dose in R.DOSES})


@pytest.mark.parametrize(("dose", "arms"), SWEEPS, ids=[f"{d}-{'+'.join(a)}" for d, a in SWEEPS])
def test_every_sweep_of_the_script_composes(dose, arms):
    jobs = expand_jobs(R.sweep_overrides(dose, arms, seeds=1, steps=2), multirun=True)
    assert len(jobs) == len(arms)
    fleet = next(o.split("=", 1)[1] for o in R.DOSES[dose] if o.startswith("fleet="))
    for job in jobs:
        cfg = compose_run_config(job)
        assert cfg.loop.steps == 2 and cfg.fleet.name == fleet


def test_the_v2_doses_run_the_v2_workload_under_the_controlled_lag():
    # One seed gives one run only where the lag is set; the headline compares its fleet to the
    # matched control at the same lag.
    for dose in (R.HEADLINE, "v2_fleet", "v2_fp8", "v2_nvfp4_fp8kv", "v2_matched", "v2_matched_lr1e-3"):
        cfg = compose_run_config(R.sweep_overrides(dose, ("grpo",), seeds=1, steps=2))
        assert cfg.loop.lag == 0 and cfg.model.embedded_version.value == "v2"
    assert {dose for dose, _ in R.PROFILES["quick"].plan} == {R.HEADLINE, "v2_matched"}
    lagged = compose_run_config(R.sweep_overrides("v2_fp8kv_lag4", ("grpo",), seeds=1, steps=2))
    assert lagged.loop.lag == 4


def test_every_v2_dose_trains_with_the_attention_backward_of_the_pages():
    # The results pages' runs used PyTorch's fused backward; the default has changed since, and a
    # new cell of the map must be trained as its neighbours were.
    for dose in (d for d in R.DOSES if d.startswith("v2_")):
        cfg = compose_run_config(R.sweep_overrides(dose, ("sc_mis",), seeds=1, steps=2))
        assert cfg.trainer.attention_backward.value == "fused", dose


def test_a_resumed_dose_keeps_the_runs_that_ended_and_sweeps_the_rest(tmp_path):
    def run(where, arm, seed, status):
        run_dir = tmp_path / where
        run_dir.mkdir(parents=True)
        if status:  # a run killed outright writes no summary
            (run_dir / "summary.json").write_text(json.dumps({"name": arm, "seed": seed, "status": status}))

    # A stopped sweep, then a first resume that was interrupted in its second run.
    run("0_experiment=reinforce,seed=0", "reinforce", 0, "completed")
    run("1_experiment=reinforce,seed=1", "reinforce", 1, "collapsed")
    run("2_experiment=grpo,seed=0", "grpo", 0, "failed")
    run("3_experiment=grpo,seed=1", "grpo", 1, None)
    run("resumed_12-00-00/0_seed=0", "grpo", 0, "completed")
    run("resumed_12-00-00/1_seed=1", "grpo", 1, "interrupted")

    found = R.runs_in(tmp_path)
    assert found["grpo", 0] == (True, tmp_path / "resumed_12-00-00/0_seed=0")  # the run that ended wins
    assert found["grpo", 1] == (False, tmp_path / "resumed_12-00-00/1_seed=1")
    ended = {key for key, (done, _) in found.items() if done}
    assert ended == {("reinforce", 0), ("reinforce", 1), ("grpo", 0)}
    # grpo misses seed 1; icepop and sc_mis miss both seeds: one sweep for the two of them.
    sweeps = R.missing_sweeps(ended, ("reinforce", "grpo", "icepop", "sc_mis"), seeds=2)
    assert sweeps == [(("grpo",), (1,)), (("icepop", "sc_mis"), (0, 1))]
    assert R.missing_sweeps(ended, ("reinforce",), seeds=2) == []
    assert R.sweep_overrides("stale2", ("grpo", "sc_mis"), (1,), steps=2)[:2] == ["+experiment=grpo,sc_mis", "seed=1"]
    assert R.runs_in(tmp_path / "nothing") == {}


def test_a_flagged_run_is_lasting_while_its_reward_or_format_is_still_down():
    def run(collapsed, reward_last, format_last):
        fields = {k: float("nan") for k in R.RunResult.__dataclass_fields__}
        fields.update(arm="reinforce", seed=0, dose="stale2", collapsed=collapsed, reward_first=0.07,
                      reward_last=reward_last, format_last=format_last)
        return R.RunResult(**fields)

    assert run(True, 0.05, 0.02).lasting  # reward below its start
    assert run(True, 0.12, 0.30).lasting  # recovered reward, format errors still above 10%
    assert not run(True, 0.12, 0.02).lasting  # flagged, and climbed back
    assert not run(False, 0.01, 0.90).lasting  # never flagged


def test_a_resume_sweeps_only_the_missing_runs_and_its_page_says_what_ran(tmp_path, monkeypatch):
    # The training runs are outside the unit: a sweep here writes each run's summary and nothing else.
    def summary(run_dir: Path, arm: str, seed: int, status: str) -> None:
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"name": arm, "seed": seed, "status": status}))

    swept = []

    def sweep(out, dose, arms, seeds, steps):
        swept.append((out.name, arms, seeds))
        for arm in arms:
            for seed in seeds:
                summary(out / f"{arm},{seed}", arm, seed, "completed")
        return R.sweep_overrides(dose, arms, seeds, steps)

    def collect(run_dir, dose, eval_samples):
        fields = {k: float("nan") for k in R.RunResult.__dataclass_fields__}
        got = json.loads((run_dir / "summary.json").read_text())
        fields.update(arm=got["name"], seed=got["seed"], dose=dose, collapsed=False, collapse_step=None,
                      collapse_reason="", rewards=[], kls=[], pool_kls={}, where={})
        return R.RunResult(**fields)

    stopped = tmp_path / "multirun" / "reproduce_x"
    summary(stopped / R.HEADLINE / "0_experiment=reinforce,seed=0", "reinforce", 0, "completed")
    summary(stopped / R.HEADLINE / "1_experiment=reinforce,seed=1", "reinforce", 1, "interrupted")
    no_probe = {"command": "rlmix probe", "reference": "", "pools": {}}  # the probes have their own test
    for name, value in (("ROOT", tmp_path), ("sweep", sweep), ("collect", collect), ("plot_curves", lambda *a: None),
                        ("probe", lambda out, dose, done: no_probe)):
        monkeypatch.setattr(R, name, value)
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--doses", R.HEADLINE, "--arms", "reinforce,grpo", "--seeds", "2",
                                      "--resume", str(stopped)])
    R.main()

    assert [(arms, seeds) for _, arms, seeds in swept] == [(("reinforce",), (1,)), (("grpo",), (0, 1))]
    assert all(out.startswith("resumed_") for out, _, _ in swept) and len({out for out, _, _ in swept}) == 2
    name = f"results_quick_{R.HEADLINE}_reinforce_grpo_2seeds"  # --seeds 2: not the profile's page
    page = (tmp_path / "docs" / f"{name}.md").read_text()
    assert "Resumed `reproduce_x`" in page and "stopped after 1 run;" in page
    assert "then `rlmix train -m +experiment=reinforce seed=1 " in page and "then `rlmix train -m +experiment=grpo seed=0,1 " in page
    runs = json.loads((tmp_path / "docs" / name / "runs.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in runs) == [("grpo", 0), ("grpo", 1), ("reinforce", 0), ("reinforce", 1)]


def test_the_pool_table_reads_each_pool_before_the_run_was_flagged():
    def run(arm, seed, collapse_step, fp8):
        fields = {k: float("nan") for k in R.RunResult.__dataclass_fields__}
        fields.update(arm=arm, seed=seed, dose=R.HEADLINE, collapsed=collapse_step is not None,
                      collapse_step=collapse_step, pool_kls={"h100_fp8": fp8, "a100_bf16": [1e-5] * 100})
        return R.RunResult(**fields)

    # Flagged at step 81: the window is steps 61-80, not the collapse after it.
    rising = [1e-4] * 60 + [1e-3] * 20 + [1.0] * 20
    flat = [2e-4] * 100
    table = R.pool_table([run("grpo", 0, 81, rising), run("sc_mis", 0, None, flat)], ("grpo", "sc_mis"))
    assert "| grpo | 1.0e-04 → 1.0e-03 | 1.0e-05 → 1.0e-05 |" in table
    assert "| sc_mis | 2.0e-04 → 2.0e-04 |" in table


def test_the_where_table_reads_a_run_s_own_metrics_before_it_was_flagged():
    """From metrics.jsonl rows to the page: low-probability bins summed, the same windows as the pool table."""
    def row(low_grad: float) -> dict:
        bins = dict.fromkeys(("p0-0.001", "p0.001-0.01", "p0.01-0.1", "p0.1-0.5", "p0.5-0.9", "p0.9-1"), 0.0)
        out = {f"where/tokens/{b}": 0.1 if b in R.LOW_P_BINS else 0.7 / 3 for b in bins}
        out |= {f"where/mismatch/{b}": 0.2 if b in R.LOW_P_BINS else 0.4 / 3 for b in bins}
        out |= {f"where/grad/{b}": low_grad / 3 if b in R.LOW_P_BINS else (1 - low_grad) / 3 for b in bins}
        bands = {f"where/grad/{b}": 0.1 for b in ("r0-0.2", "r0.2-0.5", "r0.5-0.8", "r0.8-1.25", "r1.25-2", "r2-5")}
        return out | bands | {"where/grad/r5-inf": 0.4, "where/grad_top1pct": 0.05, "where/grad_ratio_tail": 0.0}

    series = R.where_series([row(0.3)] * 60 + [row(0.9)] * 20 + [row(0.1)] * 20)
    assert series["tokens_low_p"][0] == pytest.approx(0.3) and series["grad_low_p"][70] == pytest.approx(0.9)
    assert R.where_series([{"reward/mean": 0.1}]) == {}  # a run from before where/
    fields = {k: float("nan") for k in R.RunResult.__dataclass_fields__}
    fields.update(arm="grpo", seed=0, dose=R.HEADLINE, collapsed=True, collapse_step=81, pool_kls={}, where=series)
    table = R.where_table([R.RunResult(**fields)], ("grpo", "sc_mis"))
    assert "| grpo | 0.300 → 0.300 | 0.600 → 0.600 | 0.300 → 0.900 | 0.050 → 0.050 | 0.000 → 0.000 | 0.300 → 0.300 |" in table
    assert "sc_mis" not in table and R.where_table([], ("grpo",)) == ""
    # Runs from before the ratio bands (their runs.json has no such series): the table goes without it.
    fields.update(where={k: v for k, v in series.items() if k != "grad_low_ratio"})
    older = R.where_table([R.RunResult(**fields)], ("grpo",))
    assert "p/q < 0.8" not in older
    assert older.endswith("| grpo | 0.300 → 0.300 | 0.600 → 0.600 | 0.300 → 0.900 | 0.050 → 0.050 | 0.000 → 0.000 |")


def test_a_resume_reuses_the_evaluation_a_run_already_has(tmp_path, monkeypatch):
    # rlmix eval is outside the unit: here it writes the score of the samples it was given.
    def score(samples, mean):
        (tmp_path / "eval_test" / "eval.json").write_text(
            json.dumps({"samples": samples, "pass_at_k": {"1": {"mean": mean, "stderr": 0.1}}}))

    def rlmix_eval(cmd, quiet=False):
        calls.append(cmd)
        score(int(next(a for a in cmd if a.startswith("eval.samples=")).split("=")[1]), 0.5)

    calls = []
    (tmp_path / "eval_test").mkdir()
    (tmp_path / "summary.json").write_text("{}")
    score(4, 0.25)
    monkeypatch.setattr(R, "run", rlmix_eval)
    assert R.evaluation(tmp_path, 4)["mean"] == 0.25 and not calls  # the run's own evaluation
    assert R.evaluation(tmp_path, 8)["mean"] == 0.5 and len(calls) == 1  # other samples: scored again


def _write_probe(out_dir: Path, kls: dict[str, float]) -> None:
    """What ``rlmix probe`` writes, with the fields a page reads; a pool per ``kls`` entry."""
    out_dir.mkdir(parents=True)
    pools = {name: {"label": f"emulated:{name}", "kl_k3": kl, "kl_exact": kl * 1.1, "logprob_abs_diff": kl * 20,
                    "router": {"layer_flip_rate": 0.02}, "attribution": {"shares": {"weights": 0.5, "kv": 0.4, "kernel": 0.1}}}
             for name, kl in kls.items()}
    (out_dir / "probe.json").write_text(json.dumps({"reference": {"label": "emulated:CPU/bf16"}, "pools": pools}))


def test_each_fleet_is_probed_once_and_its_page_tables_the_pools_that_measured_alike(tmp_path, monkeypatch):
    # rlmix probe is outside the unit: here it writes a probe.json into its probe.out_dir.
    probed = []

    def rlmix_probe(cmd, quiet=False):
        assert cmd[1] == "probe" and not any(a.startswith(("loop.", "trainer.")) for a in cmd), cmd
        probed.append(cmd)
        _write_probe(Path(next(a for a in cmd if a.startswith("probe.out_dir=")).split("=", 1)[1]),
                     {"h100_fp8": 2e-4, "h200_fp8": 2e-4, "b200_nvfp4": 7e-4})

    monkeypatch.setattr(R, "run", rlmix_probe)
    monkeypatch.setattr(R, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--doses", f"{R.HEADLINE},v2_fp8kv_lag4", "--probes-only"])
    R.main()
    # The lag dose differs from the headline only in loop.lag: one fleet, one probe.
    assert len(probed) == 1 and f"probe.prompts={R.PROBE_PROMPTS}" in probed[0]
    name = f"results_quick_{R.HEADLINE}_v2_fp8kv_lag4_probes"
    probes = json.loads((tmp_path / "docs" / name / "probes.json").read_text())
    assert set(probes) == {R.HEADLINE, "v2_fp8kv_lag4"} and probes[R.HEADLINE] == probes["v2_fp8kv_lag4"]
    assert json.loads((tmp_path / "docs" / name / "runs.json").read_text()) == []
    page = (tmp_path / "docs" / f"{name}.md").read_text()
    assert f"| `{R.HEADLINE}` | h100_fp8, h200_fp8 | 2.0e-4 | 2.2e-4 | 0.0040 | 2.0% | 0.50 / 0.40 / 0.10 |" in page
    assert f"| `{R.HEADLINE}` | b200_nvfp4 | 7.0e-4 |" in page and f"| `v2_fp8kv_lag4` | as `{R.HEADLINE}`: the same fleet |" in page

    # A merge carries the probes beside each runs.json onto its page.
    R.merge([tmp_path / "docs" / name / "runs.json"], "merged")
    assert "## Mismatch at fixed weights" in (tmp_path / "docs" / "results_merged.md").read_text()
    assert json.loads((tmp_path / "docs" / "results_merged" / "probes.json").read_text()) == probes


def test_a_resumed_invocation_keeps_the_probe_it_has(tmp_path, monkeypatch):
    _write_probe(tmp_path / R.HEADLINE / "probe", {"h100_fp8": 3e-4})
    monkeypatch.setattr(R, "run", lambda cmd, quiet=False: pytest.fail(f"ran {cmd}"))
    kept = R.probe(tmp_path / R.HEADLINE, R.HEADLINE, {})
    assert kept["pools"]["h100_fp8"]["kl_k3"] == 3e-4 and kept["command"].startswith("rlmix probe model=embedded_v2 ")


def test_a_cell_no_machine_can_train_is_refused_before_anything_runs():
    # The FP16 arm asks every pool for fp16, which the matched control's CPU pools do not have.
    problem = R.plan_problem([(R.HEADLINE, ("grpo", "fp16")), ("v2_matched", ("grpo", "fp16"))], steps=2)
    assert problem.startswith("fp16 at v2_matched: fleet.precision=fp16: fleet.pools.cpu_bf16_a: "
                              "accelerator CPU has no native")
    assert R.plan_problem([(R.HEADLINE, R.MAP_ARMS)], steps=2) is None


def test_make_reproduce_runs_the_v2_map_and_every_cell_of_it_can_train():
    # make reproduce is the map on v2: every arm at every precision dose and at the lag dose, each
    # cell checked as the script checks it before a 12-hour invocation starts.
    assert "scripts/reproduce.py --profile v2_map" in (SCRIPT.parents[1] / "Makefile").read_text()
    plan = dict(R.PROFILES["v2_map"].plan)
    assert list(plan) == ["v2_matched", "v2_fp8", R.HEADLINE, "v2_nvfp4_fp8kv", "v2_e5m2kv_w4a4", "v2_fp8kv_lag4"]
    assert all(arms == R.V2_MAP_ARMS for dose, arms in plan.items() if dose != "v2_matched")
    assert set(R.V2_MAP_ARMS) - set(plan["v2_matched"]) == {"fp16"}  # the control's CPU pools have no fp16
    assert R.plan_problem(R.PROFILES["v2_map"].plan, steps=2) is None


def test_a_merge_states_the_machines_of_its_pages_and_refuses_two_cpus(tmp_path):
    def page(name, machine):
        runs = tmp_path / name / "runs.json"
        runs.parent.mkdir()
        runs.write_text("[]")
        if machine is not None:
            (tmp_path / f"{name}.md").write_text(f"# page\n\nMachine: {machine}  \nSteps per run: 300\n")
        return runs

    amd = page("results_a", "x86_64 AMD EPYC, 2 cores, 24 GiB, no GPU")
    intel = page("results_b", "x86_64 Intel(R) Xeon(R) Processor, 2 cores, 24 GiB, no GPU")
    older = page("results_c", "x86_64, 2 cores, 24 GiB, no GPU")  # from before the line named the CPU
    bare = page("results_d", None)
    assert R.page_machine(amd) == "x86_64 AMD EPYC, 2 cores, 24 GiB, no GPU" and R.page_machine(bare) is None
    machines = {p: R.page_machine(p) for p in (amd, intel, older, bare)}
    problem = R.merge_problem(machines)
    assert problem.startswith("--merge: results_a ran on AMD EPYC, results_b on Intel(R) Xeon(R) Processor;")
    assert R.merge_problem({p: machines[p] for p in (intel, older, bare)}) is None


def test_every_merged_page_in_docs_draws_on_one_cpu():
    docs = SCRIPT.parents[1] / "docs"
    merged = [p for p in docs.glob("results_*.md") if "Drawn from the runs of earlier invocations" in p.read_text()]
    assert merged
    for page in merged:
        sources = [docs / line.split("](", 1)[1].split(")", 1)[0] for line in page.read_text().splitlines()
                   if line.startswith("- [results_")]
        machines = {src.with_suffix("") / "runs.json": R.page_machine(src.with_suffix("") / "runs.json") for src in sources}
        assert R.merge_problem(machines) is None, page.name


def test_a_run_s_worst_format_window_is_kept_beside_its_last_10_steps(tmp_path):
    # A run that went to 90% format errors for six steps and recovered: the last 10 steps read 2%.
    rows = [{"step": t + 1, "reward/mean": 0.1, "format/error_rate": 0.9 if 20 <= t < 26 else 0.02} for t in range(60)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({
        "name": "mis", "seed": 1, "wall_time_s": 1.0,
        "collapse": {"verdict": False, "step": None, "reason": "", "episodes": [{"start": 21, "reason": "format_errors"}]}}))
    run = R.collect(tmp_path, R.HEADLINE, eval_samples=4)
    assert run.format_last == pytest.approx(0.02) and run.format_peak == pytest.approx(0.9)
    assert run.collapsed and not run.lasting
    assert R.worst_window([{"x": 1.0}], "x", 5) == 1.0 and R.worst_window([{}], "x", 5) != R.worst_window([{}], "x", 5)
    table = R.arm_table([run], ("mis",))
    assert "| format errors, last 10 | format errors, worst 5 steps |" in table and "| 0.020 | 0.900 |" in table


def signalled_run(tmp_path, on_signal: str, send) -> tuple[str, str]:
    """The script's ``run`` of a command that, on SIGINT or SIGTERM, logs the signal and runs ``on_signal``
    (Python lines); ``send(script pid)`` once the command is up. The script prints how ``run`` ended and how
    many signals the command got: (stdout's last line, stderr)."""
    import subprocess
    import sys
    import time

    ready, log = tmp_path / "ready", tmp_path / "signals"
    child = ("import signal, sys, time, pathlib\n"
             "def stop(n, _):\n"
             f"    with open({str(log)!r}, 'a') as f: f.write(str(n) + '\\n')\n"
             + "".join(f"    {line}\n" for line in on_signal.splitlines()) +
             "signal.signal(signal.SIGINT, stop); signal.signal(signal.SIGTERM, stop)\n"
             f"pathlib.Path({str(ready)!r}).touch()\n"
             "time.sleep(60)\n")
    script = ("import importlib.util, subprocess, sys\n"
              f"spec = importlib.util.spec_from_file_location('reproduce', {str(SCRIPT)!r})\n"
              "mod = sys.modules['reproduce'] = importlib.util.module_from_spec(spec)\n"
              "spec.loader.exec_module(mod)\n"
              "try:\n"
              f"    mod.run([sys.executable, '-c', {child!r}])\n"
              "except subprocess.CalledProcessError as err:\n"
              "    print('failed', err.returncode, end=' ')\n"
              "except mod.Interrupted as err:\n"
              "    print('interrupted', err.signum, end=' ')\n"
              f"print('signals', len(open({str(log)!r}).read().split()))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()
    send(proc.pid)
    out, err = proc.communicate(timeout=60)
    return (out.strip().splitlines() or [""])[-1], err


def test_a_terminals_ctrl_c_lets_the_running_command_finish_and_end_on_its_own(tmp_path):
    """Ctrl-C in a terminal signals the script and its command together: the command (which saves
    and says how it stopped) is waited for, not killed, and the script ends on its failure."""
    import os
    import signal

    finished = tmp_path / "finished"
    stop = "import time, pathlib; time.sleep(0.6)  # a step finishing, a checkpoint\n" \
           f"pathlib.Path({str(finished)!r}).touch(); sys.exit(130)"
    last, err = signalled_run(tmp_path, stop, lambda pid: os.killpg(pid, signal.SIGINT))  # a terminal's Ctrl-C
    assert finished.exists(), "the command was killed before it finished"
    assert last == "failed 130 signals 1" and "Traceback" not in err, (last, err)


@pytest.mark.parametrize(("to_group", "child_code", "expected"), [
    (False, 143, "failed 143 signals 1"),  # SIGTERM to the script alone (`kill <pid>`): passed on, once
    (True, 0, "interrupted 2 signals 1"),  # Ctrl-C; the command ended of its own accord meanwhile: not lost
])
def test_a_signal_to_the_script_reaches_the_command_once_and_is_not_lost(tmp_path, to_group, child_code, expected):
    import os
    import signal

    send = (lambda pid: os.killpg(pid, signal.SIGINT)) if to_group else (lambda pid: os.kill(pid, signal.SIGTERM))
    last, err = signalled_run(tmp_path, f"time.sleep(0.5); sys.exit({child_code})", send)
    assert last == expected and "Traceback" not in err, (last, err)
