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
- ``math``: the last number in the completion (``\\boxed{}`` content preferred, and then it must be one
  number; integers, decimals, fractions ``a/b`` and ``\\frac``, mixed numbers, thousands separators in
  groups of three, exponents ``1e-07``; ``<think>`` blocks skipped) equals the answer's number
  (``math_answer``): exactly for an integer or fraction answer, to the places it shows for a decimal one.
- ``python_tests``: the completion (its first fenced block, if any) is Python source; ``answer`` is
  test code (asserts). Graded in a bubblewrap sandbox (``rlmix.tasks.python_tests``: no network, a
  read-only system, its own PID namespace, time, memory, process and output limits) by a harness
  whose verdict, not an exit code, decides: 1.0 iff every assert ran and held, or with
  ``task.partial_credit=true`` the fraction of assert statements that held. Known reward hacks score
  0 and are counted in ``reward/exploit_suspected``; docs/tasks.md says what this protects against
  and what it does not.

Built-ins are objects with ``grade(completion, answer, row) -> Graded`` (the reward and whether an
exploit is suspected); a user function is wrapped in one. Each is also callable with the plain signature.
"""

from __future__ import annotations

import enum
import importlib
import importlib.machinery
import inspect
import math
import numbers
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rlmix.errors import ConfigError
from rlmix.tasks.python_tests import PythonTests

RewardFn = Callable[[str, Any, Mapping[str, Any]], float]

# A number: a sign only where it is no subtraction (x-5, 3-5), a fraction a/b, thousands in groups of
# three (1,234,567; 0,5 and 1,2 are two numbers), decimals, and an exponent (1e-07, 2.5E3, -1e+2).
_NUMBER = (r"(?:(?<![\w)\]}!%.])-)?(?<![\d.])(?:\d+/\d+(?![\d/]|\.\d)"
           r"|(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
# What stands where a number cannot be read: an exponent, a root, a ratio, a dotted run, an unread \frac.
_MARK = "\ue000"
_ITEM = re.compile(f"{_MARK}|{_NUMBER}")
_DASHES = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2012": "-", "\ufe63": "-", "\uff0d": "-"})
# A spaced minus is a sign at the start, after = ( { [ , ; : $, or after a word (is - 5), not after x or 3.
_SPACED_SIGN = re.compile(r"(^|[=({\[,;:$]|(?<![\\A-Za-z])[A-Za-z]{2,})\s*-\s+(?=\.?\d|\\frac)")
# \frac{a}{b} (\frac14, signed or decimal parts), after an optional sign and a whole number (2\frac{1}{2})
_FRAC = re.compile(r"(?:(?<![\w)\]}!%.])(?P<sign>-))?(?:(?<![\d.,])(?P<whole>\d+)\s*)?\\frac\s*"
                   r"(?:\{\s*(?P<num>-?[\d.]+)\s*\}|(?P<num1>\d))\s*(?:\{\s*(?P<den>-?[\d.]+)\s*\}|(?P<den1>\d))")
# LaTeX's thousands separators (1{,}000, 1,\!000, 1\,000) where a group of three follows; elsewhere a space
_LATEX_GAPS = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\[!,;: ])(?=\d{3}(?!\d))")
_NOT_READ = re.compile(r"\^\s*(?:\{[^{}]*\}|-?\d+(?:\.\d+)?)"  # 2^{10}, 2^10, 10^{-3}
                       r"|\\sqrt\s*(?:\[[^\]]*\])?\s*(?:\{[^{}]*\}|\d+)"  # \sqrt{2}, \sqrt[3]{8}
                       r"|(?<![\d.])\d+(?:\.\d+)?:\d+(?:\.\d+)?|(?<![\d.])\d+(?:\.\d+){2,}")  # 3:4, 1.2.3
_DEGREES = re.compile(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ)")
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
# A box holds one number: after a name and = (x = 5), with a unit after it (\%, \text{cm}) at most.
_BOX_NUMBER = re.compile(rf"\s*(?:[A-Za-z]\w*(?:_\{{?\w+\}}?)?(?:\([^()=]*\))?\s*=\s*)?\\?\$?\s*({_NUMBER})\s*"
                         r"(?:\\?%|\\(?:text|mathrm|mbox)\s*\{\s*[^\W\d_]+\s*\})?\s*\.?\s*")

class BuiltinReward(enum.Enum):
    exact = "exact"
    math = "math"
    python_tests = "python_tests"


def exact_match(completion: str, answer: Any, row: Mapping[str, Any]) -> float:
    return float(completion.strip() == str(answer).strip())


def boxed(text: str) -> str | None:
    """What the last ``\\boxed{...}`` of ``text`` holds, braces inside it included; None without one."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i]
    return None  # never closed


def _read_frac(match: re.Match) -> str:
    """One ``\\frac`` (with its sign and whole part) as `` p/q ``, or the mark where it is no number."""
    num, den = match["num"] or match["num1"], match["den"] or match["den1"]
    try:
        value = Fraction(num) / Fraction(den)
    except (ValueError, ZeroDivisionError):
        return _MARK
    if match["whole"] is not None:
        if "-" in num + den or "." in num + den:  # 2\frac{-1}{2} is no mixed number
            return _MARK
        value += int(match["whole"])
    value = -value if match["sign"] else value
    return f" {value.numerator}/{value.denominator} " if value.denominator != 1 else f" {value.numerator} "


def _unread_frac(text: str) -> str:
    """Each ``\\frac`` left unread (``\\frac{\\pi}{2}``) as the mark, its two arguments with it."""
    parts, end = [], 0
    while (start := text.find("\\frac", end)) >= 0:
        parts.append(text[end:start] + _MARK)
        end = start + len("\\frac")
        for _ in range(2):  # an argument: a group in braces, or one character
            while end < len(text) and text[end].isspace():
                end += 1
            depth = 0
            while end < len(text):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                end += 1
                if depth <= 0:
                    break
    return "".join(parts) + text[end:]


def _normalise(text: str) -> str:
    """``text`` with its signs, fractions and thousands separators read, and the mark for each place
    a number stands that is no answer (an exponent, a root, a ratio, a dotted run, an unread fraction)."""
    text = re.sub(r"\\[dtc]frac", r"\\frac", text.translate(_DASHES))
    text = _LATEX_GAPS.sub(",", re.sub(r"\{,\}|,\\!", ",", text))
    text = re.sub(r"\\[!,;: ]", " ", text)
    text = _SPACED_SIGN.sub(lambda m: f"{m[1]} -" if m[1][:1].isalpha() else f"{m[1]}-", text)
    text = _unread_frac(_FRAC.sub(_read_frac, text))
    return _NOT_READ.sub(_MARK, _DEGREES.sub("", text))


def visible(text: str) -> str:
    """``text`` without its reasoning: what follows the last ``</think>``, less any ``<think>`` block
    (one never closed runs to the end). A box while thinking is no answer."""
    return _THINK.sub(" ", text.rpartition("</think>")[2])


def number_token(text: str) -> str | None:
    """The number ``text`` answers with, as written (thousands separators dropped), or None: the
    content of its last ``\\boxed{}`` when it has one, else its last number. ``\\frac{a}{b}`` reads
    as a/b, ``2\\frac{1}{2}`` as 5/2. A box holding anything but one number (``\\sqrt{2}``, ``2^{10}``,
    ``5!``, ``1 or 2``, ``1,2``) is no number: reading the last digits of it would score
    ``\\boxed{\\frac{1}{4}}`` right for the answer 4. Outside a box, a last number that is an
    exponent, a root's argument, part of a ratio (3:4) or of a dotted run (1.2.3), or sits in a
    fraction that is not read, is no number either."""
    text = visible(text)
    inside = boxed(text)
    if inside is not None:
        found = _BOX_NUMBER.fullmatch(_normalise(inside))
        token = found[1] if found else None
    else:
        items = _ITEM.findall(_normalise(text))
        token = items[-1] if items and items[-1] != _MARK else None
    return token.replace(",", "") if token else None


# The largest exponent read: 1e10000000 as an exact number takes seconds to build, 1e100000000 minutes.
MAX_EXPONENT = 1000


def parse_number(text: str) -> Fraction | None:
    """``number_token(text)`` as an exact number, or None (also for an exponent beyond ±``MAX_EXPONENT``)."""
    token = number_token(text)
    if token is None:
        return None
    exponent = token.lower().partition("e")[2].lstrip("+-").lstrip("0")
    if len(exponent) > 4 or int(exponent or 0) > MAX_EXPONENT:  # int() refuses over 4300 digits
        return None
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(completion: str, answer: Any, row: Mapping[str, Any]) -> float:
    """1.0 iff the completion's number is the answer's. Both are read exactly (``parse_number``), so an
    integer or fraction answer takes only its own value: a relative tolerance let 1000001 pass for
    1000000, slack a policy under RL finds. A decimal answer stands for its value rounded to the places
    it shows, so a number within half a unit of its last place passes (3.14 takes 3.1416 and 22/7, not
    3.15 or 3.1); an exact answer is not rounded (1/3 takes neither 0.333 nor 0.3333333). An exponent
    moves the places its mantissa shows (``shown_places``)."""
    got, want, token = parse_number(completion), parse_number(str(answer)), number_token(str(answer))
    if got is None or want is None:
        return 0.0
    places = shown_places(token)
    if places is None:  # an integer or a fraction
        return float(got == want)
    return float(2 * abs(got - want) * Fraction(10) ** places <= 1)


def shown_places(token: str) -> int | None:
    """The decimal places a number as written shows, None for an exact one. An exponent keeps its
    mantissa's rule and moves the places: ``1.50e-3`` shows 5 (down to 1e-5), ``2.5E3`` -2 (the
    hundreds), and ``1e-07``, with an integer mantissa, is exact, as ``7`` is."""
    mantissa, _, exponent = token.lower().partition("e")
    if "." not in mantissa:
        return None
    return len(mantissa.partition(".")[2]) - int(exponent or 0)


@dataclass(frozen=True)
class Graded:
    reward: float
    exploit_suspected: bool = False  # the grader caught a known reward hack (reward 0)


class FunctionReward:
    """A plain ``(completion, answer, row) -> number`` function as a grader."""

    def __init__(self, fn: RewardFn, spec: str):
        self.fn, self.spec = fn, spec

    def __call__(self, completion: str, answer: Any, row: Mapping[str, Any]) -> Any:
        return self.fn(completion, answer, row)

    def grade(self, completion: str, answer: Any, row: Mapping[str, Any]) -> Graded:
        return Graded(as_reward(self.fn(completion, answer, row), self.spec))


class PythonTestsReward(PythonTests):
    def grade(self, completion: str, answer: Any, row: Mapping[str, Any]) -> Graded:
        run = self.run(completion, answer)
        return Graded(run.reward(self.partial_credit), run.exploit_suspected)


BUILTINS: dict[BuiltinReward, Callable[[float, bool], Any]] = {
    BuiltinReward.exact: lambda timeout_s, partial: FunctionReward(exact_match, "exact"),
    BuiltinReward.math: lambda timeout_s, partial: FunctionReward(math_answer, "math"),
    BuiltinReward.python_tests: PythonTestsReward,
}


def resolve_reward(spec: str, timeout_s: float, partial_credit: bool = False) -> FunctionReward | PythonTestsReward:
    """``task.reward`` -> a grader: a built-in name or ``module:function`` (ConfigError otherwise)."""
    if partial_credit and spec != BuiltinReward.python_tests.value:
        raise ConfigError(f"task.partial_credit=true: only task.reward=python_tests gives partial credit "
                          f"(task.reward={spec!r}); set task.partial_credit=false")
    if ":" not in spec:
        try:
            kind = BuiltinReward(spec)
        except ValueError:
            allowed = "|".join(b.value for b in BuiltinReward)
            raise ConfigError(f"task.reward={spec!r}: use a built-in ({allowed}) or module:function") from None
        return BUILTINS[kind](timeout_s, partial_credit)
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # `rlmix` runs from a console script: make the user's cwd importable
        sys.path.insert(0, os.getcwd())
    try:
        module = import_as_on_disk(module_name)
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
    return FunctionReward(fn, spec)


# User modules this process imported for a reward: top-level name -> (file, mtime_ns) at import.
_USER_MODULES: dict[str, tuple[str | None, int | None]] = {}


def _on_disk(top: str) -> tuple[str | None, int | None]:
    """Where ``import top`` would load from now (a module file or a package's ``__init__``), and its mtime."""
    spec = importlib.machinery.PathFinder.find_spec(top)
    origin = spec.origin if spec is not None and spec.has_location else None
    try:
        return origin, (os.stat(origin).st_mtime_ns if origin else None)
    except OSError:
        return origin, None


def import_as_on_disk(module_name: str):
    """``import_module``, except that a user module this process imported before is imported again
    when the directory it would come from, or its file, has changed since.

    A sampler process outlives its command in a held session: the next command may be launched
    from another directory with a reward module of the same name, or after the user edited theirs.
    Python's module cache would hand back the old function and score every rollout with it, with no
    warning. Only modules first imported here are tracked, so the standard library and installed
    packages are never re-imported."""
    top = module_name.partition(".")[0]
    if top in _USER_MODULES and _USER_MODULES[top] != _on_disk(top):
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]
        del _USER_MODULES[top]
    first = top not in sys.modules
    if first:
        importlib.invalidate_caches()  # a file written since the last import must be seen
    module = importlib.import_module(module_name)
    if first:
        _USER_MODULES[top] = _on_disk(top)
    return module


def _is_number(value: object) -> bool:
    """bool, int, float, and numpy's numeric scalars: its bool (``np.isclose``'s answer) is no numbers.Real."""
    if isinstance(value, numbers.Real):
        return True
    dtype = getattr(value, "dtype", None)
    return type(value).__module__ == "numpy" and getattr(value, "shape", None) == () and dtype is not None \
        and dtype.kind in "biuf"


def as_reward(value: object, spec: str) -> float:
    """A reward function's return value as a float; TypeError naming the offending type otherwise."""
    if _is_number(value) and math.isfinite(float(value)):
        return float(value)
    raise TypeError(f"task.reward={spec!r} returned {type(value).__name__} {value!r}; it must return a finite number")
