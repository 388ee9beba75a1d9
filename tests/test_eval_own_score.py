"""``rlmix eval`` of a run with task settings other than the run's own (other eval files, another
reward) scores them beside the run's own score, never over it; eval.json says what it scored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlmix.assembly.checkpoints import RunState, seal, staging_dir
from tests.cli import rlmix_in_process
from tests.test_eval_follows_run import fake_run

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
OTHER = [{"prompt": "3+3=", "answer": "6"}]
RUN_TASK = ["task=dataset", "task.train_files=rows.jsonl", "task.eval_files=rows.jsonl", "task.chat_template=raw"]
# one sample of four tokens per row: an evaluation takes well under a second
QUICK = ["eval.samples=1", "eval.k=[1]", "eval.max_new_tokens=4", "logger=disabled"]


@pytest.fixture
def run(tmp_path, tiny_llama_dir) -> Path:
    """A dataset run (its .hydra, started in ``tmp_path``) with a sealed checkpoint of the tiny Llama."""
    for name, rows in (("rows.jsonl", ROWS), ("other.jsonl", OTHER)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = fake_run(tmp_path / "run", tmp_path, RUN_TASK, {"task": "dataset", "model": "embedded"})
    staged = staging_dir(run, 1)
    staged.mkdir()
    for file in tiny_llama_dir.iterdir():
        shutil.copy(file, staged / file.name)
    seal(staged, RunState(step=1, next_request=0, wall_time_s=0.0), keep=1)
    return run


def scored(run: Path, *args: str) -> tuple[Path, dict, str]:
    """``rlmix eval checkpoint=run *args`` from the directory the run started in: (the eval.json it
    wrote, its content, its closing line)."""
    out = rlmix_in_process("eval", "checkpoint=run", *QUICK, *args, cwd=run.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("wrote "), out.stdout
    path = run.parent / last.removeprefix("wrote ").split(" (")[0]
    return path, json.loads(path.read_text()), last


def test_other_eval_files_or_another_reward_are_scored_beside_the_runs_own_score(run):
    own, first, line = scored(run)
    assert own == run / "eval_test" / "eval.json" and line == "wrote run/eval_test/eval.json"
    other, result, _ = scored(run, "task.eval_files=other.jsonl")
    assert json.loads(own.read_text()) == first  # the run's own score is where it was, as it was
    assert other.parent.parent == run and other.parent.name.startswith("eval_test-eval_files-"), other
    assert (first["eval_files"], first["reward"]) == (str(run.parent / "rows.jsonl"), "exact")
    assert first["differs_from_run"] == {} and first["overrides"] == ["checkpoint=run", *QUICK]
    assert result["eval_files"] == str(run.parent / "other.jsonl") and len(result["tasks"]) == 1
    assert result["differs_from_run"] == {"task.eval_files": str(run.parent / "other.jsonl")}

    math, result, _ = scored(run, "task.reward=math")
    assert math.parent.name.startswith("eval_test-reward-") and math not in (own, other)
    assert (result["reward"], result["differs_from_run"]) == ("math", {"task.reward": "math"})
    assert json.loads(own.read_text()) == first

    # the same evaluation again: the same directory, and the line says it replaced the earlier result
    again, _, line = scored(run, f"task.eval_files={run.parent / 'other.jsonl'}")  # however the path is spelled
    assert again == other and line == f"wrote {other.relative_to(run.parent)} (replacing the earlier one there)"
    again, _, line = scored(run)
    assert again == own and line == "wrote run/eval_test/eval.json (replacing the earlier one there)"


def test_eval_json_says_how_the_samples_were_drawn_and_a_replacement_drawn_otherwise_says_so(run):
    own, first, _ = scored(run)
    assert (first["temperature"], first["max_new_tokens"], first["samples"]) == (1.0, 4, 1)
    again, second, line = scored(run, "eval.temperature=0.05")  # the same directory: it replaces the score
    assert again == own and second["temperature"] == 0.05
    assert line == "wrote run/eval_test/eval.json (replacing the earlier one there, drawn at temperature 1.0 -> 0.05)"


def test_the_runs_own_settings_given_again_are_its_own_and_a_reset_one_is_not(tmp_path, monkeypatch):
    """``task=dataset`` on the command line starts the task afresh from its defaults (the run's values
    are not applied under it): a value it resets differs from the run's, one given as the run had it
    (a relative path from where the run started) does not."""
    from rlmix.commands.eval import eval_plan, run_of, task_differs
    from rlmix.eval.evaluate import default_out_dir

    for name, rows in (("rows.jsonl", ROWS), ("other.jsonl", OTHER)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = fake_run(tmp_path / "run", tmp_path, [*RUN_TASK, "task.reward=math"], {"task": "dataset"})
    monkeypatch.chdir(tmp_path)

    def differs(*args: str) -> dict:
        given = [f"checkpoint={run}", *args]
        return task_differs(eval_plan(given).cfg, run_of(given), given)

    assert differs() == {} and differs("task.split=train") == {}  # the split names its directory already
    assert differs(*RUN_TASK, "task.reward=math") == {}
    assert differs(*RUN_TASK) == {"task.reward": "exact"}
    assert differs("task.eval_files=other.jsonl") == {"task.eval_files": str(tmp_path / "other.jsonl")}
    cfg = eval_plan([f"checkpoint={run}"]).cfg
    a, b = ({"task.eval_files": str(tmp_path / name)} for name in ("rows.jsonl", "other.jsonl"))
    assert default_out_dir(cfg, "test", {}) == run / "eval_test"
    assert default_out_dir(cfg, "test", a) != default_out_dir(cfg, "test", b)
    assert default_out_dir(cfg, "test", a) == default_out_dir(cfg, "test", dict(a))  # the same settings again
