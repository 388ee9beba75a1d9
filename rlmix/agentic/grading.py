"""Grading in a fresh sandbox (docs/math.md §7): reward 1 iff every required test passes.

1. Start a fresh sandbox from the task (same image / same repository copy as the agent got).
2. Apply the agent's patch with ``git apply`` to the working tree, skipping every protected test
   path (``[metadata] test_files`` or ``DEFAULT_TEST_GLOBS``, and always ``ALWAYS_PROTECTED``: conftest.py,
   sitecustomize.py, usercustomize.py): the benchmark's tests stay as shipped, and run as shipped,
   so a policy that edits the tests cannot pass by it. ``--exclude`` judges a rename by its new path only,
   so a patch that renames a protected file away (deleting it) scores 0 unapplied. No baseline commit is
   needed here: the patch was taken against the agent sandbox's baseline, which is this same image on
   disk, and git is kept from finding any repository above the working copy.
3. Copy the task's ``tests/`` in from the task directory on the host (which no sandbox can see; the
   local runtime mounts them read-only), with ``rlmix_verify.sh`` and the python_tests harness beside
   them, and run ``bash $TESTS_DIR/test.sh`` with the task's ``[verifier] env`` and ``timeout_sec``.
   Nothing the agent wrote outside its patch reaches here.
4. The reward. A verifier that ended by a signal (exit status above 128, or killed) scores 0 whatever
   files it left. A ``test.sh`` that calls ``rlmix_verify.sh`` is judged by what the host controls: the
   verifier's own output must carry, under a nonce made for this grading, a passing verdict for every
   ``rlmix_verify.sh`` run it started, and the exit status must be 0; no file in the sandbox counts.
   Any other ``test.sh`` (Harbor's) is trusted as Harbor trusts it: ``$LOGS_DIR/verifier/reward.txt``
   (a number; or ``reward.json`` with ``"reward"``; either at most ``REWARD_FILE_MAX_BYTES``, a larger
   one scores 0 unread), else the exit code (0 passes). Reward 1 iff that number is >= 1. Why a
   grading scored 0 where the verifier's output would not say is the grade's ``note``.

Sandbox failures (``InfraError``) are retried ``retries`` times and then reported as an infra failure,
which is left out of pass@k, never scored 0. A patch that does not apply, a verifier that times out
or a failing test are the policy's outcome: reward 0.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
import secrets
import shlex
from dataclasses import dataclass, replace

from rlmix.agentic.harbor import HarborTask
from rlmix.agentic.sandbox import ONLY_OWN_REPO, FileTooLarge, InfraError, Runtime, Sandbox
from rlmix.tasks.python_tests import HARNESS

log = logging.getLogger(__name__)


# ``bash $TESTS_DIR/rlmix_verify.sh FILE``: the python_tests harness (rlmix/tasks/harness.py) runs FILE's
# asserts against the repository, whose modules it imports under its guards. The verdict the host
# reads is the pair of lines this script prints under the host's nonce (``VERIFY_NONCE_ENV``, dropped
# from the environment before the harness starts, so the code under test never inherits it): a start
# line before the harness and a reward line after it has ended. Code that kills the script leaves a
# start without its reward: 0. The reward file is still written, for Harbor's own runner; the host
# does not read it. Exit 0 iff every assert held.
# The harness's own nonce, the one its verdict line starts with, lives in one process: the Python that
# makes it, feeds the harness its job on a pipe, and picks the verdict out of the harness's output,
# printing it without the nonce. It is never on a command line or in an environment, where a process
# list shows it, and that process is not dumpable, so no process of the same user reads its memory
# (ptrace, /proc/<pid>/mem) where a /proc exists; the local runtime's grading sandbox has none
# (``Runtime.start``'s ``proc``).
VERIFY_NONCE_ENV = "RLMIX_VERIFY_NONCE"
VERIFY_SH = r"""#!/bin/bash
set -u
host=${RLMIX_VERIFY_NONCE:-none}
unset RLMIX_VERIFY_NONCE
run=$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')
printf '\nrlmix_verify %s %s start\n' "$host" "$run"
set -- $(python3 -I -S -c 'import json, os, subprocess, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
except Exception:
    pass
nonce = os.urandom(16).hex().encode()
harness = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", open(sys.argv[1]).read()],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
harness.stdin.write(json.dumps({"nonce": nonce.decode(), "solution": "", "tests": open(sys.argv[2]).read(),
                                "path": ["."]}).encode())
harness.stdin.close()
verdict = b""
for line in iter(lambda: harness.stdout.readline(4096), b""):
    if line.startswith(nonce + b" "):
        verdict = line[len(nonce):]
harness.wait()
sys.stdout.write(verdict.decode("ascii", "replace"))' "$TESTS_DIR/rlmix_harness.py" "$1")
reward=0
if [ "${3:-0}" = 1 ] && [ "${4:-}" = - ]; then reward=1; fi
rm -rf "$LOGS_DIR/verifier" && mkdir -p "$LOGS_DIR/verifier" && echo "$reward" > "$LOGS_DIR/verifier/reward.txt"
echo "rlmix_verify: ${1:-0} of ${2:-?} asserts held, flags ${4:-none}; reward $reward"
printf '\nrlmix_verify %s %s reward %s\n' "$host" "$run" "$reward"
[ "$reward" = 1 ]
"""
REWARD_FILE_MAX_BYTES = 4096  # a reward is a number: a larger file is the verifier's (or the patch's) doing


@dataclass(frozen=True)
class Grade:
    reward: float  # 1.0 iff all required tests pass; 0.0 also when infra_error is set (not scored)
    infra_error: str | None  # the last infrastructure failure when every attempt failed
    attempts: int
    patch_applied: bool
    verifier_exit_code: int | None
    verifier_timed_out: bool
    log_tail: str  # end of the verifier's output
    note: str | None = None  # why it scored 0 where the verifier's output would not say


def read_reward(sandbox: Sandbox, exit_code: int) -> tuple[float, str | None]:
    """(the verifier's reward file if it wrote one, else 1.0 for exit code 0; why it scored 0 or None).

    A reward file over ``REWARD_FILE_MAX_BYTES`` is not read (code under test may write one of any
    size) and scores 0."""
    vdir = f"{sandbox.logs_dir}/verifier"
    try:
        text = sandbox.read_file(f"{vdir}/reward.txt", REWARD_FILE_MAX_BYTES)
        if text is not None and text.strip():
            try:
                return float(text.decode().strip().split()[0]), None
            except ValueError:
                return 0.0, "reward.txt holds no number"  # an unreadable reward is not a pass
        raw = sandbox.read_file(f"{vdir}/reward.json", REWARD_FILE_MAX_BYTES)
    except FileTooLarge as e:
        return 0.0, f"reward file not read: {e}"
    if raw is not None:
        try:
            return float(json.loads(raw)["reward"]), None
        except (ValueError, KeyError, TypeError):
            return 0.0, "reward.json holds no number under 'reward'"
    return (1.0 if exit_code == 0 else 0.0), None


def ended_by_signal(exit_code: int) -> str | None:
    """Why a verifier's exit status says it did not end on its own, or None.

    Code under test that kills its verifier (every process it may signal) leaves whatever files it
    wrote first: such a run's files and output prove nothing."""
    if exit_code < 0:
        return f"the verifier was killed by signal {-exit_code}"
    if exit_code > 128:  # how shells and bwrap report a command killed by signal N: 128 + N
        return f"the verifier ended with exit status {exit_code} (signal {exit_code - 128})"
    return None


def uses_rlmix_verify(task: HarborTask) -> bool:
    """Whether the task's test.sh runs ``rlmix_verify.sh``: then only its nonce-keyed lines count."""
    return "rlmix_verify.sh" in (task.tests_dir / "test.sh").read_text(errors="replace")


def rlmix_verify_reward(output: str, nonce: str) -> tuple[float, str | None]:
    """(1.0 iff every ``rlmix_verify.sh`` run that printed a start line under ``nonce`` printed reward 1
    under it too, and at least one ran; why it scored 0 where no verdict says so, or None).

    Only the script knows ``nonce`` (the host made it for this grading): code under test can print
    none of these lines, and killing the script leaves its start line without a reward."""
    started, rewards = set(), {}
    for run, what in re.findall(rf"^rlmix_verify {re.escape(nonce)} ([0-9a-f]+) (start|reward [01])$", output,
                                flags=re.MULTILINE):
        if what == "start":
            started.add(run)
        else:
            rewards[run] = what[-1]
    if not started:
        return 0.0, "no rlmix_verify.sh run reported under this grading's nonce"
    if set(rewards) != started:
        return 0.0, "an rlmix_verify.sh run ended without its verdict (killed?)"
    return (1.0 if all(r == "1" for r in rewards.values()) else 0.0), None


def _unquote(name: str) -> str:
    """A path as git writes it in a patch header: as is, or C-quoted (octal escapes of UTF-8 bytes)."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    raw = name[1:-1].encode("utf-8", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


def renamed_protected(patch: str, globs: tuple[str, ...]) -> list[str]:
    """Protected paths the patch renames away. ``git apply --exclude`` looks at a rename's new path only,
    so such a rename would delete the protected file; git reads a rename's source from a header line
    ``rename from PATH`` (or ``rename old PATH``), which no hunk or binary line can start with."""
    sources = [_unquote(m) for m in re.findall(r"^rename (?:from|old) (.*?)[ \t\r]*$", patch, flags=re.MULTILINE)]
    return [s for s in sources if any(fnmatch.fnmatchcase(s, g) for g in globs)]


# Files that change how the tests run without being tests, protected whatever a task's test_files say: pytest
# loads every conftest.py above a test it collects, and Python imports sitecustomize/usercustomize at start-up
# from any directory on PYTHONPATH. A patch that adds one (os._exit(0) before any test) would pass any verifier
# that runs Python or pytest in the repository.
ALWAYS_PROTECTED = ("conftest.py", "*/conftest.py", "sitecustomize.py", "*/sitecustomize.py", "usercustomize.py",
                    "*/usercustomize.py")


def _grade_once(task: HarborTask, patch: str, runtime: Runtime, network: bool) -> Grade:
    globs = (*task.test_globs, *ALWAYS_PROTECTED)
    moved = renamed_protected(patch, globs)
    if moved:
        note = f"the patch renames protected test files away: {', '.join(moved[:3])}"
        log.info("grading %s: scored 0: %s", task.task_id, note)
        return Grade(0.0, None, 1, False, None, False, "", note)
    # No /proc for rlmix_verify.sh, whose verdict rests on a nonce in the verifier's memory: through one, a
    # path relative to a descriptor of "/" (which no check of path names catches) reaches every process.
    rlmix_verify = uses_rlmix_verify(task)
    sandbox = runtime.start(task, network=network, proc=not rlmix_verify)
    try:
        applied = True
        if patch.strip():
            patch_path = f"{sandbox.logs_dir}/agent.patch"
            sandbox.put_file(patch_path, patch.encode())
            excludes = " ".join(f"--exclude={shlex.quote(g)}" for g in globs)
            res = sandbox.run(f"{ONLY_OWN_REPO} && git apply --binary --whitespace=nowarn {excludes} "
                              f"{shlex.quote(patch_path)}", timeout_s=300.0)
            applied = res.exit_code == 0
            if not applied:
                return Grade(0.0, None, 1, False, None, False, f"patch does not apply: {res.output[-2000:]}")
        sandbox.put_dir(task.tests_dir, sandbox.tests_dir)
        sandbox.put_file(f"{sandbox.tests_dir}/rlmix_harness.py", HARNESS.read_bytes())
        sandbox.put_file(f"{sandbox.tests_dir}/rlmix_verify.sh", VERIFY_SH.encode())
        # One process start for the verifier: every command in a sandbox costs one (docs/agentic.md).
        verifier = f"{shlex.quote(sandbox.logs_dir)}/verifier"
        nonce = secrets.token_hex(16)  # a new one per grading: an earlier grading's output proves nothing here
        res = sandbox.run(f"mkdir -p {verifier}; rm -f {verifier}/reward.*; "
                          f"exec bash {shlex.quote(sandbox.tests_dir)}/test.sh",
                          timeout_s=task.verifier_timeout_s,
                          env={**dict(task.verifier_env), VERIFY_NONCE_ENV: nonce})
        note = (f"the verifier timed out after {task.verifier_timeout_s:g} s" if res.timed_out
                else ended_by_signal(res.exit_code))
        if note is not None:
            reward = 0.0
        elif rlmix_verify:
            reward, note = rlmix_verify_reward(res.output, nonce)
            if res.exit_code != 0 and reward >= 1.0:
                reward, note = 0.0, f"every rlmix_verify.sh run passed, but test.sh exited {res.exit_code}"
        else:
            reward, note = read_reward(sandbox, res.exit_code)
        if note is not None:
            log.info("grading %s: scored 0: %s", task.task_id, note)
        return Grade(1.0 if reward >= 1.0 else 0.0, None, 1, applied, res.exit_code, res.timed_out,
                     res.output[-2000:], note)
    finally:
        sandbox.close()


def grade_patch(task: HarborTask, patch: str, runtime: Runtime, retries: int, network: bool = False) -> Grade:
    """Grade ``patch`` against ``task``; infrastructure failures are retried up to ``retries`` times."""
    last = ""
    for attempt in range(1, retries + 2):
        try:
            return replace(_grade_once(task, patch, runtime, network), attempts=attempt)
        except InfraError as e:
            last = str(e)
            log.warning("grading %s: infrastructure failure (attempt %d of %d): %s", task.task_id, attempt,
                        retries + 1, last)
    return Grade(0.0, last, retries + 1, False, None, False, "")
