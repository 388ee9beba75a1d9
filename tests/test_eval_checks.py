"""``rlmix eval``'s own input: ``eval.*`` out of range, a damaged or incomplete checkpoint, a model
directory that does not load, a split the task lacks. Each is one line naming the key, exit 2,
nothing written; a run directory's damaged newest checkpoint is skipped with a line saying why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlmix.assembly.checkpoints import RunState, seal, staging_dir
from tests.cli import rlmix_refusing

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
# two rows, one sample, four tokens: a whole evaluation takes well under a second
QUICK = ["task=dataset", "task.train_files=../rows.jsonl", "task.eval_files=../rows.jsonl", "task.chat_template=raw",
         "eval.samples=1", "eval.k=[1]", "eval.max_new_tokens=4"]


@pytest.fixture
def run_dir(tmp_path, tiny_llama_dir) -> Path:
    """A run directory with two sealed checkpoints of the tiny Llama and an earlier eval.json, and an
    empty directory to run the command in (``cwd``) beside the rows it scores."""
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run = tmp_path / "run"
    for step in (1, 2):
        staged = staging_dir(run, step)
        staged.mkdir()  # the trainer's to make
        for file in tiny_llama_dir.iterdir():
            shutil.copy(file, staged / file.name)
        seal(staged, RunState(step=step, next_request=0, wall_time_s=0.0), keep=2)
    (run / "eval_test").mkdir()
    (run / "eval_test" / "eval.json").write_text("{}")  # the run's earlier score
    (tmp_path / "cwd").mkdir()
    return run


def refused(out, key: str) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}"), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return lines[0]


def nothing_written(run: Path) -> None:
    assert not list((run.parent / "cwd").iterdir())
    assert (run / "eval_test" / "eval.json").read_text() == "{}"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "eval_test"]


def truncate(file: Path, size: int = 1000) -> None:
    with open(file, "r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("eval.temperature=0", "eval.temperature=0.0: must be in [0.001, 100]"),
        ("eval.temperature=-1", "eval.temperature=-1.0: must be in"),
        ("eval.max_new_tokens=0", "eval.max_new_tokens=0: must be >= 1"),
        ("eval.max_new_tokens=-3", "eval.max_new_tokens=-3: must be >= 1"),
        ("eval.samples=0", "eval.samples=0: must be >= 1"),
        ("eval.samples=-1", "eval.samples=-1: must be >= 1"),
        ("eval.k=[]", "eval.k=[]: every k must be in 1..eval.samples=1"),
        ("eval.k=[0,1]", "eval.k=[0, 1]: every k must be in 1..eval.samples=1"),
        ("eval.k=[2]", "eval.k=[2]: every k must be in 1..eval.samples=1"),
        ("eval.accelerator=nope", "eval.accelerator=nope eval.precision=fp32: accelerator='nope' is not in the"),
        ("eval.precision=nvfp4", "eval.accelerator=CPU eval.precision=nvfp4: accelerator CPU has no native"),
        ("eval.out_dir=../rows.jsonl", "eval.out_dir=../rows.jsonl: "),
    ],
)
def test_eval_settings_out_of_range_are_one_line_naming_the_key(run_dir, setting, key):
    out = rlmix_refusing("eval", f"checkpoint={run_dir}", *QUICK, setting, cwd=run_dir.parent / "cwd")
    line = refused(out, key)
    assert "allow_emulation" not in line  # the reference view has no such setting
    nothing_written(run_dir)


@pytest.mark.parametrize("setting", ["hydra.run.dir=elsewhere", "hydra.job.chdir=true", "hydra.verbose=true"])
def test_hydra_settings_eval_would_ignore_are_refused_pointing_to_eval_out_dir(run_dir, setting):
    """eval composes its config without running a Hydra app: ``hydra.run.dir`` was taken and ignored,
    the score written to the run's eval_test. Refused, naming where its result goes instead."""
    out = rlmix_refusing("eval", f"checkpoint={run_dir}", *QUICK, setting, cwd=run_dir.parent / "cwd")
    line = refused(out, f"{setting}: rlmix eval does not run as a Hydra app")
    assert "eval.out_dir=<dir>" in line
    nothing_written(run_dir)


def test_minicode_refuses_a_split_it_does_not_have_even_train(run_dir):
    """minicode trains on problems drawn afresh: train is no split to score, and an unset split
    (whose default reads train) means test."""
    quick = ["eval.samples=1", "eval.k=[1]", "eval.max_new_tokens=4"]
    for split in ("train", "tests"):
        out = rlmix_refusing("eval", f"checkpoint={run_dir}", f"task.split={split}", *quick, cwd=run_dir.parent / "cwd")
        refused(out, f"task.split='{split}' is not a minicode split; use one of ['hard51', 'test']")
    nothing_written(run_dir)


@pytest.mark.parametrize("damage", ["truncated", "no manifest"])
def test_an_incomplete_checkpoint_given_itself_is_refused(run_dir, damage):
    step = run_dir / "checkpoints" / "step_2"
    if damage == "truncated":
        truncate(step / "model.safetensors")
        why = "model.safetensors is truncated (1000 of"
    else:
        (step / "complete.json").unlink()
        why = "no complete.json"
    out = rlmix_refusing("eval", f"checkpoint={step}", *QUICK, cwd=run_dir.parent / "cwd")
    line = refused(out, f"checkpoint={step}: an incomplete checkpoint ({why}")
    assert "run directory" in line  # where a complete one is found
    nothing_written(run_dir)


def test_a_run_dirs_damaged_newest_checkpoint_is_skipped_saying_why(run_dir):
    """The older checkpoint is scored, and eval.json names it by its absolute path, though the
    command named the run relatively."""
    truncate(run_dir / "checkpoints" / "step_2" / "model.safetensors")
    out = rlmix_refusing("eval", "checkpoint=../run", *QUICK, cwd=run_dir.parent / "cwd")
    assert out.returncode == 0, out.stderr
    assert "skipping step_2: model.safetensors is truncated (1000 of" in out.stdout
    result = json.loads((run_dir / "eval_test" / "eval.json").read_text())
    assert result["checkpoint"] == str((run_dir / "checkpoints" / "step_1").resolve())


def test_a_run_dir_without_a_complete_checkpoint_says_why(run_dir):
    for step in (1, 2):
        truncate(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors")
    out = rlmix_refusing("eval", f"checkpoint={run_dir}", *QUICK, cwd=run_dir.parent / "cwd")
    refused(out, f"checkpoint={run_dir}: neither an HF model dir nor a run dir with a complete checkpoints/step_* "
                 "(step_2: model.safetensors is truncated")
    nothing_written(run_dir)


@pytest.mark.parametrize(
    ("file", "damage", "why"),
    [
        ("model.safetensors", b"", "weights do not load (SafetensorError: "),
        ("config.json", b"{", "config.json is not valid JSON"),
        ("tokenizer.json", b"{", "no loadable tokenizer"),
    ],
)
def test_a_model_dir_that_does_not_load_is_one_line_under_checkpoint(tmp_path, tiny_llama_dir, file, damage, why):
    """A plain model directory has no manifest to check: what fails to load is reported under the
    key the user gave, ``checkpoint=``, not ``model.path``."""
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    model = shutil.copytree(tiny_llama_dir, tmp_path / "model")
    if damage:
        (model / file).write_bytes(damage)
    else:
        truncate(model / file)
    (tmp_path / "cwd").mkdir()
    out = rlmix_refusing("eval", "checkpoint=../model", *QUICK, cwd=tmp_path / "cwd")
    line = refused(out, f"checkpoint=../model: {why}")
    assert "model.path" not in line
    assert not list((tmp_path / "cwd").iterdir())
