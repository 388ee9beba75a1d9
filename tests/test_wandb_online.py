"""``logger.wandb.mode=online``: refused before anything starts where wandb finds no API key; with a
key but no W&B server to reach, a bounded wait, then the run logs offline and names the ``wandb sync``
command, with W&B's own traceback in train.log only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlmix.config.schema import WandbConfig, WandbMode
from rlmix.errors import ConfigError
from tests.cli import rlmix_refusing

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # the form of a key, known to no server
ONLINE = WandbConfig(mode=WandbMode.online)


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    """No key where wandb looks for one (the environment, a netrc file, its settings files), and a
    W&B process state that reads them afresh."""
    import wandb

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_INIT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.ai")
    wandb.teardown()
    yield tmp_path / "no_netrc"
    wandb.teardown()


def refused(out, *words: str) -> str:
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert "Traceback" not in out.stdout + out.stderr
    return lines[0]


def test_online_without_an_api_key_is_refused_before_anything_starts(tmp_path, no_wandb_login):
    cwd = tmp_path / "here"
    cwd.mkdir()
    out = rlmix_refusing("train", "+experiment=smoke", "logger.wandb.mode=online", cwd=cwd)
    refused(out, "logger.wandb.mode=online", "no W&B API key", "wandb login", "logger.wandb.mode=offline")
    assert list(cwd.iterdir()) == []  # no run directory, nothing started


def test_an_api_key_that_cannot_be_one_is_refused(tmp_path, no_wandb_login, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    cwd = tmp_path / "here"
    cwd.mkdir()
    out = rlmix_refusing("train", "+experiment=smoke", "logger.wandb.mode=online", cwd=cwd)
    refused(out, "logger.wandb.mode=online", "WANDB_API_KEY", "logger.wandb.mode=offline")
    assert list(cwd.iterdir()) == []


def test_a_key_in_the_environment_or_the_netrc_file_lets_online_start(no_wandb_login, monkeypatch):
    import wandb

    from rlmix.metrics.logger import check_wandb_login

    with pytest.raises(ConfigError, match="no W&B API key"):
        check_wandb_login(ONLINE)
    check_wandb_login(WandbConfig(mode=WandbMode.offline))  # offline and disabled need no key
    no_wandb_login.write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_KEY}\n")
    no_wandb_login.chmod(0o600)
    wandb.teardown()
    check_wandb_login(ONLINE)  # `wandb login` wrote it there
    no_wandb_login.unlink()
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    wandb.teardown()
    check_wandb_login(ONLINE)


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf"])
def test_a_wait_that_is_not_a_number_of_seconds_is_refused(no_wandb_login, monkeypatch, value):
    from rlmix.metrics.logger import check_wandb_login, init_timeout

    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", value)
    with pytest.raises(ConfigError, match="WANDB_INIT_TIMEOUT"):
        check_wandb_login(ONLINE)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2.5")
    assert init_timeout() == 2.5
    monkeypatch.delenv("WANDB_INIT_TIMEOUT")
    assert 0 < init_timeout() < 90  # shorter than wandb's own 90 s


@pytest.mark.slow
def test_online_with_no_server_to_reach_waits_briefly_then_logs_offline_for_wandb_sync(tmp_path):
    """A real run with a key but no W&B server (a local port nothing listens on, so no key ever leaves
    this machine): one line says it waits, one that it logs offline and how to upload; the run
    trains to its end, and W&B's traceback is in train.log, not on the console."""
    env = dict(os.environ, WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL="http://127.0.0.1:9", WANDB_INIT_TIMEOUT="3",
               NETRC=str(tmp_path / "no_netrc"), WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"))
    rlmix = str(Path(sys.executable).with_name("rlmix"))
    out = subprocess.run([rlmix, "train", "+experiment=smoke", "loop.steps=1", "logger.wandb.mode=online",
                          "hydra.run.dir=run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-3000:]
    assert "waiting for W&B to start the run online (up to 3 s, WANDB_INIT_TIMEOUT)" in console, console[-3000:]
    [fallback] = [ln for ln in console.splitlines() if ln.startswith("W&B did not start online")]
    assert "logging offline instead, upload later with: wandb sync run/wandb/offline-run-" in fallback, fallback
    [offline] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    assert fallback.endswith(f"wandb sync run/wandb/{offline.name}")
    assert list(offline.glob("run-*.wandb"))  # the metrics wait there for `wandb sync`
    assert "Traceback" not in console and "error in wandb.init()" not in console, console[-3000:]
    assert "error in wandb.init()" in (tmp_path / "run" / "train.log").read_text()
    assert "steps       1/1" in out.stdout


def test_eval_online_without_an_api_key_is_refused_before_it_evaluates(tmp_path, no_wandb_login, monkeypatch):
    """As ``rlmix train`` refuses it: found only after the scores, it fell back to an offline W&B run."""
    import rlmix.commands.eval as eval_command

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc of this machine's user either
    evaluated = []
    monkeypatch.setattr(eval_command, "evaluate", lambda plan, progress, scoring: evaluated.append(plan))
    cwd = tmp_path / "here"
    cwd.mkdir()
    out = rlmix_refusing("eval", "logger.wandb.mode=online", cwd=cwd)
    line = refused(out, "logger.wandb.mode=online", "no W&B API key", "wandb login", "logger.wandb.mode=offline")
    assert evaluated == [] and list(cwd.iterdir()) == []
    train = rlmix_refusing("train", "+experiment=smoke", "logger.wandb.mode=online", cwd=cwd)
    assert refused(train) == line  # the same one line
    assert rlmix_refusing("eval", "logger.wandb.mode=offline", cwd=cwd).returncode == 0 and len(evaluated) == 1
