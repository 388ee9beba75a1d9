"""``rlmix eval checkpoint=<run dir>`` evaluates the task the run trained on; the command line wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlmix.commands.compose import compose_run_config
from rlmix.commands.eval import eval_plan, run_of
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.schema import MiniCodeTaskConfig
from rlmix.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ARITH = ROOT / "examples" / "arith"


def fake_run(run_dir: Path, started_in: Path, overrides: list[str], choices: dict) -> Path:
    """A run directory as Hydra leaves it: the composed config and the group options it picked."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from rlmix.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="rlmix.conf", version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    GlobalHydra.instance().clear()
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    hydra = {"hydra": {"runtime": {"cwd": str(started_in), "choices": choices}}}
    (run_dir / ".hydra" / "hydra.yaml").write_text(OmegaConf.to_yaml(hydra))
    return run_dir


DATASET_RUN = ["task=dataset", "task.train_files=train.jsonl", "task.eval_files=test.jsonl",
               "task.prompt_key=question", "task.reward=examples.arith.reward:reward",
               "task.format_regex='(\\d+)'", "task.chat_template=raw", "loop.max_new_tokens=11"]


@pytest.fixture
def dataset_run(tmp_path):
    return fake_run(tmp_path / "run", ARITH, DATASET_RUN, {"task": "dataset", "model": "embedded"})


def test_eval_of_a_run_dir_takes_the_runs_task_and_generation_length(dataset_run, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # elsewhere than where the run started: relative files still resolve
    args = [f"checkpoint={dataset_run}"]
    cfg = compose_run_config(args, for_training=False, run=run_of(args))
    assert isinstance(cfg.task, DatasetTaskConfig)
    assert cfg.task.train_files == str(ARITH / "train.jsonl") and cfg.task.eval_files == str(ARITH / "test.jsonl")
    assert (cfg.task.prompt_key, cfg.task.reward) == ("question", "examples.arith.reward:reward")
    assert (cfg.task.format_regex, cfg.task.chat_template.value, cfg.task.split) == ("(\\d+)", "raw", "test")
    assert cfg.eval.max_new_tokens == 11


def test_command_line_overrides_win_over_the_run(dataset_run):
    args = [f"checkpoint={dataset_run}", "task.split=train", "task.reward=math", "eval.max_new_tokens=5"]
    cfg = compose_run_config(args, for_training=False, run=run_of(args))
    assert (cfg.task.split, cfg.task.reward, cfg.eval.max_new_tokens) == ("train", "math", 5)
    assert cfg.task.prompt_key == "question"  # what the command line leaves alone still follows the run
    other = [f"checkpoint={dataset_run}", "task=minicode"]  # a group option replaces the run's whole task
    cfg = compose_run_config(other, for_training=False, run=run_of(other))
    assert isinstance(cfg.task, MiniCodeTaskConfig)


def test_a_run_without_eval_files_says_so_in_one_line(tmp_path):
    run = fake_run(tmp_path / "run", ARITH, [o for o in DATASET_RUN if "eval_files" not in o],
                   {"task": "dataset", "model": "embedded"})
    args = [f"checkpoint={run}"]
    with pytest.raises(ConfigError, match=r"^task.split=test: this task has no task.eval_files") as err:
        eval_plan(args)
    assert "\n" not in str(err.value)
    assert eval_plan([*args, "task.split=train"]).cfg.task.split == "train"


def test_a_model_dir_or_no_checkpoint_takes_nothing_from_any_run(tmp_path):
    assert run_of([]) is None and run_of([f"checkpoint={tmp_path}"]) is None  # no .hydra: not a run dir
    cfg = compose_run_config([], for_training=False, run=run_of([]))
    assert isinstance(cfg.task, MiniCodeTaskConfig) and cfg.eval.max_new_tokens == 24


def test_another_task_is_scored_beside_the_runs_own_score_not_over_it(dataset_run):
    from rlmix.eval.evaluate import default_out_dir

    own = eval_plan([f"checkpoint={dataset_run}", "task.split=train"]).cfg
    assert default_out_dir(own, "train") == dataset_run / "eval_train"  # the run's own task, as before
    other = eval_plan([f"checkpoint={dataset_run}", "task=minicode"]).cfg
    assert default_out_dir(other, "test") == dataset_run / "eval_minicode_test"
    assert default_out_dir(own, "train") != default_out_dir(other, "train")


def test_eval_of_a_run_finds_the_task_option_in_the_runs_own_config_folder(tmp_path, monkeypatch):
    """A run that took ``task=arith`` from ``hydra.searchpath=[file://examples/arith/conf]`` (or
    ``--config-dir``): Hydra records the folder in ``hydra.runtime.config_sources``, relative as given,
    and ``rlmix eval checkpoint=<run>`` looks there, from wherever it is started."""
    run = fake_run(tmp_path / "run", ROOT, ["hydra.searchpath=[file://examples/arith/conf]", "task=arith"],
                   {"task": "arith", "model": "embedded"})
    hydra = OmegaConf.load(run / ".hydra" / "hydra.yaml")
    hydra.hydra.runtime.config_sources = [
        {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
        {"path": "rlmix.conf", "schema": "pkg", "provider": "main"},
        {"path": "examples/arith/conf", "schema": "file", "provider": "hydra.searchpath in command-line"},
        {"path": "", "schema": "structured", "provider": "schema"}]
    (run / ".hydra" / "hydra.yaml").write_text(OmegaConf.to_yaml(hydra))
    monkeypatch.chdir(tmp_path)
    cfg = eval_plan([f"checkpoint={run}", "task.split=train"]).cfg
    assert isinstance(cfg.task, DatasetTaskConfig) and cfg.task.train_files == str(ARITH / "train.jsonl")
