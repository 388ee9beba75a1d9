"""The built-in ``math`` reward: exact answers match exactly, a decimal answer to the places it shows."""

from __future__ import annotations

import pytest

from rlmix.tasks.rewards import math_answer


@pytest.mark.parametrize(("completion", "answer", "reward"), [
    ("1000001", "1000000", 0.0),  # a relative tolerance of 1e-6 took these
    ("\\boxed{2000001}", "2000000", 0.0),
    ("1,000,001", "1000000", 0.0),
    ("123456789", "123456788", 0.0),
    ("\\boxed{1000000}", "1000000", 1.0),
    ("1,000,000", "1000000", 1.0),
    ("0.0000001", "0", 0.0),
    ("0.333", "1/3", 0.0),  # an exact answer is not rounded
    ("0.3333333", "1/3", 0.0),
    ("\\frac{2}{6}", "1/3", 1.0),
    ("0.5", "1/2", 1.0),
    ("7.0", "7", 1.0),
    ("3.1416", "3.14", 1.0),  # a decimal answer stands for its rounded value
    ("22/7", "3.14", 1.0),
    ("1/3", "0.333", 1.0),
    ("3.15", "3.14", 0.0),
    ("3.1", "3.14", 0.0),  # less precise than the answer
    ("1000000.54", "1000000.5", 1.0),
    ("1000001.5", "1000000.5", 0.0),
    ("2.5", "2.50", 1.0),
])
def test_math_answers_match_exactly_or_to_the_answers_places(completion, answer, reward):
    assert math_answer(completion, answer, {}) == reward


def test_a_json_number_answer_is_read_as_written():
    assert math_answer("1/3", 1 / 3, {}) == 1.0  # str(1/3) shows 16 places
    assert math_answer("1000001", 1000000, {}) == 0.0
