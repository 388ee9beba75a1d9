"""Override errors in the user's terms: a typo'd key gets its closest match and the keys its section takes,
and an override Hydra's grammar cannot read gets the quoted form to give instead."""

from __future__ import annotations

import shlex

import pytest

from rlmix.commands.compose import compose_run_config
from rlmix.errors import ConfigError
from tests.cli import rlmix_refusing


@pytest.mark.parametrize(
    ("overrides", "expected", "listed"),
    [
        (["loop.stpes=3"], "loop.stpes: no such key in loop; did you mean loop.steps? (loop takes: steps, ",
         ("steps", "lag", "max_staleness")),
        (["trainer.lrr=1e-3"], "trainer.lrr: no such key in trainer; did you mean trainer.lr? (trainer takes: ",
         ("lr", "backend")),
        (["logger.wandb.mdoe=offline"], "logger.wandb.mdoe: no such key in logger.wandb; did you mean "
         "logger.wandb.mode? (logger.wandb takes: mode, project, entity, group)", ("mode",)),
        (["sed=1"], "sed: no such key in the config; did you mean seed? (the config takes: name, seed, ",
         ("seed", "loop", "trainer")),
        (["task=dataset", "task.fromat_regex=x"], "task.fromat_regex: no such key in task; did you mean "
         "task.format_regex?", ("format_regex", "train_files")),
    ],
)
def test_a_typod_key_names_the_closest_key_and_what_its_section_takes(overrides, expected, listed):
    with pytest.raises(ConfigError) as err:
        compose_run_config(overrides)
    line = str(err.value)
    assert line.startswith(expected) and "\n" not in line, line
    takes = line.split("takes: ", 1)[1].rstrip(")").split(", ")
    assert set(listed) <= set(takes) and "hydra" not in takes, line


def test_a_key_like_no_other_lists_the_section_without_a_guess():
    with pytest.raises(ConfigError, match=r"^loop.xyzzy: no such key in loop \(loop takes: steps, .*\)$"):
        compose_run_config(["loop.xyzzy=1"])


@pytest.mark.parametrize("command", ["train", "eval", "probe"])
def test_every_command_says_so_in_one_line_exit_2(tmp_path, command):
    out = rlmix_refusing(command, "loop.stpes=3", cwd=tmp_path)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: loop.stpes: no such key in loop; did you mean loop.steps?"), line


UNREADABLE = [
    ("task.format_regex=<p>(.*?)</p>", "'<' unquoted", """'task.format_regex="<p>(.*?)</p>"'"""),
    ("a=[1,2", "no viable alternative at input '[1,2'", """'a="[1,2"'"""),
    ("a=${", "extraneous input '{' expecting <EOF>", """'a="${"'"""),
    ("x=(", "extraneous input '('", """'x="("'"""),
]


@pytest.mark.parametrize(("override", "what", "quoted"), UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_an_override_hydra_cannot_read_says_how_to_quote_its_value(tmp_path, override, what, quoted):
    extra = ["task=dataset"] if override.startswith("task.") else []
    out = rlmix_refusing("train", *extra, override, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    what = what if what.endswith("unquoted") else f"it ({what})"
    assert line == (f"error: {override}: Hydra's override grammar cannot read {what}; "
                    f"quote the value inside the shell's quotes, as docs/tasks.md shows: {quoted}"), line
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_override_in_a_sweep_is_the_same_line(tmp_path):
    out = rlmix_refusing("train", "-m", "seed=0,1", "task.format_regex=<p>(.*?)</p>", cwd=tmp_path)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: task.format_regex=<p>(.*?)</p>: ") and "'task.format_regex=\"<p>(.*?)</p>\"'" in line


@pytest.mark.parametrize("value", ['"x', "ab\\", 'a\\"b', "x\\d+(\\.\\d+)?", "it's(", "<p>(.*?)</p>"])
def test_the_quoted_form_it_gives_reads_back_as_the_value(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlmix.config.load import unreadable_override

    line = unreadable_override(f"k={value}", "Error parsing override 'k'\nextraneous input")
    [given] = shlex.split(line.rsplit("docs/tasks.md shows: ", 1)[1])
    assert OverridesParser.create().parse_override(given).value() == value


@pytest.mark.parametrize(("override", "expected"), [
    ("+loop.stpes=3", "loop.stpes: no such key in loop; did you mean loop.steps?"),
    ("+bogus=3", "bogus: no such key in the config"),
    ("+task.foo=1", "task.foo: no such key in task"),
])
def test_a_key_added_with_plus_that_no_schema_has_is_refused_not_dropped(override, expected):
    """Hydra composes ``+loop.stpes=3`` without a word; turned into the typed config the key was dropped,
    and the run trained with loop.steps as it was."""
    with pytest.raises(ConfigError) as err:
        compose_run_config([override])
    assert str(err.value).startswith(expected), err.value


def test_cfg_job_refuses_an_added_key_as_a_run_does():
    """``--cfg job`` printed a config with ``+loop.stpes=3`` in it, which no run would take."""
    from rlmix.commands.compose import plan_jobs

    with pytest.raises(ConfigError, match=r"^loop.stpes: no such key in loop; did you mean loop.steps\?"):
        plan_jobs(["--cfg", "job", "+loop.stpes=3"])
    assert plan_jobs(["--cfg", "job", "++loop.steps=2"]) == []  # composes, and Hydra prints it


@pytest.mark.parametrize("override", ["++loop.steps=2", "+fleet.pools.l4_int8={accelerator:L4,precision:int8,count:1}",
                                      "+experiment=sc_mis"])
def test_plus_overrides_of_keys_the_schema_has_still_compose(override):
    compose_run_config([override])
