"""Fixture Harbor tasks and scripted policies for the agentic tests (no tests here).

A fixture task is a tiny repository with one bug (``add`` subtracts), a fail-to-pass check of it and
a pass-to-pass check, carried as ``environment/repo/`` (the local runtime's convention).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

from rlmix.isolation.bwrap import isolation_problem
from rlmix.agentic.policy import Message, PolicyTurn, Transcript

# The fixture tasks are our own: where bubblewrap cannot run they may run unisolated (task.trusted);
# where it can, they are isolated like any task. The attacks in test_agentic_sandbox.py never opt out.
TRUSTED = isolation_problem() is not None

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TEST = "from calc import add, sub\n\nassert add(2, 3) == 5, 'fail-to-pass'\nassert sub(5, 3) == 2, 'pass-to-pass'\nprint('ok')\n"
TEST_SH = textwrap.dedent("""\
    #!/bin/bash
    cd "$APP_DIR"
    mkdir -p "$LOGS_DIR/verifier"
    bash "$TESTS_DIR/rlmix_verify.sh" test_calc.py
    """)
TASK_TOML = textwrap.dedent("""\
    version = "1.0"

    [metadata]
    difficulty = "hard"
    test_files = ["test_calc.py"]

    [verifier]
    timeout_sec = 30.0

    [agent]
    timeout_sec = 60.0

    [environment]
    build_timeout_sec = 600.0
    cpus = 1
    memory_mb = 1024
    """)

FIX = "<bash>sed -i '2s/a - b/a + b/' calc.py</bash>"
WRONG_FIX = "<bash>sed -i '2s/a - b/a * b/' calc.py</bash>"
SUBMIT = "<submit/>"


def make_task(root: Path, task_id: str, toml: str = TASK_TOML) -> Path:
    d = root / task_id
    (d / "environment" / "repo").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text("add(2, 3) returns -1 instead of 5. Fix calc.py.\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11\nCOPY repo /work/repo\nWORKDIR /work/repo\n")
    (d / "environment" / "repo" / "calc.py").write_text(BUGGY)
    (d / "environment" / "repo" / "test_calc.py").write_text(TEST)
    (d / "tests" / "test.sh").write_text(TEST_SH)
    return d


class ScriptedPolicy:
    """Plays a fixed list of action texts per (task, sample), then submits; records every transcript."""

    def __init__(self, script: Callable[[str, int], list[str]] | list[str]):
        self._script = script if callable(script) else (lambda task_id, sample: script)
        self.seen: list[list[Message]] = []  # the messages as each turn saw them

    def act(self, transcript: Transcript) -> PolicyTurn:
        self.seen.append(list(transcript.messages))
        turn = sum(m.role == "assistant" for m in transcript.messages)
        actions = self._script(transcript.task_id, transcript.sample)
        return PolicyTurn(text=actions[turn] if turn < len(actions) else SUBMIT)
