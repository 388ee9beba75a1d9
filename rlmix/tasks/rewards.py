"""Rewards of dataset tasks: built-in verifiers and user functions named ``module:function``.

A reward function has this signature (a plain Python callable, no rlmix import needed)::

    def reward(completion: str, answer, row: dict) -> float

- ``completion``: the generated text, special tokens removed. When ``task.format_regex`` has a
  capturing group, its first group (the extracted answer) is passed instead.
- ``answer``: the row's ``task.answer_key`` value, as stored (string, number, list, ...).
- ``row``: the whole dataset row (read-only by convention), for rewards that need more fields.
- returns a real number (``bool`` counts: True is 1.0). 1.0 or more counts as a pass for pass@k.

Built-ins (``task.reward=exact|math|python_tests``):

- ``exact``: the stripped completion equals ``str(answer)`` stripped.
- ``math``: the last number in the completion (``\\boxed{}`` content preferred; integers, decimals,
  fractions ``a/b``, thousands separators) equals the answer's number within 1e-6 relative.
- ``python_tests``: the completion is Python source; ``answer`` is test code (asserts). Both run in
  a fresh ``python -I`` subprocess in a temporary directory with a wall-clock timeout
  (``task.python_timeout_s``), CPU and memory limits and an empty environment. Pass iff it exits 0.
  This isolates mistakes, not adversaries: run untrusted code inside a container.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import math
import numbers
import os
import re
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from rlmix.errors import ConfigError

RewardFn = Callable[[str, Any, Mapping[str, Any]], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
PYTHON_MEMORY_BYTES = 1 << 30


class BuiltinReward(enum.Enum):
    exact = "exact"
    math = "math"
    python_tests = "python_tests"


def exact_match(completion: str, answer: Any, row: Mapping[str, Any]) -> float:
    return float(completion.strip() == str(answer).strip())


def parse_number(text: str) -> Fraction | float | None:
    """The last number in ``text`` (inside ``\\boxed{}`` if present), or None."""
    boxed = _BOXED.findall(text)
    found = _NUMBER.findall(boxed[-1] if boxed else text)
    if not found:
        return None
    token = found[-1].replace(",", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(completion: str, answer: Any, row: Mapping[str, Any]) -> float:
    got, want = parse_number(completion), parse_number(str(answer))
    if got is None or want is None:
        return 0.0
    return float(math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=1e-9))


def _limit_child() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (PYTHON_MEMORY_BYTES, PYTHON_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))


def run_python_tests(code: str, tests: str, timeout_s: float) -> bool:
    """True iff ``code`` followed by ``tests`` exits 0 in an isolated subprocess within ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="rlmix_py_") as tmp:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", f"{code}\n\n{tests}\n"],
                cwd=tmp, env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=timeout_s,
                preexec_fn=_limit_child, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


def python_tests(timeout_s: float) -> RewardFn:
    def reward(completion: str, answer: Any, row: Mapping[str, Any]) -> float:
        return float(run_python_tests(strip_fence(completion), str(answer), timeout_s))

    return reward


def strip_fence(text: str) -> str:
    """The code inside the first ```python fence, or the text itself."""
    m = re.search(r"```(?:python|py)?\n(.*?)```", text, re.DOTALL)
    return m.group(1) if m else text


BUILTINS: dict[BuiltinReward, Callable[[float], RewardFn]] = {
    BuiltinReward.exact: lambda timeout_s: exact_match,
    BuiltinReward.math: lambda timeout_s: math_answer,
    BuiltinReward.python_tests: python_tests,
}


def resolve_reward(spec: str, timeout_s: float) -> RewardFn:
    """``task.reward`` -> a callable: a built-in name or ``module:function`` (ConfigError otherwise)."""
    if ":" not in spec:
        try:
            return BUILTINS[BuiltinReward(spec)](timeout_s)
        except ValueError:
            allowed = "|".join(b.value for b in BuiltinReward)
            raise ConfigError(f"task.reward={spec!r}: use a built-in ({allowed}) or module:function") from None
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # `rlmix` runs from a console script: make the user's cwd importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or anything the module raises at import
        raise ConfigError(f"task.reward={spec!r}: module {module_name!r} does not import ({type(err).__name__}: {err})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"task.reward={spec!r}: {module_name} has no callable {attr!r}")
    try:
        inspect.signature(fn).bind("completion", "answer", {})
    except TypeError:
        raise ConfigError(
            f"task.reward={spec!r}: {attr}{inspect.signature(fn)} must accept (completion, answer, row)"
        ) from None
    except ValueError:  # builtins without a signature: accept, the first-row check calls it
        pass
    return fn


def as_reward(value: object, spec: str) -> float:
    """A reward function's return value as a float; TypeError naming the offending type otherwise."""
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):  # bool, int, float, numpy scalars
        return float(value)
    raise TypeError(f"task.reward={spec!r} returned {type(value).__name__} {value!r}; it must return a finite number")
