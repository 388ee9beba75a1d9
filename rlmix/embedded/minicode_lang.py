"""The minicode language: a tiny list-processing language over lists of digits 0-9.

A program is one or more ops separated by ``|`` and applied left to right::

    rev          reverse the list
    sort         sort ascending
    even         keep the even digits          odd    keep the odd digits
    addK         x -> (x + K) mod 10, K=1..3   (values stay single digits)
    takeK        keep the first K, K=1..4      dropK  remove the first K, K=1..3

Example: ``drop1|add3|rev`` maps ``[5,1,2]`` to ``[5,4]``. Whitespace around an op is ignored;
anything else that is not an op is a :class:`ProgramSyntaxError` naming the offending part.
Lists are written compactly, one character per digit (``512`` is ``[5,1,2]``; the empty list is
the empty string), which keeps prompts short for a character-level model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import product

Digits = tuple[int, ...]

ARG_RANGES: dict[str, range] = {"add": range(1, 4), "take": range(1, 5), "drop": range(1, 4)}
PLAIN_OPS: tuple[str, ...] = ("rev", "sort", "even", "odd")
_OP_RE = re.compile(r"^(rev|sort|even|odd)$|^(add|take|drop)([0-9])$")
_ALLOWED = "rev, sort, even, odd, add1..add3, take1..take4, drop1..drop3"


class ProgramSyntaxError(ValueError):
    """The program text is not a minicode program; the message says which part and why."""


@dataclass(frozen=True)
class Op:
    name: str
    arg: int = 0

    def __str__(self) -> str:
        return self.name if self.name in PLAIN_OPS else f"{self.name}{self.arg}"

    def apply(self, xs: Digits) -> Digits:
        if self.name == "rev":
            return xs[::-1]
        if self.name == "sort":
            return tuple(sorted(xs))
        if self.name == "even":
            return tuple(x for x in xs if x % 2 == 0)
        if self.name == "odd":
            return tuple(x for x in xs if x % 2 == 1)
        if self.name == "add":
            return tuple((x + self.arg) % 10 for x in xs)
        if self.name == "take":
            return xs[: self.arg]
        if self.name == "drop":
            return xs[self.arg :]
        raise AssertionError(f"unreachable: op {self.name}")


Program = tuple[Op, ...]


def all_ops() -> tuple[Op, ...]:
    """Every op of the language, in a fixed order (plain ops first, then by name and argument)."""
    ops = [Op(name) for name in PLAIN_OPS]
    ops += [Op(name, k) for name, args in ARG_RANGES.items() for k in args]
    return tuple(ops)


def all_programs(length: int) -> list[Program]:
    """Every program of exactly ``length`` ops, in lexicographic order of op indices."""
    return [tuple(p) for p in product(all_ops(), repeat=length)]


def parse(text: str) -> Program:
    """Parse program text such as ``"sort|add2"``; raise ProgramSyntaxError if it is malformed."""
    if not text.strip():
        raise ProgramSyntaxError("empty program: expected ops separated by '|'")
    ops = []
    for i, part in enumerate(text.split("|"), start=1):
        m = _OP_RE.match(part.strip())
        if m is None:
            raise ProgramSyntaxError(f"op {i} {part.strip()!r} is not one of: {_ALLOWED}")
        if m.group(1):
            ops.append(Op(m.group(1)))
            continue
        name, arg = m.group(2), int(m.group(3))
        if arg not in ARG_RANGES[name]:
            lo, hi = ARG_RANGES[name][0], ARG_RANGES[name][-1]
            raise ProgramSyntaxError(f"op {i} {part.strip()!r}: {name} takes {lo}..{hi}")
        ops.append(Op(name, arg))
    return tuple(ops)


def run(program: Program, xs: Digits) -> Digits:
    """Apply the ops left to right."""
    for op in program:
        xs = op.apply(xs)
    return xs


def unparse(program: Program) -> str:
    return "|".join(str(op) for op in program)


def show(xs: Digits) -> str:
    """The compact list notation used in prompts: one character per digit."""
    return "".join(str(x) for x in xs)
