"""The action format, observation truncation and reward reading."""

from __future__ import annotations

import pytest

from rlmix.agentic.actions import Command, FormatError, Submit, parse_action, truncate_middle
from rlmix.agentic.grading import read_reward
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime
from tests.test_agentic_fixtures import TRUSTED, make_task


@pytest.mark.parametrize("text, expected", [
    ("Let me look.\n<bash>ls -la\n</bash>\nthen decide", Command("ls -la")),
    ("<bash>cat <<'EOF' > a.py\nx = 1 < 2\nEOF</bash>", Command("cat <<'EOF' > a.py\nx = 1 < 2\nEOF")),
    ("Done. <submit/>", Submit()),
    ("<submit>", Submit()),
    ("<submit />", Submit()),
])
def test_well_formed_actions(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize("text, reason", [
    ("I think the bug is in calc.py", "no action found"),
    ("```bash\nls\n```", "no action found"),
    ("<bash>ls</bash> <bash>pwd</bash>", "2 <bash> blocks"),
    ("<bash>ls</bash><submit/>", "not both"),
    ("<bash>  \n</bash>", "empty"),
    ("<bash>ls", "no action found"),
    ("<bash>echo a\0b</bash>", "NUL byte"),  # a byte-level token can be one; it used to fail the whole request
])
def test_malformed_actions(text, reason):
    action = parse_action(text)
    assert isinstance(action, FormatError) and reason in action.reason


def test_truncate_keeps_head_and_tail():
    text = "A" * 50 + "B" * 100 + "C" * 50
    out = truncate_middle(text, 100)
    assert out.startswith("A" * 50) and out.endswith("C" * 50) and "[... 100 characters omitted ...]" in out
    assert truncate_middle("short", 100) == "short"


def test_reward_file_then_json_then_exit_code(tmp_path):
    make_task(tmp_path / "tasks", "calc")
    sb = LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED).start(load_tasks(tmp_path / "tasks")["calc"], network=False)
    try:
        v = f"{sb.logs_dir}/verifier"
        assert read_reward(sb, exit_code=0) == 1.0 and read_reward(sb, exit_code=1) == 0.0
        sb.put_file(f"{v}/reward.json", b'{"reward": 0.5}')
        assert read_reward(sb, exit_code=0) == 0.5
        sb.put_file(f"{v}/reward.txt", b"1\n")
        assert read_reward(sb, exit_code=1) == 1.0  # the file wins over the exit code
        sb.put_file(f"{v}/reward.txt", b"passed")
        assert read_reward(sb, exit_code=0) == 0.0  # unreadable is not a pass
    finally:
        sb.close()
