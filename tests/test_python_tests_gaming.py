"""``python_tests`` against verifier gaming found after the first guards: each exploit scores 0, its honest twin 1.

The agentic verifier's case (a repository on ``sys.path``) runs the harness as ``rlmix/agentic/grading.py``'s
``VERIFY_SH`` does, in the repository's directory, on the host: the exploit only writes a line.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlmix.tasks.python_tests import HARNESS, parse_verdict, run_python_tests, sandbox_problem

needs_sandbox = pytest.mark.skipif(sandbox_problem() is not None, reason=f"{sandbox_problem()}")
ALWAYS_EQUAL = textwrap.dedent("""
    class A:
        def __eq__(s, o): return True
        def __ne__(s, o): return False
        __hash__ = object.__hash__
    def f(x):
        return A()
""")
FIND_NONCE = textwrap.dedent("""
    import sys, os
    f = sys._getframe()
    while f is not None:
        L = f.f_locals
        if "nonce" in L and "out_fd" in L:
            os.write(L["out_fd"], ("\\n%s 2 2 1 -\\n" % L["nonce"]).encode()); os._exit(0)
        f = f.f_back
""")


def reward(code: str, tests: str) -> float:
    return run_python_tests(code, tests, 10.0).reward(False)


def verify_repo(repo: Path, tests: str) -> float:
    """The agentic verifier's reward for ``tests`` run against the repository ``repo`` (``path: ["."]``)."""
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "solution": "", "tests": tests, "path": ["."]})
    done = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", HARNESS.read_text()], input=job.encode(),
                          capture_output=True, cwd=repo, timeout=60)
    return parse_verdict(done.stdout, nonce, False).reward(False)


@pytest.mark.parametrize("shadowed", ["heapq", "bisect", "string", "copy", "statistics"])
def test_a_repository_module_named_like_the_standard_librarys_cannot_forge_the_verdict(tmp_path, shadowed):
    """The module walked the frames to the harness's nonce before the audit hook existed (the tests fail)."""
    (tmp_path / f"{shadowed}.py").write_text(FIND_NONCE)
    assert verify_repo(tmp_path, "import math\nassert math.floor(2.5) == 3\n") == 0.0
    assert verify_repo(tmp_path, f"import {shadowed}\nassert 1 == 2\n") == 0.0


REACH_PROC = textwrap.dedent("""
    import os
    def listed(route):
        root = os.open("/", os.O_RDONLY)
        try:
            if route == "proc":  # "proc" relative to a descriptor of "/": no path name says /proc
                return os.listdir(os.open("proc", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root))
            return [os.read(os.open("dev/fd/../environ", os.O_RDONLY, dir_fd=root), 64)]  # /dev/fd -> /proc/self/fd
        except OSError:
            return []
""")


@pytest.mark.parametrize("route", ["proc", "dev_fd"])
def test_proc_is_not_reached_through_a_directory_descriptor(tmp_path, route):
    """Where the harness has a /proc (docker, a trusted run), a path relative to a descriptor of "/" reached it:
    its own memory holds the nonce. Here, on the host, /proc exists, as there."""
    (tmp_path / "reach.py").write_text(REACH_PROC)
    assert verify_repo(tmp_path, f"from reach import listed\nassert listed({route!r})\n") == 0.0
    (tmp_path / "data.txt").write_text("ok")  # a relative os.open of the tests' own files still works
    honest = "import os\nfd = os.open('data.txt', os.O_RDONLY)\nassert os.read(fd, 2) == b'ok'\n"
    assert verify_repo(tmp_path, honest) == 1.0


def test_a_repository_module_still_serves_the_tests(tmp_path):
    (tmp_path / "helper.py").write_text("import heapq\ndef two():\n    return heapq.nsmallest(1, [2, 3])[0]\n")
    (tmp_path / "heapq.py").write_text("def nsmallest(n, items):\n    return sorted(items)[:n]\n")
    assert verify_repo(tmp_path, "from helper import two\nassert two() == 2\n") == 1.0
    assert verify_repo(tmp_path, "from helper import two\nassert two() == 3\n") == 0.0


@needs_sandbox
def test_a_module_planted_in_sys_modules_does_not_serve_the_tests():
    plant = ("import sys, types\nnp = types.ModuleType('numpy')\nnp.allclose = lambda *a, **k: True\n"
             "sys.modules['numpy'] = np\n")
    tests = "import numpy as np\nassert np.allclose(f(1), [2.0])\n"
    assert reward(plant + "def f(x):\n    return [0.0]\n", tests) == 0.0
    finder = ("import sys, types, importlib.abc, importlib.util\n"
              "class F(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
              "    def find_spec(self, name, path, target=None):\n"
              "        return importlib.util.spec_from_loader(name, self) if name == 'numpy' else None\n"
              "    def exec_module(self, m):\n        m.allclose = lambda *a, **k: True\n"
              "sys.meta_path.insert(0, F())\ndef f(x):\n    return [0.0]\n")
    assert reward(finder, tests) == 0.0
    honest = "import importlib\ntextwrap = importlib.import_module('textwrap')\ndef f(x):\n    return [2.0 * x]\n"
    assert reward(honest, "import math\nassert all(map(math.isclose, f(1), [2.0]))\n") == 1.0


@needs_sandbox
@pytest.mark.parametrize("tests", [
    "ok = f(1) == 2\nassert ok\n",
    "if f(1) != 2:\n    raise AssertionError\n",
    "def is_two(v):\n    return v == 2\nassert is_two(f(1))\n",
    "def check(candidate):\n    results = [candidate(1) == 2]\n    assert all(results)\ncheck(f)\n",
    "assert [v for v in [f(1)] if v == 2]\n",
])
def test_a_comparison_outside_an_assert_is_guarded_too(tests):
    assert reward(ALWAYS_EQUAL, tests) == 0.0
    assert reward("def f(x):\n    return x + 1\n", tests) == 1.0


@needs_sandbox
def test_honest_tests_compare_and_compute_outside_asserts():
    tests = textwrap.dedent("""
        import math
        def close(a, b):
            return abs(a - b) < 1e-6
        def check(candidate):
            got = candidate(3)
            assert close(got, 1.0)
            assert math.isclose(got, 1.0)
            assert sorted([candidate(6), got]) == [got, candidate(6)]
            assert set(map(candidate, [3, 6])) == {1.0, 2.0}
            seen = {1.0, 2.0}
            if got not in seen or got > 5 or not 0 < got <= 1:
                raise AssertionError
            assert got is not None and (got, True) == (1.0, True)
        check(f)
    """)
    assert reward("def f(x):\n    return x / 3\n", tests) == 1.0
    assert reward("def f(x):\n    return x / 4\n", tests) == 0.0


@needs_sandbox
def test_sys_constants_are_watched():
    tests = "import sys\nassert f(1) == sys.maxsize\n"
    assert reward("import sys\nsys.maxsize = 7\ndef f(x):\n    return 7\n", tests) == 0.0
    assert reward("import sys\nsys.setrecursionlimit(5000)\ndef f(x):\n    return sys.maxsize\n", tests) == 1.0


@needs_sandbox
def test_a_bool_is_not_an_int_inside_containers_either():
    assert reward("def f(x):\n    return [True, False]\n", "assert f(1) == [1, 0]\n") == 0.0
    assert reward("def f(x):\n    return {'a': (1, 2j)}\n", "assert f(1) == {'a': (True, 2j)}\n") == 0.0
    assert reward("def f(x):\n    return [1, 0.0, (True, 2j)]\n", "assert f(1) == [1.0, 0, (True, 2j)]\n") == 1.0


@pytest.mark.slow  # 40 gradings
@needs_sandbox
def test_a_thread_cannot_swap_an_item_between_the_check_and_the_comparison():
    """Compared is a copy taken at the check. On the old code about one grading in 30 won the race."""
    race = textwrap.dedent("""
        import sys, threading
        sys.setswitchinterval(1e-6)
        class A:
            def __eq__(s, o): return True
            def __ne__(s, o): return False
            __hash__ = object.__hash__
        box = [0]
        def flip():
            a = A()
            while True:
                box[0] = 0
                box[0] = a
        threading.Thread(target=flip, daemon=True).start()
        def f(x):
            return box
    """)
    assert all(reward(race, "assert f(1) == [2]\n") == 0.0 for _ in range(40))
    assert reward("def f(x):\n    return [x + 1]\n", "assert f(1) == [2]\n") == 1.0
