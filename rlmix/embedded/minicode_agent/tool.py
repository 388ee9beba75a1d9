#!/usr/bin/env python3
"""``mc PROGRAM [INPUT ...]``: the minicode interpreter the agent calls inside its sandbox.

Standalone on purpose (standard library only): it is copied into each task's repository as ``mc``
and into its hidden tests as ``mc.py``, where nothing of rlmix can be imported. The language is
``rlmix.embedded.minicode_lang``'s; a test checks the two agree on every program of up to two ops.

Without inputs it runs PROGRAM on the shown examples (file ``examples``, lines ``IN>OUT``) and
prints one line per example, the output and whether it matches: ``43215 ok`` / ``43215 no``.
With inputs it prints the output for each. A malformed program prints ``error: ...``, exit 1.
"""

import re
import sys

_OP = re.compile(r"^(rev|sort|even|odd)$|^(add|take|drop)([0-9])$")
_ARGS = {"add": range(1, 4), "take": range(1, 5), "drop": range(1, 4)}


def parse(text):
    """A list of (name, arg) ops, or raise ValueError naming the bad part."""
    if not text.strip():
        raise ValueError("empty program")
    ops = []
    for part in text.split("|"):
        m = _OP.match(part.strip())
        if m is None:
            raise ValueError(f"unknown op {part.strip()!r}")
        if m.group(1):
            ops.append((m.group(1), 0))
        elif int(m.group(3)) in _ARGS[m.group(2)]:
            ops.append((m.group(2), int(m.group(3))))
        else:
            raise ValueError(f"bad argument in {part.strip()!r}")
    return ops


def apply(op, xs):
    name, k = op
    if name == "rev":
        return xs[::-1]
    if name == "sort":
        return sorted(xs)
    if name in ("even", "odd"):
        return [x for x in xs if x % 2 == (name == "odd")]
    if name == "add":
        return [(x + k) % 10 for x in xs]
    return xs[:k] if name == "take" else xs[k:]


def run(ops, text):
    """The output list (as digits text) of running ``ops`` on the digits text ``text``."""
    xs = [int(c) for c in text]
    for op in ops:
        xs = apply(op, xs)
    return "".join(map(str, xs))


def main(argv):
    if not argv:
        print("usage: mc PROGRAM [INPUT ...]")
        return 2
    try:
        ops = parse(argv[0])
    except ValueError as e:
        print(f"error: {e}")
        return 1
    if len(argv) > 1:
        bad = [a for a in argv[1:] if not a.isdigit()]
        if bad:
            print(f"error: input {bad[0]!r} is not digits")
            return 1
        print("\n".join(run(ops, a) for a in argv[1:]))
        return 0
    with open("examples") as f:
        cases = [line.strip().split(">") for line in f if line.strip()]
    for inp, out in cases:
        got = run(ops, inp)
        print(f"{got} {'ok' if got == out else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
