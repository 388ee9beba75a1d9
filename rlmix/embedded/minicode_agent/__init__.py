"""``task=minicode_agent``: the minicode problem as a multi-turn agentic task in a sandbox.

The policy sees the examples (``51234>43215;...?``) and works in the task's repository with the
same action format as every agentic task (``rlmix.agentic.actions``)::

    <bash>./mc 'rev|add1'</bash>      run a candidate on the examples: one line per example,
                                      its output and ``ok``/``no``
    <bash>echo 'rev|add1' >answer</bash>
    <submit/>                         graded in a fresh sandbox: reward 1 iff ``answer`` maps the
                                      shown and the hidden inputs right

Each problem becomes a Harbor task directory (``write_task``), so episodes, the sandbox, grading
and infrastructure retries are exactly those of ``task=swebench_pro``.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from rlmix.agentic.harbor import HarborTask, load_task
from rlmix.errors import ConfigError
from rlmix.tasks.base import Problem
from rlmix.embedded.minicode import MiniCodePayload
from rlmix.embedded.minicode_lang import show

HERE = Path(__file__).resolve().parent
TOOL, ANSWER_FILE = "mc", "answer"
TASK_TOML = textwrap.dedent("""\
    version = "1.0"

    [metadata]
    test_files = ["examples", "mc"]

    [verifier]
    timeout_sec = 30.0

    [agent]
    timeout_sec = 120.0

    [environment]
    cpus = 1
    memory_mb = 512
    """)
TEST_SH = '#!/bin/bash\npython3 "$TESTS_DIR/grade.py"\n'
DOCKERFILE = "FROM python:3.12-slim\nCOPY repo /app\nWORKDIR /app\n"


def try_action(program: str) -> str:
    return f"<bash>./{TOOL} '{program}'</bash>"


def answer_action(program: str) -> str:
    return f"<bash>echo '{program}' >{ANSWER_FILE}</bash>"


def _case_lines(cases) -> str:
    return "".join(f"{show(xs)}>{show(out)}\n" for xs, out in cases)


def task_dir_name(problem: Problem) -> str:
    return problem.task_id.replace("/", "_")


def write_task(root: Path, problem: Problem) -> HarborTask:
    """Write ``problem`` as a Harbor task directory under ``root`` and load it back."""
    payload: MiniCodePayload = problem.payload
    d = Path(root) / task_dir_name(problem)
    if d.exists():
        shutil.rmtree(d)
    (d / "environment" / "repo").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(TASK_TOML)
    (d / "instruction.md").write_text(problem.prompt)
    (d / "environment" / "Dockerfile").write_text(DOCKERFILE)
    repo = d / "environment" / "repo"
    shutil.copyfile(HERE / "tool.py", repo / TOOL)
    (repo / TOOL).chmod(0o755)
    (repo / "examples").write_text(_case_lines(payload.examples))
    shutil.copyfile(HERE / "tool.py", d / "tests" / "mc.py")
    shutil.copyfile(HERE / "grade.py", d / "tests" / "grade.py")
    (d / "tests" / "cases").write_text(_case_lines(payload.examples + payload.hidden))
    (d / "tests" / "test.sh").write_text(TEST_SH)
    task, problems = load_task(d)
    if task is None:  # our own writer: a bug, not the user's input
        raise ConfigError(f"minicode_agent wrote an invalid task directory {d}: {'; '.join(problems)}")
    return task
