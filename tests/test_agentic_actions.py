"""The action format, observation truncation and reward reading."""

from __future__ import annotations

import tracemalloc

import pytest

from rlmix.agentic.actions import Command, FormatError, Submit, parse_action, truncate_middle
from rlmix.agentic.grading import ended_by_signal, read_reward, rlmix_verify_reward
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime
from rlmix.agentic.sandbox import FileTooLarge
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


@pytest.fixture
def calc_sandbox(tmp_path):
    make_task(tmp_path / "tasks", "calc")
    sb = LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED).start(load_tasks(tmp_path / "tasks")["calc"],
                                                                    network=False)
    yield sb
    sb.close()


def test_reward_file_then_json_then_exit_code(calc_sandbox):
    sb, v = calc_sandbox, f"{calc_sandbox.logs_dir}/verifier"
    assert read_reward(sb, exit_code=0) == (1.0, None) and read_reward(sb, exit_code=1) == (0.0, None)
    sb.put_file(f"{v}/reward.json", b'{"reward": 0.5}')
    assert read_reward(sb, exit_code=0) == (0.5, None)
    sb.put_file(f"{v}/reward.txt", b"1\n")
    assert read_reward(sb, exit_code=1) == (1.0, None)  # the file wins over the exit code
    sb.put_file(f"{v}/reward.txt", b"passed")
    assert read_reward(sb, exit_code=0)[0] == 0.0  # unreadable is not a pass
    sb.put_file(f"{v}/reward.txt", b"1" + b" " * 5000)  # a number, in more bytes than a reward needs
    reward, note = read_reward(sb, exit_code=0)
    assert reward == 0.0 and "reward.txt has 5001 bytes, more than the 4096 read" in note


def test_read_file_refuses_a_file_over_its_cap_unread(calc_sandbox):
    sb = calc_sandbox
    sb.run("printf '1 ' > $LOGS_DIR/big && truncate -s 2G $LOGS_DIR/big && echo small > $LOGS_DIR/small",
           timeout_s=10.0)
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLarge, match="2147483648 bytes, more than the 4096 read"):
            sb.read_file(f"{sb.logs_dir}/big", 4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # not the 2 GiB
    assert sb.read_file(f"{sb.logs_dir}/small", 6) == b"small\n"
    assert sb.read_file(f"{sb.logs_dir}/missing", 6) is None


NONCE = "0f" * 16


@pytest.mark.parametrize("output, reward, note", [
    (f"x\nrlmix_verify {NONCE} a1 start\nok\nrlmix_verify {NONCE} a1 reward 1\n", 1.0, None),
    (f"rlmix_verify {NONCE} a1 start\nrlmix_verify {NONCE} a1 reward 0\n", 0.0, None),
    ("", 0.0, "no rlmix_verify.sh run"),
    # Lines under another nonce are not this grading's (printed by the code under test, or replayed).
    (f"rlmix_verify {'1e' * 16} a1 start\nrlmix_verify {'1e' * 16} a1 reward 1\n", 0.0, "no rlmix_verify.sh"),
    (f"rlmix_verify {NONCE} a1 start\n", 0.0, "without its verdict"),  # killed before its verdict
    # Two runs: each needs its own verdict, and each must pass.
    (f"rlmix_verify {NONCE} a1 start\nrlmix_verify {NONCE} b2 start\nrlmix_verify {NONCE} b2 reward 1\n", 0.0,
     "without its verdict"),
    (f"rlmix_verify {NONCE} a1 start\nrlmix_verify {NONCE} a1 reward 0\n"
     f"rlmix_verify {NONCE} b2 start\nrlmix_verify {NONCE} b2 reward 1\n", 0.0, None),
    (f"junk rlmix_verify {NONCE} a1 start\njunk rlmix_verify {NONCE} a1 reward 1\n", 0.0, "no rlmix_verify.sh"),
])
def test_rlmix_verify_verdict_lines(output, reward, note):
    got_reward, got_note = rlmix_verify_reward(output, NONCE)
    assert got_reward == reward and (got_note is None if note is None else note in got_note)


def test_a_verifier_ended_by_a_signal_is_named():
    assert ended_by_signal(0) is None and ended_by_signal(1) is None and ended_by_signal(128) is None
    assert "signal 9" in ended_by_signal(137) and "signal 9" in ended_by_signal(-9)
