"""An example reward function for ``task.reward=examples.arith.reward:reward``.

Full credit for the right number, a little for a number one off, nothing otherwise. Any plain
callable ``(completion, answer, row) -> float`` works; rlmix never imports anything from here.
"""

from __future__ import annotations


def reward(completion: str, answer: str, row: dict) -> float:
    try:
        got = int(completion.strip())
    except ValueError:
        return 0.0
    want = int(answer)
    if got == want:
        return 1.0
    return 0.25 if abs(got - want) == 1 else 0.0
