"""The sandbox interface shared by the ``local`` and ``docker`` runtimes, and git helpers on top of it.

A sandbox holds one copy of a task's repository. Each command runs in a fresh ``bash -c`` with the
repository as its working directory, so state persists only through the file system. Paths the
verifier needs are exposed as environment variables in every command:
``TESTS_DIR`` (the task's tests/ once copied in), ``LOGS_DIR`` (``$LOGS_DIR/verifier/reward.txt``)
and ``APP_DIR`` (the repository).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlmix.agentic.harbor import HarborTask

GIT_ENV = "GIT_AUTHOR_NAME=rlmix GIT_AUTHOR_EMAIL=rlmix@localhost GIT_COMMITTER_NAME=rlmix " \
          "GIT_COMMITTER_EMAIL=rlmix@localhost"

# Git must never walk up from the repository into an enclosing one (a temporary directory inside a
# checkout, or a policy that deleted .git): stop the search at the repository's parent.
ONLY_OWN_REPO = 'export GIT_CEILING_DIRECTORIES="$(dirname "$PWD")"'
DEFAULT_OUTPUT_CAP_BYTES = 1 << 20  # command output kept per command (first and last halves)
MAX_PATCH_BYTES = 32 << 20  # a larger patch is the policy's failure, not something to grade


class InfraError(RuntimeError):
    """The sandbox itself failed (image build, engine, copy): retried, never scored as a failure."""


class FileTooLarge(Exception):
    """A file the runner reads from a sandbox is over the caller's cap: commands may write one of any
    size (a sparse file costs them nothing), so it is refused unread, and is the sandbox's doing."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int  # -1 when the command was killed at its time limit
    output: str  # stdout and stderr interleaved
    timed_out: bool
    duration_s: float


class Sandbox(Protocol):
    workdir: str  # the repository, as commands see it
    tests_dir: str  # where put_dir(task.tests_dir, ...) lands, as commands see it
    logs_dir: str

    def run(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult: ...

    def put_dir(self, host_dir: Path, sandbox_dir: str) -> None: ...

    def put_file(self, sandbox_path: str, data: bytes) -> None: ...

    def read_file(self, sandbox_path: str, max_bytes: int) -> bytes | None:
        """The regular file's bytes, or None; raises FileTooLarge past ``max_bytes`` (never read whole)."""

    def close(self) -> None: ...


class Runtime(Protocol):
    def unavailable(self) -> str | None:
        """Why this runtime cannot run on this machine (one line naming the fix), or None; cheap."""

    def check(self, task: HarborTask) -> str | None:
        """A user-fixable reason this runtime cannot run the task (one line), or None; cheap."""

    def prepare(self, task: HarborTask) -> None:
        """Whatever is needed once per task (build or pull the image); raises InfraError."""

    def start(self, task: HarborTask, network: bool, proc: bool = True) -> Sandbox:
        """A fresh sandbox with a clean copy of the task's repository; raises InfraError.

        ``proc=False``: no ``/proc`` in it, where the runtime can leave one out (the local runtime; a
        docker container always has one). Grading asks for none when nothing the verifier runs needs it."""


def snapshot_baseline(sandbox: Sandbox) -> str:
    """Commit the pristine repository state and return its sha; the agent's patch is diffed against it.

    Always a new commit (even on a clean git checkout) so untracked files present in the image are
    part of the baseline, not of the agent's patch. Run in both the agent and the grading sandbox:
    both come from the same image, so the patch applies.
    """
    cmd = (f"{ONLY_OWN_REPO} && (git rev-parse --git-dir >/dev/null 2>&1 || git init -q) && git add -A && "
           f"env {GIT_ENV} git commit -q --allow-empty --no-verify -m rlmix-baseline && git rev-parse HEAD")
    res = sandbox.run(cmd, timeout_s=300.0)
    sha = res.output.strip().splitlines()[-1] if res.output.strip() else ""
    if res.exit_code != 0 or len(sha) != 40:
        raise InfraError(f"could not snapshot the repository at {sandbox.workdir} (exit {res.exit_code}): "
                         f"{res.output[-500:]}")
    return sha


def capture_patch(sandbox: Sandbox, baseline: str) -> tuple[str, str | None]:
    """(the agent's changes as one git patch: tracked, new and deleted files, binary-safe; error or None).

    A failing capture is the policy's doing (it damaged the repository or its ``.git``), not the
    infrastructure's: the patch is then empty and the sample is graded (and fails) as usual.
    """
    # Written to a file, not read as output: command output is capped, a patch must arrive whole.
    path = f"{sandbox.logs_dir}/agent.patch"
    res = sandbox.run(f'{ONLY_OWN_REPO} && mkdir -p "$LOGS_DIR" && git add -A 2>/dev/null && '
                      f'git diff --cached --binary {baseline} > {path} && wc -c < {path}', timeout_s=300.0)
    if res.exit_code != 0:
        return "", f"could not capture the patch (exit {res.exit_code}): {res.output[-300:]}"
    size = int(res.output.split()[-1]) if res.output.split() and res.output.split()[-1].isdigit() else -1
    if not 0 <= size <= MAX_PATCH_BYTES:
        return "", f"the patch has {size} bytes, more than the {MAX_PATCH_BYTES} allowed"
    try:
        data = sandbox.read_file(path, MAX_PATCH_BYTES)
    except FileTooLarge as e:
        return "", str(e)
    if data is None:
        return "", "could not read the captured patch"
    return data.decode("utf-8", errors="replace"), None
