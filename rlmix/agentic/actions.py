"""The action format the policy writes, and the text the environment answers with.

One action per turn, anywhere in the policy's text (reasoning around it is allowed)::

    <bash>python -m pytest -q tests/test_x.py</bash>     run one shell command in the repository
    <submit/>                                           end the episode; the repository is graded

Exactly one of the two must appear, and ``<bash>`` at most once, non-empty and without a NUL byte;
anything else is a format error, fed back to the policy as an observation and counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BASH = re.compile(r"<bash>(.*?)</bash>", flags=re.DOTALL)
_SUBMIT = re.compile(r"<submit\s*/?>")
SUBMIT_ACTION = "<submit/>"

SYSTEM_PROMPT = """You are fixing an issue in a software repository. Work in turns. In each turn write \
exactly one action:
<bash>COMMAND</bash> runs COMMAND with bash in the repository root (a fresh shell each time: use \
files, not cd or variables, to keep state) and shows you its exit code and output;
<submit/> ends your work; the repository as you leave it is graded by hidden tests.
The network is off. Edit files with shell tools (sed, python, cat <<'EOF' > file). Do not edit tests."""


@dataclass(frozen=True)
class Command:
    command: str


@dataclass(frozen=True)
class Submit:
    pass


@dataclass(frozen=True)
class FormatError:
    reason: str  # shown to the policy


Action = Command | Submit | FormatError


def parse_action(text: str) -> Action:
    """The one action in ``text``, or a FormatError saying what is wrong."""
    commands = _BASH.findall(text)
    submitted = _SUBMIT.search(text) is not None
    if submitted and commands:
        return FormatError("write either one <bash>...</bash> or <submit/>, not both")
    if submitted:
        return Submit()
    if not commands:
        return FormatError("no action found: write exactly one <bash>COMMAND</bash> or <submit/>")
    if len(commands) > 1:
        return FormatError(f"{len(commands)} <bash> blocks found: write exactly one per turn")
    if not commands[0].strip():
        return FormatError("the <bash></bash> block is empty")
    if "\0" in commands[0]:  # no process argument can carry one: the command could not even start
        return FormatError("the command holds a NUL byte")
    return Command(commands[0].strip())


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail (errors are usually at the end), mark what was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters omitted ...]\n{text[-tail:]}"


def observation_text(exit_code: int, output: str, timed_out: bool, timeout_s: float, max_chars: int) -> str:
    status = f"timed out after {timeout_s:g} s (killed)" if timed_out else f"exit code {exit_code}"
    return f"[{status}]\n{truncate_middle(output, max_chars)}"


def format_error_text(err: FormatError, errors_so_far: int, max_errors: int) -> str:
    return f"[format error {errors_so_far}/{max_errors}] {err.reason}"
