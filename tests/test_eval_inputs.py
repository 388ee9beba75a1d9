"""``rlmix eval`` of one of a run's checkpoints follows the run; a reward that fails is said, not hidden."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmix.commands.compose import compose_run_config
from rlmix.commands.eval import eval_plan, run_of
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.eval.evaluate import EVAL_FILE, default_out_dir, evaluate
from tests.test_eval_follows_run import ARITH, DATASET_RUN, fake_run


@pytest.fixture
def step_dir(tmp_path) -> Path:
    """A dataset run's ``checkpoints/step_3`` (an HF model dir: it holds a config.json)."""
    run = fake_run(tmp_path / "run", ARITH, DATASET_RUN, {"task": "dataset", "model": "embedded"})
    step = run / "checkpoints" / "step_3"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    return step


def test_a_checkpoint_of_a_run_is_evaluated_on_the_runs_settings(step_dir, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    args = [f"checkpoint={step_dir}"]
    cfg = compose_run_config(args, for_training=False, run=run_of(args))
    assert isinstance(cfg.task, DatasetTaskConfig) and cfg.task.eval_files == str(ARITH / "test.jsonl")
    assert cfg.eval.max_new_tokens == 11
    assert run_of([f"checkpoint={step_dir / '..' / 'step_3'}"]) is not None  # however the path is spelled


def test_a_checkpoint_of_a_run_is_scored_in_the_run_beside_the_runs_own_score(step_dir):
    run = step_dir.parents[1]
    own = eval_plan([f"checkpoint={step_dir}"]).cfg
    assert default_out_dir(own, "test") == run / "eval_step_3_test"
    other = eval_plan([f"checkpoint={step_dir}", "task=minicode"]).cfg
    assert default_out_dir(other, "test") == run / "eval_minicode_step_3_test"
    assert default_out_dir(eval_plan([f"checkpoint={run}"]).cfg, "test") == run / "eval_test"  # as before


def test_a_model_dir_outside_a_run_is_scored_under_outputs(tmp_path):
    model = tmp_path / "checkpoints" / "step_1"  # named like a checkpoint, but no run around it
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    cfg = eval_plan([f"checkpoint={model}"]).cfg
    assert run_of([f"checkpoint={model}"]) is None
    assert default_out_dir(cfg, "test").parts[:2] == ("outputs", "eval")


def test_a_reward_that_fails_on_every_sample_is_counted_and_said(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # passes the first-row check (the answer scored as a completion), raises on every sampled one: an
    # answer of 5 characters is out of reach of 2 new tokens
    (tmp_path / "fixc1_failing_reward.py").write_text(
        "def reward(completion, answer, row):\n    if completion == answer:\n        return 1.0\n"
        "    raise ValueError('boom')\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "ab", "answer": "aaaaa"}\n{"question": "ba", "answer": "bbbbb"}\n')
    out = tmp_path / "eval"
    plan = eval_plan([f"checkpoint={tiny_llama_dir}", "task=dataset", f"task.train_files={rows}",
                      f"task.eval_files={rows}", "task.prompt_key=question", "task.chat_template=raw",
                      "task.reward=fixc1_failing_reward:reward", "eval.samples=2", "eval.k=[1]",
                      "eval.max_new_tokens=2", f"eval.out_dir={out}"])
    lines = []
    summary = evaluate(plan, progress=lines.append)
    assert summary["reward_errors"] == 4 and summary["first_reward_error"] == "ValueError: boom"
    assert json.loads((out / EVAL_FILE).read_text())["reward_errors"] == 4
    said = [line for line in lines if line.startswith("reward errors:")]
    assert said == [f"reward errors: 4 of 4 samples scored 0 (first: ValueError: boom; per task in {out / EVAL_FILE})"]
