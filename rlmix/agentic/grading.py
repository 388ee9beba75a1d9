"""Grading in a fresh sandbox (docs/math.md §7): reward 1 iff every required test passes.

1. Start a fresh sandbox from the task (same image / same repository copy as the agent got).
2. Apply the agent's patch with ``git apply`` to the working tree, skipping every protected test
   path (``[metadata] test_files`` or ``DEFAULT_TEST_GLOBS``): the benchmark's tests stay as shipped,
   so a policy that edits the tests cannot pass by it. No baseline commit is needed here: the
   patch was taken against the agent sandbox's baseline, which is this same image on disk, and git
   is kept from finding any repository above the working copy.
3. Copy the task's ``tests/`` in from the task directory on the host (which no sandbox can see; the
   local runtime mounts them read-only), with ``rlmix_verify.sh`` and the python_tests harness beside
   them, and run ``bash $TESTS_DIR/test.sh`` with the task's ``[verifier] env`` and ``timeout_sec``.
   Nothing the agent wrote outside its patch reaches here.
4. The reward is ``$LOGS_DIR/verifier/reward.txt`` (a number; or ``reward.json`` with ``"reward"``),
   else the exit code (0 passes). Reward 1 iff that number is >= 1.

Sandbox failures (``InfraError``) are retried ``retries`` times and then reported as an infra failure,
which is left out of pass@k, never scored 0. A patch that does not apply, a verifier that times out
or a failing test are the policy's outcome: reward 0.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass

from rlmix.agentic.harbor import HarborTask
from rlmix.agentic.sandbox import ONLY_OWN_REPO, InfraError, Runtime, Sandbox
from rlmix.tasks.python_tests import HARNESS

log = logging.getLogger(__name__)


# ``bash $TESTS_DIR/rlmix_verify.sh FILE``: the python_tests harness (rlmix/tasks/harness.py) runs FILE's
# asserts against the repository, whose modules it imports under its guards; the reward file is
# written by this script from the nonce-keyed verdict after the harness has ended (it refuses
# fork, so no process of the patch is left to overwrite it). Exit 0 iff every assert held.
VERIFY_SH = r"""#!/bin/bash
set -u
nonce=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
verdict=$(python3 -I -S -c 'import json, sys
sys.stdout.write(json.dumps({"nonce": sys.argv[1], "solution": "", "tests": open(sys.argv[2]).read(), "path": ["."]}))' \
    "$nonce" "$1" | python3 -I -S -B -c "$(cat "$TESTS_DIR/rlmix_harness.py")" | grep -a "^$nonce " | tail -n 1)
set -- $verdict
reward=0
if [ "${4:-0}" = 1 ] && [ "${5:-}" = - ]; then reward=1; fi
rm -rf "$LOGS_DIR/verifier" && mkdir -p "$LOGS_DIR/verifier" && echo "$reward" > "$LOGS_DIR/verifier/reward.txt"
echo "rlmix_verify: ${2:-0} of ${3:-?} asserts held, flags ${5:-none}; reward $reward"
[ "$reward" = 1 ]
"""


@dataclass(frozen=True)
class Grade:
    reward: float  # 1.0 iff all required tests pass; 0.0 also when infra_error is set (not scored)
    infra_error: str | None  # the last infrastructure failure when every attempt failed
    attempts: int
    patch_applied: bool
    verifier_exit_code: int | None
    verifier_timed_out: bool
    log_tail: str  # end of the verifier's output


def read_reward(sandbox: Sandbox, exit_code: int) -> float:
    """The verifier's reward file if it wrote one, else 1.0 for exit code 0."""
    vdir = f"{sandbox.logs_dir}/verifier"
    text = sandbox.read_file(f"{vdir}/reward.txt")
    if text is not None and text.strip():
        try:
            return float(text.decode().strip().split()[0])
        except ValueError:
            return 0.0  # an unreadable reward is not a pass
    raw = sandbox.read_file(f"{vdir}/reward.json")
    if raw is not None:
        try:
            return float(json.loads(raw)["reward"])
        except (ValueError, KeyError, TypeError):
            return 0.0
    return 1.0 if exit_code == 0 else 0.0


def _grade_once(task: HarborTask, patch: str, runtime: Runtime, network: bool) -> Grade:
    sandbox = runtime.start(task, network=network)
    try:
        applied = True
        if patch.strip():
            patch_path = f"{sandbox.logs_dir}/agent.patch"
            sandbox.put_file(patch_path, patch.encode())
            excludes = " ".join(f"--exclude={shlex.quote(g)}" for g in task.test_globs)
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
        res = sandbox.run(f"mkdir -p {verifier}; rm -f {verifier}/reward.*; "
                          f"exec bash {shlex.quote(sandbox.tests_dir)}/test.sh",
                          timeout_s=task.verifier_timeout_s, env=dict(task.verifier_env))
        reward = 0.0 if res.timed_out else read_reward(sandbox, res.exit_code)
        return Grade(1.0 if reward >= 1.0 else 0.0, None, 1, applied, res.exit_code, res.timed_out,
                     res.output[-2000:])
    finally:
        sandbox.close()


def grade_patch(task: HarborTask, patch: str, runtime: Runtime, retries: int, network: bool = False) -> Grade:
    """Grade ``patch`` against ``task``; infrastructure failures are retried up to ``retries`` times."""
    last = ""
    for attempt in range(1, retries + 2):
        try:
            grade = _grade_once(task, patch, runtime, network)
            return Grade(grade.reward, None, attempt, grade.patch_applied, grade.verifier_exit_code,
                         grade.verifier_timed_out, grade.log_tail)
        except InfraError as e:
            last = str(e)
            log.warning("grading %s: infrastructure failure (attempt %d of %d): %s", task.task_id, attempt,
                        retries + 1, last)
    return Grade(0.0, last, retries + 1, False, None, False, "")
