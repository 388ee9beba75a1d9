"""Task loading, validation and subset selection."""

from __future__ import annotations

import dataclasses
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
    assert a.test_globs == ("test_calc.py", "test_calc.py/*") and a.docker_image is None
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


@pytest.mark.parametrize("old,new,expected", [
    ("timeout_sec = 30.0", "timeout_sec = -5", "[verifier] timeout_sec=-5: must be a number > 0"),
    ("timeout_sec = 60.0", "timeout_sec = 0", "[agent] timeout_sec=0: must be a number > 0"),
    ("timeout_sec = 60.0", "timeout_sec = nan", "[agent] timeout_sec=nan: must be a number > 0"),
    ("timeout_sec = 30.0", 'timeout_sec = "soon"', "[verifier] timeout_sec='soon': must be a number > 0"),
    ("build_timeout_sec = 600.0", "build_timeout_sec = true",
     "[environment] build_timeout_sec=True: must be a number > 0"),
    ("cpus = 1", "cpus = -1", "[environment] cpus=-1: must be a number > 0"),
    ("memory_mb = 1024", "memory_mb = 0", "[environment] memory_mb=0: must be a whole number of MB >= 1"),
    ("memory_mb = 1024", "memory_mb = 1.5", "[environment] memory_mb=1.5: must be a whole number of MB >= 1"),
    ("memory_mb = 1024", 'memory = "0G"', "[environment] memory='0G': must be like '4G' or '512M' (at least 1M)"),
    ("timeout_sec = 30.0", "timeout_sec = 30.0\nenv = 3", "[verifier] env=3: must be a table of variables"),
    ("[agent]\ntimeout_sec = 60.0", "agents = 1", None),  # not a problem: unknown keys are ignored
    ('version = "1.0"', 'version = "1.0"\nagent = 5', "[agent] must be a table, not int 5"),
])
def test_out_of_range_task_toml_values_are_refused_naming_key_and_range(tmp_path, old, new, expected):
    toml = TASK_TOML.replace("[agent]\ntimeout_sec = 60.0", "") if "agent = 5" in new else TASK_TOML
    make_task(tmp_path, "t", toml=toml.replace(old, new, 1))
    if expected is None:
        assert load_tasks(tmp_path)["t"].agent_timeout_s == 3600.0
        return
    with pytest.raises(ConfigError) as e:
        load_tasks(tmp_path)
    assert str(e.value).splitlines()[1:] == [f"  t: bad task.toml: {expected}"]


def test_a_task_gets_one_line_naming_all_its_problems_and_the_file_read(tmp_path):
    toml = TASK_TOML.replace("cpus = 1", "cpus = 0").replace("memory_mb = 1024", "memory_mb = -1")
    d = make_task(tmp_path, "t", toml=toml)
    (d / "tests" / "test.sh").unlink()
    (d / "instruction.md").write_bytes(b"fix \xff it\n")
    (d / "checksums.sha256").write_bytes(b"\xfe\n")
    with pytest.raises(ConfigError) as e:
        load_tasks(tmp_path)
    lines = str(e.value).splitlines()
    assert lines[1:] == ["  t: missing tests/test.sh; instruction.md is not UTF-8 text (byte 0xff at offset 4); "
                         "bad task.toml: [environment] cpus=0: must be a number > 0; "
                         "bad task.toml: [environment] memory_mb=-1: must be a whole number of MB >= 1",
                         "  t: checksums.sha256 is not UTF-8 text (byte 0xfe at offset 0)"]
    (d / "task.toml").write_bytes(b"\xc3(")
    with pytest.raises(ConfigError, match=r"t: missing tests/test.sh; task.toml is not UTF-8 text \(byte 0xc3"):
        load_tasks(tmp_path)


def test_more_than_a_few_problems_of_a_task_are_counted(tmp_path):
    toml = 'metadata = 1\nagent = 2\nverifier = 3\n[environment]\ncpus = 0\nmemory_mb = 0\n'
    (make_task(tmp_path, "t", toml=toml) / "tests" / "test.sh").unlink()
    (tmp_path / "t" / "instruction.md").write_bytes(b"\xff")
    with pytest.raises(ConfigError) as e:
        load_tasks(tmp_path)
    line = str(e.value).splitlines()[1]
    assert line.startswith("  t: missing tests/test.sh; instruction.md is not UTF-8") and line.endswith(
        "; bad task.toml: [environment] cpus=0: must be a number > 0; and 1 more")


def test_tasks_dir_pointing_at_one_task_says_so(tmp_path):
    d = make_task(tmp_path, "t")
    with pytest.raises(ConfigError) as e:
        load_tasks(d)
    assert str(e.value) == (f"task.tasks_dir={d} points at one task (it holds task.toml): "
                            f"give its parent directory, the one holding the task directories")


def test_duplicate_instance_ids_are_reported_naming_both_directories(tmp_path):
    toml = TASK_TOML.replace('difficulty = "hard"', 'instance_id = "org__calc-1"')
    make_task(tmp_path, "a", toml=toml)
    make_task(tmp_path, "b", toml=toml)
    make_task(tmp_path, "c")
    with pytest.raises(ConfigError) as e:
        load_tasks(tmp_path)
    lines = str(e.value).splitlines()
    assert lines[1:] == ["  [metadata] instance_id 'org__calc-1' is shared by task directories a, b"]


def test_select_subset_refuses_ambiguous_and_repeated_ids(tmp_path):
    toml = TASK_TOML.replace('difficulty = "hard"', 'instance_id = "org__calc-1"')
    make_task(tmp_path, "a", toml=toml)
    make_task(tmp_path, "b")
    tasks = load_tasks(tmp_path)
    with pytest.raises(ConfigError, match="names task a twice: 'a', 'org__calc-1'"):
        select_subset(tasks, ["a", "org__calc-1"], None, "s.txt")
    twin = {"a": tasks["a"], "b": dataclasses.replace(tasks["b"], instance_id="org__calc-1")}
    with pytest.raises(ConfigError, match="'org__calc-1' in task.subset_file=s.txt matches task directories a, b"):
        select_subset(twin, ["org__calc-1"], None, "s.txt")
    with pytest.raises(ConfigError, match="task.subset_file=s.txt: lists no ids"):
        select_subset(tasks, [], None, "s.txt")


@pytest.mark.parametrize("content,expected", [
    (b'["a", ', "is not valid JSON (Expecting value: line 1 column 7 (char 6)): give a JSON list of strings"),
    (b"a\n\xff\n", "is not UTF-8 text (byte 0xff at offset 2): give one instance id per line"),
    (b"# none yet\n\n", ": lists no ids (give one instance id per line, or set task.subset=all)"),
    (b"[]", ": lists no ids"),
    (b'["a", 1]', ": the JSON must be a list of strings (instance ids)"),
])
def test_a_bad_subset_file_is_one_line(tmp_path, content, expected):
    f = tmp_path / "s.txt"
    f.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        read_subset_file(f)
    assert str(e.value).startswith(f"task.subset_file={f}") and expected in str(e.value)
    assert len(str(e.value).splitlines()) == 1


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


def test_subset_all_with_a_subset_file_is_refused_not_ignored(tmp_path):
    make_task(tmp_path / "tasks", "a")
    (tmp_path / "s.txt").write_text("a\n")
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), subset="all", subset_file=str(tmp_path / "s.txt"))
    with pytest.raises(ConfigError, match=r"^task.subset=all takes every task, and task.subset_file=.*drop one"):
        resolve_tasks(cfg)


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
