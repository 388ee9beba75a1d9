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


@pytest.mark.parametrize(("completion", "answer", "reward"), [
    ("1e-07", "1e-07", 1.0),  # read as 1 and -07 (-7) before
    ("0.0000001", "1e-07", 1.0),
    ("\\boxed{1e-7}", "0.0000001", 1.0),
    ("-7", "1e-07", 0.0),
    ("1.05e-7", "1e-07", 0.0),  # an integer mantissa is exact, as an integer is
    ("2.5E3", "2500", 1.0),
    ("2500", "2.5E3", 1.0),
    ("2540", "2.5E3", 1.0),  # 2.5E3 shows the hundreds
    ("2560", "2.5E3", 0.0),
    ("3", "2.5E3", 0.0),
    ("-100", "-1e+2", 1.0),
    ("-1e+2", "-100", 1.0),
    ("100", "-1e+2", 0.0),
    ("0.001504", "1.50e-3", 1.0),  # 1.50e-3 shows places down to 1e-5
    ("0.001506", "1.50e-3", 0.0),
    (".5e1", "5", 1.0),
    ("1.5e-6", 1.5e-06, 1.0),  # a JSON float's str() writes small and large numbers with an exponent
    ("0.00001", 1e-05, 1.0),
    ("-5", 1e-05, 0.0),
    ("10000000000000000", 1e16, 1.0),
    ("16", 1e16, 0.0),
])
def test_an_exponent_is_part_of_the_number_and_moves_the_places_shown(completion, answer, reward):
    assert math_answer(completion, answer, {}) == reward


def test_a_huge_exponent_is_no_number_rather_than_minutes_of_arithmetic():
    assert math_answer("1e100000000", "1", {}) == 0.0
    assert math_answer("1", "1e100000000", {}) == 0.0
    assert math_answer("1e300", "1e300", {}) == 1.0
