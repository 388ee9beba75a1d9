"""The scripts refuse a count or path they cannot use as argparse's usage error, before any work: `--steps 0`
ran a reproduce profile's 300 steps, `bench_loop.py --steps 2` ran a minute and then failed on no steps,
`--repeats 0` ended in a traceback at the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
pytestmark = pytest.mark.slow  # a process per script


@pytest.mark.parametrize(("args", "message"), [
    (["bench_loop.py", "--steps", "2"], "argument --steps: 2: must be at least 3"),
    (["bench_transport.py", "--repeats", "0"], "argument --repeats: 0: must be at least 1"),
    (["bench_reward.py", "-n", "x"], "argument -n: 'x' is not a whole number"),
    (["bench_weight_load.py", "--model-dir", "/nonexistent"], "argument --model-dir: /nonexistent: no such directory"),
    (["reproduce.py", "--steps", "0"], "--steps 0: must be at least 1"),
    (["reproduce.py", "--seeds", "-1"], "--seeds -1: must be at least 1"),
    (["calibrate_monitor.py", "--add", "bogus", "/tmp"], "--add bogus: the label is one of healthy, collapse"),
    (["calibrate_monitor.py", "--run", "0"], "--run 0: give a number of runs, at least 1"),
    (["lock.py", "check", "/nonexistent.lock"], "/nonexistent.lock: no such file"),
    (["bench_agentic.py", "--repeats", "0"], "argument --repeats: 0: must be at least 1"),
    (["bench_peer.py", "--steps", "0"], "argument --steps: 0: must be at least 1"),
    (["bench_peer.py", "--peer-python", "/nonexistent/python"], "--peer-python /nonexistent/python: no TRL environment"),
    (["bench_scaling.py", "--lengths", "24,0"], "argument --lengths: 0: must be at least 1"),
    (["bench_backends.py", "--model", "/nonexistent"], "argument --model: /nonexistent: no such directory"),
])
def test_a_count_or_path_a_script_cannot_use_is_one_usage_error(args, message, tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS / args[0]), *args[1:]], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []
