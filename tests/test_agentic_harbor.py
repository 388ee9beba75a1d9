"""Task loading, validation and subset selection."""

from __future__ import annotations

import hashlib

import pytest

from rlmix.config.swebench import SwebenchProConfig
from rlmix.agentic.harbor import DEFAULT_WORKDIR, load_tasks, read_subset_file, select_subset
from rlmix.agentic.run import check_ks, resolve_tasks
from rlmix.errors import ConfigError
from tests.test_agentic_fixtures import TASK_TOML, make_task


def test_load_reads_task_toml_and_workdir(tmp_path):
    make_task(tmp_path, "a")
    toml = TASK_TOML.replace("memory_mb = 1024", 'memory = "2G"') + '\ndocker_image = "org/img:1"\n'
    d = make_task(tmp_path, "b", toml=toml)
    (d / "environment" / "Dockerfile").write_text("FROM x\nRUN true\n")
    tasks = load_tasks(tmp_path)
    assert list(tasks) == ["a", "b"]
    a, b = tasks["a"], tasks["b"]
    assert (a.workdir, a.verifier_timeout_s, a.agent_timeout_s, a.memory_mb, a.cpus) == ("/work/repo", 30.0, 60.0, 1024, 1.0)
    assert a.test_globs == ("test_calc.py",) and a.docker_image is None
    assert (b.workdir, b.memory_mb, b.docker_image) == (DEFAULT_WORKDIR, 2048, "org/img:1")


def test_every_problem_gets_its_own_line(tmp_path):
    make_task(tmp_path, "ok")
    (make_task(tmp_path, "no_tests") / "tests" / "test.sh").unlink()
    (make_task(tmp_path, "bad_toml") / "task.toml").write_text("[agent\ntimeout_sec = 1")
    d = make_task(tmp_path, "bad_sum")
    good = hashlib.sha256((d / "tests" / "test.sh").read_bytes()).hexdigest()
    (d / "checksums.sha256").write_text(f"{good}  tests/test.sh\n{'0' * 64}  instruction.md\n")
    with pytest.raises(ConfigError) as e:
        load_tasks(tmp_path)
    lines = str(e.value).splitlines()
    assert lines[0].startswith("3 problem(s)")
    assert any("no_tests: missing tests/test.sh" in x for x in lines)
    assert any("bad_toml: bad task.toml" in x for x in lines)
    assert any("bad_sum: checksum mismatch for instruction.md" in x for x in lines)
    assert len(lines) == 4


def test_subset_file_and_selection(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    tasks = load_tasks(tmp_path / "tasks")
    f = tmp_path / "subset.txt"
    f.write_text("# hard ones\na\n\nc  # comment\n")
    assert select_subset(tasks, read_subset_file(f), 2, str(f)) == ["a", "c"]
    with pytest.raises(ConfigError, match="lists 2 ids, task.expected_subset_size=51"):
        select_subset(tasks, read_subset_file(f), 51, str(f))
    f.write_text("a\nzzz\n")
    with pytest.raises(ConfigError, match="unknown instance id 'zzz'"):
        select_subset(tasks, read_subset_file(f), 2, str(f))
    f.write_text("a\na\n")
    with pytest.raises(ConfigError, match="more than once"):
        read_subset_file(f)


def test_resolve_tasks_and_ks(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    (tmp_path / "s.txt").write_text("b\n")
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), subset="mini", subset_file=str(tmp_path / "s.txt"),
                            expected_subset_size=1)
    tasks, ids = resolve_tasks(cfg)
    assert [t.task_id for t in tasks] == ["b"] and ids == ["b"]
    cfg.eval_all_tasks = True
    assert [t.task_id for t in resolve_tasks(cfg)[0]] == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="task.tasks_dir is not set"):
        resolve_tasks(SwebenchProConfig())
    with pytest.raises(ConfigError, match="needs task.subset_file"):
        resolve_tasks(SwebenchProConfig(tasks_dir=str(tmp_path / "tasks")))
    with pytest.raises(ConfigError, match="eval.k"):
        check_ks([1, 8], 4)


def test_config_schema_composes_in_omegaconf():
    """The CLI registers SwebenchProConfig as task=swebench_pro: it must be a valid structured config."""
    from omegaconf import OmegaConf

    base = OmegaConf.structured(SwebenchProConfig)
    assert OmegaConf.is_missing(base, "tasks_dir")
    merged = OmegaConf.merge(base, OmegaConf.create({"tasks_dir": "/t", "runtime": "docker", "subset_file": "s.txt",
                                                     "expected_subset_size": None}))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, SwebenchProConfig) and cfg.runtime.name == "docker" and cfg.expected_subset_size is None
    with pytest.raises(Exception, match="runtime"):
        OmegaConf.merge(base, OmegaConf.create({"runtime": "kubernetes"}))
    with pytest.raises(Exception, match="max_turn"):
        OmegaConf.merge(base, OmegaConf.create({"max_turn": 3}))


def test_every_config_field_is_read():
    """A knob that nothing reads is a bug: every field except the group name is used by the harness."""
    import dataclasses
    from pathlib import Path

    import rlmix.agentic

    source = "".join(p.read_text() for p in Path(rlmix.agentic.__file__).parent.glob("*.py") if p.name != "config.py")
    unread = [f.name for f in dataclasses.fields(SwebenchProConfig) if f.name != "name" and f"cfg.{f.name}" not in source]
    assert unread == []
