"""`rlmix train` on agentic tasks through the real CLI: bad input before Ray, and one short sc_mis run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.agentic_models import BRIEF_AGENT
from tests.cli import rlmix_refusing
from tests.test_agentic_fixtures import make_task
from tests.test_scratch import left_behind, own_temp_dir

RLMIX = str(Path(sys.executable).with_name("rlmix"))
AGENT_KEYS = {"agent/turns_mean", "agent/tool_calls_mean", "agent/episode_tokens_mean", "agent/policy_token_frac",
              "agent/env_time_frac", "agent/infra_errors", "agent/end_reason/submit", "agent/end_reason/max_turns",
              "format/error_rate", "reward/mean", "correction/sc_head_mass", "staleness/mean"}


def rlmix_train(*args: str, cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RLMIX, "train", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # checked against the embedded agent model's context: a brief build on a cold cache (seconds)
@pytest.mark.parametrize("args,expected", [
    (["task=swebench_pro", "task.tasks_dir=/nonexistent/tasks"], "/nonexistent/tasks"),
    (["task=minicode_agent", "task.max_total_tokens=8"], "leaves no room for one turn"),
    (["task=minicode_agent", "task.max_total_tokens=4096"], "exceeds the model's context"),
    (["task=swebench_pro", "task.runtime=docker", "task.subset=all", "TASKS"], "Docker"),
], ids=["missing_tasks_dir", "no_room", "past_context", "runtime_unavailable"])
def test_bad_agentic_input_is_one_line_and_exit_2_before_ray(tmp_path, args, expected):
    if "TASKS" in args:
        if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
            pytest.skip("a Docker engine answers here")
        make_task(tmp_path / "tasks", "calc")
        args = [a if a != "TASKS" else f"task.tasks_dir={tmp_path / 'tasks'}" for a in args]
    out = rlmix_refusing("train", *args, *BRIEF_AGENT, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "ray" not in out.stderr.lower()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_sc_mis_trains_on_minicode_agent_episodes_through_the_cli(tmp_path):
    run = tmp_path / "run"
    temp = own_temp_dir()  # the run's TMPDIR: every sandbox and task directory it makes goes there
    # Level 1 only: a batch whose rewards are all 0 has no gradient, and level 1 makes that unlikely.
    out = rlmix_train("+experiment=sc_mis", "task=minicode_agent", "task.levels=[1]", "fleet=smoke", "loop.steps=2",
                      "loop.groups_per_step=4", "loop.group_size=4", "loop.groups_per_request=2",
                      "logger.wandb.mode=disabled", f"hydra.run.dir={run}", cwd=tmp_path, timeout=1500,
                      env=os.environ | {"TMPDIR": str(temp)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert left_behind(temp) == []  # no sandbox, task directory or bwrap left once the run has ended
    shutil.rmtree(temp)  # what else used TMPDIR: Ray, torch's compile cache
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert not AGENT_KEYS - row.keys(), AGENT_KEYS - row.keys()
        assert 1 <= row["agent/turns_mean"] <= 6 and 0 < row["agent/policy_token_frac"] < 1
        assert row["format/error_rate"] < 0.5 and row["agent/infra_errors"] == 0
    assert any(k.startswith("agent/turns_mean/") for k in set().union(*rows))  # per pool
    assert any(r["reward/mean"] > 0 for r in rows), "no episode succeeded: nothing to learn from"
    summary = json.loads((run / "summary.json").read_text())
    base = load_file(Path(summary["model_dir"]) / "model.safetensors")
    final = load_file(run / "checkpoints" / "step_2" / "model.safetensors")
    assert any(not torch.equal(base[k].float(), final[k].float()) for k in base)


# sc_mis: the test above. Per arm: (masks tokens: MIS, centres on the top-K head: SC).
OTHER_ARMS = {"grpo": (False, False), "icepop": (True, False), "sc": (False, True), "grpo_topp": (False, False),
              "sc_mis_topp": (True, True)}


@pytest.mark.slow
def test_every_other_arm_trains_on_episodes_in_one_cli_sweep(tmp_path):
    """The study's other arms (PPO clip, MIS, SC alone, top-p with support replay) on episodes through
    ``rlmix train -m``: one step each, every job completes and reports what its correction did. What
    the arms' episodes earn is not checked here (the sc_mis run above learns from successful ones), so
    the agent recipe warm-started briefly serves."""
    sweep = tmp_path / "sweep"
    out = rlmix_train("-m", f"+experiment={','.join(OTHER_ARMS)}", "task=minicode_agent", "task.levels=[1]",
                      *BRIEF_AGENT, "fleet=smoke", "loop.steps=1", "loop.groups_per_step=2", "loop.group_size=4",
                      "loop.groups_per_request=2", "logger.wandb.mode=disabled", f"hydra.sweep.dir={sweep}",
                      cwd=tmp_path, timeout=2400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = {json.loads((d / "summary.json").read_text())["name"]: d for d in sweep.iterdir() if d.is_dir()
            and (d / "summary.json").exists()}
    assert sorted(runs) == sorted(OTHER_ARMS)
    for arm, run in runs.items():
        [row] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert row["step"] == 1 and row["agent/infra_errors"] == 0, arm
        masks, centres = OTHER_ARMS[arm]
        assert ("correction/masked_frac" in row) == masks, arm  # MIS reports what it masked
        assert ("correction/sc_head_mass" in row) == centres, arm  # SC: the head mass it centred on


@pytest.mark.slow
def test_eval_runs_minicode_agent_episodes_through_the_cli(tmp_path):
    """``rlmix eval task=minicode_agent``: the test split's problems as sandboxed episodes, graded as in training."""
    out_dir = tmp_path / "eval"
    temp = own_temp_dir()
    out = subprocess.run([RLMIX, "eval", "task=minicode_agent", "task.levels=[1]", "eval.samples=1", "eval.k=[1]",
                          *BRIEF_AGENT, "logger=disabled", f"eval.out_dir={out_dir}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=1800, env=os.environ | {"TMPDIR": str(temp)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert left_behind(temp) == []
    shutil.rmtree(temp)  # what else used TMPDIR: Ray, torch's compile cache
    summary = json.loads((out_dir / "eval.json").read_text())
    score = summary["sets"]["all"]["pass@1"]
    assert score["num_tasks"] == summary["sets"]["all"]["num_tasks"] > 0 and 0 <= score["mean"] <= 1
    assert sum(summary["end_reasons"].values()) == score["num_tasks"] and summary["infra_failures"]["count"] == 0
    # the test split's levels are sets of their own (20 problems each), whatever task.levels trains on
    assert {name: s["num_tasks"] for name, s in summary["sets"].items()} == \
        {"all": 60, "level1": 20, "level2": 20, "level3": 20}
    # what was scored and how, as a single-turn evaluation records it; the table on the console too
    assert (summary["task"], summary["split"], summary["temperature"]) == ("minicode_agent", "test", 1.0)
    assert Path(summary["checkpoint"]).is_absolute() and summary["reference"] and summary["max_turn_tokens"] > 0
    assert f"level1      1   {summary['sets']['level1']['pass@1']['mean']:.4f}" in out.stdout, out.stdout
