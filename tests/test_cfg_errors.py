"""Hydra's flags that print the composed config (``--cfg``, ``--info``) refuse overrides it cannot compose as a
run does: one line naming the group and its options, exit status 2, not Hydra's error with its search path."""

from __future__ import annotations

import pytest

from tests.cli import rlmix_in_process, rlmix_refusing
from tests.test_validation_cli import refused


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--cfg", "job", "fleet=bogus"], "fleet=bogus: no such option; available: "),
        (["-c", "job", "fleet=bogus"], "fleet=bogus: no such option; available: "),
        (["fleet=bogus", "--cfg=job"], "fleet=bogus: no such option; available: "),
        (["--cfg", "hydra", "hydra/launcher=bogus"], "hydra/launcher=bogus: no such option; available: basic"),
        (["--info", "defaults", "fleet=bogus"], "fleet=bogus: no such option; available: "),
        (["fleet=bogus", "-i"], "fleet=bogus: no such option; available: "),
        (["--help", "fleet=bogus"], "fleet=bogus: no such option; available: "),
    ],
)
def test_printing_the_config_of_a_bad_override_is_one_line_exit_2(tmp_path, args, key):
    out = rlmix_refusing("train", *args, cwd=tmp_path)
    refused(out, key)
    assert "emulated_hetero6" in out.stderr or "joblib" in out.stderr or "sc_mis" in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["-m", "--cfg", "job", "seed=0,1"], ["--multirun", "--info", "config", "seed=0,1"]])
def test_a_sweep_has_no_one_config_to_print(tmp_path, args):
    """Hydra takes one of --multirun, --cfg and --info, and said so with a ValueError's traceback."""
    out = rlmix_refusing("train", *args, cwd=tmp_path)
    refused(out, "prints one config, -m runs a sweep: Hydra takes one of them; leave out -m")
    assert list(tmp_path.iterdir()) == []


def test_help_shows_one_config_not_a_sweeps(tmp_path):
    out = rlmix_refusing("train", "-m", "--help", "seed=0,1", cwd=tmp_path)
    refused(out, "--help shows one config: give each key one value")


def test_a_good_cfg_job_still_prints_the_composed_config(tmp_path):
    out = rlmix_in_process("train", "--cfg", "job", "+experiment=smoke", "seed=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "name: smoke" in out.stdout and "seed: 3" in out.stdout and "hydra:" not in out.stdout
    assert out.stderr == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override", ["correction=correction_schema", "fleet=fleet_schema", "+task=dataset_schema"])
def test_a_groups_schema_is_not_an_option(override):
    """The schema each group's options extend sits among them in Hydra's group; chosen, it composed to
    the schema's defaults without a word."""
    from rlmix.commands.compose import plan_jobs
    from rlmix.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{override.lstrip('+')}: that is the .* group's schema"):
        plan_jobs([override, "loop.steps=1"])


def test_train_help_lists_no_schema_among_a_groups_options():
    from rlmix.commands.train import without_schemas

    text = ("== Configuration groups ==\nCompose your configuration from those groups (group=option)\n\n"
            "correction: correction_schema, mis, sc_mis\ntask: dataset, dataset_schema\n\n\n== Config ==\n"
            "name: default\nnote: a_schema, b\n")
    assert without_schemas(text) == text.replace("correction_schema, ", "").replace(", dataset_schema", "")
