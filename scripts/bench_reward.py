"""Cost per graded sample of ``task.reward=python_tests``: the sandboxed harness against the old host run.

    python scripts/bench_reward.py              # 40 samples of each, interleaved
    python scripts/bench_reward.py -n 200

Three ways to grade the same correct completion against the same asserts, one sample after another
in turn (so load drifts hit all three alike), each timed end to end as the task calls it:

* ``host``: the previous reward, ``python -I -c code+tests`` in a temporary directory with rlimits,
  passing on exit code 0 (kept here as the baseline; it scored every known reward hack 1.0);
* ``harness``: the harness alone, on the host, without bubblewrap (what the harness itself costs);
* ``sandboxed``: the reward as it runs now (``rlmix.tasks.python_tests.run_python_tests``): a bwrap
  sandbox per sample around the harness.

Printed: median and 90th percentile milliseconds per sample, side by side, and the load average
before and after (the machine may be shared: compare the columns, not runs on different days).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

from arguments import at_least
from rlmix.tasks.python_tests import HARNESS, parse_verdict, run_python_tests, sandbox_problem

CODE = '''
from collections import Counter

def most_common_word(text, banned):
    words = [w.strip(".,!?;'").lower() for w in text.split()]
    counts = Counter(w for w in words if w and w not in banned)
    return counts.most_common(1)[0][0]
'''
TESTS = '''
assert most_common_word("Bob hit a ball, the hit BALL flew far after it was hit.", {"hit"}) == "ball"
assert most_common_word("a a b", set()) == "a"
assert most_common_word("x y y z z z", {"z"}) == "y"
assert most_common_word("One.", set()) == "one"
assert isinstance(most_common_word("q q", set()), str)
'''


def host_run(code: str, tests: str, timeout_s: float) -> bool:
    """The previous ``run_python_tests``: True iff code + tests exit 0 in a host subprocess."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))

    with tempfile.TemporaryDirectory(prefix="rlmix_py_") as tmp:
        proc = subprocess.run([sys.executable, "-I", "-c", f"{code}\n\n{tests}\n"], cwd=tmp,
                              env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=timeout_s,
                              preexec_fn=limit, stdin=subprocess.DEVNULL)
    return proc.returncode == 0


def harness_run(code: str, tests: str, timeout_s: float) -> bool:
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "solution": code, "tests": tests}).encode()
    proc = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", HARNESS.read_text()], input=job,
                          capture_output=True, timeout=timeout_s, env={"PATH": "/usr/bin:/bin"})
    return parse_verdict(proc.stdout, nonce, False).reward(False) == 1.0


def sandboxed_run(code: str, tests: str, timeout_s: float) -> bool:
    return run_python_tests(code, tests, timeout_s).reward(False) == 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=at_least(2), default=40, help="samples per way of grading")
    args = parser.parse_args()
    problem = sandbox_problem()
    if problem is not None:
        sys.exit(problem)
    ways = {"host": host_run, "harness": harness_run, "sandboxed": sandboxed_run}
    times: dict[str, list[float]] = {name: [] for name in ways}
    load_before = os.getloadavg()[0]
    for _ in range(args.n):
        for name, fn in ways.items():
            start = time.perf_counter()
            assert fn(CODE, TESTS, 30.0), f"{name}: the correct completion did not pass"
            times[name].append(1000 * (time.perf_counter() - start))
    load_after = os.getloadavg()[0]
    print(f"python_tests cost per graded sample, {args.n} samples each, {os.cpu_count()} cpus, "
          f"load average {load_before:.2f} before / {load_after:.2f} after")
    print(f"{'':>10} {'median ms':>10} {'p90 ms':>8}")
    for name, ts in times.items():
        p90 = statistics.quantiles(ts, n=10)[-1]
        print(f"{name:>10} {statistics.median(ts):>10.1f} {p90:>8.1f}")


if __name__ == "__main__":
    main()
