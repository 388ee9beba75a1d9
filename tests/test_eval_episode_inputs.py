"""``rlmix eval`` of an episode task refuses its bad input as ``rlmix train`` does: the runtime and the
tasks before any model is built or loaded, a model without room for one turn before it samples. Each
is one line, exit 2, and leaves nothing behind: no W&B run, no output directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlmix.errors import ConfigError
from rlmix.eval import evaluate
from tests.agentic_models import tiny_agent_model
from tests.cli import rlmix_refusing
from tests.test_agentic_fixtures import TRUSTED, make_task

ROOT = Path(__file__).resolve().parents[1]
ONE_SAMPLE = ["eval.samples=1", "eval.k=[1]", f"task.trusted={str(TRUSTED).lower()}"]


@pytest.fixture(scope="module")
def agent_model(tmp_path_factory) -> Path:
    """A random model with the embedded agent tokenizer and a 512-token context."""
    return tiny_agent_model(tmp_path_factory.mktemp("tiny_agent"))


@pytest.fixture
def tasks(tmp_path) -> Path:
    """Two runnable Harbor tasks, ``calc`` and ``calc2``, and an empty directory to run the command in."""
    for task_id in ("calc", "calc2"):
        make_task(tmp_path / "tasks", task_id)
    (tmp_path / "cwd").mkdir()
    return tmp_path / "tasks"


def refused(out, start: str) -> str:
    """The error line; a Harbor task set's problems follow it indented, one a line (docs/hard51.md)."""
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {start}"), out.stderr
    assert all(line.startswith("  ") for line in lines[1:]) and not out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return lines[0]


def eval_refusing(tmp_path: Path, model: Path, *args: str):
    """``rlmix eval`` in ``tmp_path/cwd`` on ``model``, whose result would go to ``outputs/eval/...`` there."""
    return rlmix_refusing("eval", f"model.path={model}", *ONE_SAMPLE, *args, cwd=tmp_path / "cwd")


def nothing_left(tmp_path: Path) -> None:
    assert not list((tmp_path / "cwd").iterdir())


def no_docker(monkeypatch) -> None:
    import rlmix.agentic.docker as docker

    monkeypatch.setattr(docker, "docker_available", lambda: False)


def input_error(tmp_path: Path, tasks: Path, case: str, monkeypatch) -> tuple[list[str], str]:
    """(the settings of ``case``, the start of its one line)."""
    ids = tmp_path / "ids.txt"
    if case == "missing_tasks_dir":
        return [f"task.tasks_dir={tmp_path / 'nope'}"], f"task.tasks_dir={tmp_path / 'nope'} is not a directory"
    if case == "missing_subset_file":
        return ([f"task.tasks_dir={tasks}", f"task.subset_file={ids}"],
                f"task.subset_file={ids} does not exist")
    if case == "unknown_ids":
        ids.write_text("calc\nnope_1\n")
        return [f"task.tasks_dir={tasks}", f"task.subset_file={ids}", "task.expected_subset_size=null"], "1 problem"
    if case == "bad_toml":
        (tasks / "calc2" / "task.toml").write_text("version = = 1\n")
        return [f"task.tasks_dir={tasks}", "task.subset=all"], "1 problem(s) with the tasks"
    if case == "no_repo":
        import shutil

        shutil.rmtree(tasks / "calc2" / "environment" / "repo")
        return ([f"task.tasks_dir={tasks}", "task.subset=all", "task.runtime=local"],
                "1 task(s) cannot run with task.runtime=local: task calc2 has no environment/repo/")
    assert case == "docker_without_engine"
    no_docker(monkeypatch)
    return ([f"task.tasks_dir={tasks}", "task.subset=all", "task.runtime=docker"],
            "task.runtime=docker needs a running Docker engine")


INPUT_ERRORS = ["missing_tasks_dir", "missing_subset_file", "unknown_ids", "bad_toml", "no_repo",
                "docker_without_engine"]


@pytest.mark.parametrize("case", INPUT_ERRORS)
def test_a_harbor_tasks_bad_input_is_refused_before_the_model_is_resolved(tmp_path, tasks, agent_model, case,
                                                                          monkeypatch):
    """Resolving the model may build the embedded agent model (most of a minute on a cold cache) or
    find a run's newest checkpoint; a typo in the task's input is refused before either."""
    def resolved(*_args, **_kwargs):
        raise AssertionError("the model was resolved before the task's input was checked")

    monkeypatch.setattr(evaluate, "resolve_checkpoint", resolved)
    args, start = input_error(tmp_path, tasks, case, monkeypatch)
    out = eval_refusing(tmp_path, agent_model, "task=swebench_pro", *args)
    refused(out, start)
    nothing_left(tmp_path)


@pytest.mark.parametrize("case", ["unknown_ids", "docker_without_engine"])
def test_a_refused_episode_eval_leaves_no_directory_or_wandb_run(tmp_path, tasks, agent_model, case, monkeypatch):
    """The default logger's offline W&B run went into the output directory before the tasks were
    read: ``outputs/eval/<time>_<subset>/wandb/offline-run-*`` stayed after the refusal."""
    args, start = input_error(tmp_path, tasks, case, monkeypatch)
    refused(eval_refusing(tmp_path, agent_model, "task=swebench_pro", *args), start)
    nothing_left(tmp_path)


def test_a_context_shorter_than_max_total_tokens_is_refused_before_sampling(tmp_path, tasks, agent_model,
                                                                            monkeypatch):
    """A 512-token model under swebench_pro's task.max_total_tokens=32768 ran its episodes on past the
    positions it knows (rc 0, garbage); ``rlmix train`` refuses the same input in the same words."""
    def sampled(*_args, **_kwargs):
        raise AssertionError("the reference sampler was built for an evaluation that must be refused")

    monkeypatch.setattr(evaluate, "reference_sampler", sampled)
    out = eval_refusing(tmp_path, agent_model, "task=swebench_pro", f"task.tasks_dir={tasks}", "task.subset=all")
    refused(out, "task.max_total_tokens=32768 exceeds the model's context of 512 tokens; lower it to at most 512")
    nothing_left(tmp_path)


def test_a_first_prompt_longer_than_max_total_tokens_is_refused_before_sampling(tmp_path, tasks, agent_model,
                                                                               monkeypatch):
    monkeypatch.setattr(evaluate, "reference_sampler", lambda *a, **k: pytest.fail("sampled"))
    (tasks / "calc2" / "instruction.md").write_text("Fix calc.py. " * 200)
    out = eval_refusing(tmp_path, agent_model, "task=swebench_pro", f"task.tasks_dir={tasks}", "task.subset=all",
                        "task.max_total_tokens=480")
    line = refused(out, "task.max_total_tokens=480 leaves no room for one turn: the first prompt of calc2 alone has")
    assert int(re.search(r"has (\d+) tokens", line).group(1)) > 480
    nothing_left(tmp_path)


def test_minicode_agent_eval_refuses_a_budget_past_the_models_context(tmp_path, agent_model, monkeypatch):
    monkeypatch.setattr(evaluate, "reference_sampler", lambda *a, **k: pytest.fail("sampled"))
    (tmp_path / "cwd").mkdir()
    out = eval_refusing(tmp_path, agent_model, "task=minicode_agent", "task.levels=[1]", "task.max_total_tokens=4096")
    refused(out, "task.max_total_tokens=4096 exceeds the model's context of 512 tokens")
    nothing_left(tmp_path)


def test_made_for_takes_back_only_what_it_made_and_what_holds_nothing_else(tmp_path):
    class Run:
        finished = False

        def finish(self):
            self.finished = True

    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(ConfigError), evaluate.made_for(out) as made:
        out.mkdir(parents=True)
        (out / "wandb" / "offline-run-1").mkdir(parents=True)
        made.wandb_run = run = Run()
        raise ConfigError("refused")
    assert run.finished and not (tmp_path / "a").exists()
    out.mkdir(parents=True)  # there before: it stays, and so does what the body put there
    with pytest.raises(ConfigError), evaluate.made_for(out):
        (out / "wandb").mkdir()
        raise ConfigError("refused")
    assert (out / "wandb").is_dir()
    other = tmp_path / "other"
    with pytest.raises(ConfigError), evaluate.made_for(other):  # holding something else: it stays
        other.mkdir()
        (other / "episodes").mkdir()
        raise ConfigError("refused")
    assert (other / "episodes").is_dir()


def test_the_docker_engine_refusal_names_a_readme_section_that_exists(monkeypatch):
    from rlmix.agentic.docker import DockerRuntime

    no_docker(monkeypatch)
    line = DockerRuntime(image_prefix="rlmix").unavailable()
    section = re.search(r'\(README, "([^"]+)"\)', line).group(1)
    headings = [h.lstrip("#").strip() for h in (ROOT / "README.md").read_text().splitlines() if h.startswith("## ")]
    assert section in headings, (section, headings)
