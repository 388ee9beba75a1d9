"""``rlmix probe``'s input refused or honoured before any model loads: ``probe.samples_per_prompt``,
``probe.out_dir`` and ``task.split`` (read as ``rlmix eval`` reads it)."""

from __future__ import annotations

import pytest

from rlmix.commands.probe import run_probe
from rlmix.errors import ConfigError
from tests.cli import rlmix_refusing


@pytest.fixture
def no_model(monkeypatch):
    """The probe must be refused before it looks for its model (and so before any sampler starts)."""
    def went_on(*args, **kwargs):
        raise AssertionError("the probe went on to load its model")

    monkeypatch.setattr("rlmix.eval.probe.resolve_model_dir", went_on)


@pytest.fixture
def probed(monkeypatch):
    """``probe_fleet`` replaced by a recorder of the split it is asked for (no pool, nothing sampled)."""
    asked = []

    def fake_probe_fleet(plan, progress=print, split="test"):
        asked.append(split)
        return [], {"reference": {"label": "ref"}}

    monkeypatch.setattr("rlmix.commands.probe.probe_fleet", fake_probe_fleet)
    return asked


def refused(override: str, tmp_path) -> str:
    with pytest.raises(ConfigError) as err:
        run_probe(["fleet=smoke", override, f"probe.out_dir={tmp_path / 'probe'}"])
    assert "\n" not in str(err.value) and not (tmp_path / "probe").exists()
    return str(err.value)


@pytest.mark.parametrize("n", [0, -1])
def test_samples_per_prompt_below_one_is_refused_in_one_line(n, tmp_path, no_model):
    assert refused(f"probe.samples_per_prompt={n}", tmp_path).startswith(f"probe.samples_per_prompt={n}: ")
    out = rlmix_refusing("probe", "fleet=smoke", f"probe.samples_per_prompt={n}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: probe.samples_per_prompt=")
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_out_dir_that_cannot_be_created_is_refused_before_probing(tmp_path, probed):
    (tmp_path / "file").write_text("not a directory")
    out = rlmix_refusing("probe", "fleet=smoke", f"probe.out_dir={tmp_path / 'file' / 'probe'}", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"error: probe.out_dir={tmp_path / 'file' / 'probe'}: ") and "is a file" in out.stderr
    assert probed == []  # nothing was sampled to be lost


@pytest.mark.parametrize("given,split", [([], "test"), (["task.split=test"], "test"),
                                         (["task.split=hard51"], "hard51")])
def test_the_probe_samples_the_minicode_split_given(given, split, tmp_path, probed):
    run_probe(["fleet=smoke", *given, f"probe.out_dir={tmp_path}"])
    assert probed == [split]


def test_a_dataset_split_is_honoured(tmp_path, probed):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1", "answer": "2"}\n')
    task = ["task=dataset", f"task.train_files={rows}", f"task.eval_files={rows}", "task.prompt_key=question",
            "task.reward=exact"]
    run_probe(["fleet=smoke", *task, f"probe.out_dir={tmp_path}"])
    run_probe(["fleet=smoke", *task, "task.split=train", f"probe.out_dir={tmp_path}"])
    assert probed == ["test", "train"]


@pytest.mark.parametrize("split", ["nope", "train"])  # minicode's train is its stream: refused when given, as in eval
def test_a_split_the_task_lacks_is_refused_in_one_line(split, tmp_path, no_model):
    assert refused(f"task.split={split}", tmp_path).startswith(f"task.split={split!r} is not a minicode split")


def test_the_prompts_come_from_the_split(tmp_path):
    from rlmix.commands.compose import compose_plan
    from rlmix.eval.probe import probe_prompts

    plan = compose_plan(["fleet=smoke"], for_training=False)
    hard = probe_prompts(plan.task, 0, 3, "hard51")
    assert [p.task_id for p in hard] == [p.task_id for p in plan.task.make(0).split("hard51")[::17]]
    with pytest.raises(ConfigError, match=r"^probe.prompts=52: .* hard51 split, which has 51"):
        probe_prompts(plan.task, 0, 52, "hard51")


@pytest.mark.parametrize("setting", ["hydra.run.dir=elsewhere", "hydra.job.chdir=true", "++hydra.run.dir=x"])
def test_hydra_settings_the_probe_would_ignore_are_refused_pointing_to_probe_out_dir(setting, tmp_path, no_model):
    """The probe composes its config without running a Hydra app: ``hydra.run.dir`` was taken and
    ignored (probe.json went to outputs/probe/<time>). Refused in one line naming ``probe.out_dir``."""
    out = rlmix_refusing("probe", "fleet=smoke", setting, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"error: {setting}: rlmix probe does not run as a Hydra app")
    assert "probe.out_dir=<dir>" in out.stderr and not list(tmp_path.iterdir())


def test_hydra_searchpath_is_honoured_by_the_probe(tmp_path, probed):
    """Where configs are found is no setting the probe ignores: an option of the user's folder is found."""
    conf = tmp_path / "conf" / "task"
    conf.mkdir(parents=True)
    (conf / "mymini.yaml").write_text("defaults:\n  - minicode\n  - _self_\n")
    run_probe(["fleet=smoke", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "task=mymini",
               f"probe.out_dir={tmp_path / 'probe'}"])
    assert probed == ["test"]


def test_a_dataset_without_eval_files_is_refused_offering_the_training_rows(tmp_path, no_model):
    """As ``rlmix eval`` refuses it (docs/tasks.md): ``task.split=train`` is the way out."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1", "answer": "2"}\n')
    task = ["task=dataset", f"task.train_files={rows}", "task.prompt_key=question", "task.reward=exact"]
    out = rlmix_refusing("probe", "fleet=smoke", *task, f"probe.out_dir={tmp_path / 'probe'}", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: task.split=test: set task.eval_files ")
    assert out.stderr.strip().endswith("; or task.split=train to use task.train_files")
    assert not (tmp_path / "probe").exists()
