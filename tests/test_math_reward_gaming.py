"""Known ways to game the ``math`` and ``exact`` rewards: each hack scores 0, its honest twin 1."""

from __future__ import annotations

import json

import pytest

from rlmix.config.dataset import DatasetTaskConfig
from rlmix.errors import ConfigError
from rlmix.tasks.rewards import math_answer

HUGE_EXPONENT = "1e" + "0" * 5000 + "1"


@pytest.mark.parametrize(("completion", "answer"), [
    ("\u22125", "5"), ("\\boxed{\u22125}", "5"), ("\u20135", "5"), ("x = - 5", "5"), ("\\boxed{- 5}", "5"),
    ("The answer is - 5", "5"),
])
def test_a_minus_sign_however_written_is_read(completion, answer):
    assert math_answer(completion, answer, {}) == 0.0
    assert math_answer(completion, "-" + answer, {}) == 1.0


@pytest.mark.parametrize(("completion", "answer"), [
    ("-5", "-5"), ("\\boxed{-5}", "-5"), ("x = -5", "-5"), ("x - 5", "5"), ("3-5", "5"),  # a subtraction
])
def test_a_minus_is_a_sign_only_where_it_is_no_subtraction(completion, answer):
    assert math_answer(completion, answer, {}) == 1.0


@pytest.mark.parametrize("completion", ["2\\frac{1}{2}", "\\boxed{2\\frac{1}{2}}", "x = 2 \\frac12"])
def test_a_whole_number_before_a_fraction_is_a_mixed_number(completion):
    assert math_answer(completion, "10.5", {}) == 0.0  # 21/2: its digits glued
    assert math_answer(completion, "2.5", {}) == 1.0
    assert math_answer(completion.replace("2", "-2", 1), "-2.5", {}) == 1.0


@pytest.mark.parametrize(("completion", "answer"), [
    ("\\boxed{\\frac{1}{-4}}", "-4"), ("\\boxed{\\frac{1}{2.5}}", "0.5"), ("\\boxed{2*3}", "3"),
    ("\\boxed{5!}", "5"), ("\\boxed{5-3}", "-3"), ("\\boxed{3-5}", "-5"), ("\\boxed{1 or 2}", "2"),
    ("\\boxed{1 or 2}", "1"), ("\\boxed{1 or x = 2}", "2"), ("\\boxed{x = 1, y = 2}", "2"),
])
def test_a_box_holding_anything_but_one_number_is_no_number(completion, answer):
    assert math_answer(completion, answer, {}) == 0.0


@pytest.mark.parametrize(("completion", "answer"), [
    ("\\boxed{\\frac{1}{-4}}", "-0.25"), ("\\boxed{\\frac{1}{2.5}}", "0.4"), ("\\boxed{6}", "6"),
    ("\\boxed{x_1 = 5}", "5"), ("\\boxed{f(x) = 5}", "5"), ("\\boxed{50\\%}", "50"), ("\\boxed{5 \\text{ cm}}", "5"),
    ("\\boxed{90^\\circ}", "90"), ("\\boxed{10}", "10"),
])
def test_a_box_holding_one_number_scores(completion, answer):
    assert math_answer(completion, answer, {}) == 1.0


@pytest.mark.parametrize(("completion", "wrong", "right"), [
    ("x = \\frac14", "14", "0.25"), ("x = \\cfrac{1}{4}", "4", "0.25"), ("x = \\frac {1}{4}", "4", "0.25"),
    ("x=\\frac{1}{-4}", "-4", "-0.25"), ("\\frac{-1}{4}", "4", "-0.25"), ("\\tfrac{1}{4}", "4", "1/4"),
])
def test_a_fraction_is_read_whole_however_written(completion, wrong, right):
    assert math_answer(completion, wrong, {}) == 0.0
    assert math_answer(completion, right, {}) == 1.0


def test_a_fraction_left_unread_is_no_number_rather_than_its_last_digits():
    assert math_answer("x = \\frac{\\pi}{2}", "2", {}) == 0.0
    assert math_answer("x = \\frac{1}{0}", "0", {}) == 0.0
    assert math_answer("\\frac{\\pi}{2} rounds to 1.57", "1.57", {}) == 1.0


@pytest.mark.parametrize(("completion", "answer"), [
    ("\\boxed{0,5}", "5"), ("\\boxed{1,2}", "12"), ("candidates: 1,2,3", "123"), ("1,2345", "12345"),
])
def test_a_comma_outside_groups_of_three_separates_numbers(completion, answer):
    assert math_answer(completion, answer, {}) == 0.0


@pytest.mark.parametrize(("completion", "answer"), [
    ("1,234", "1234"), ("1,234,567", "1234567"), ("The answer is 1,234, then", "1234"), ("1\\,234", "1234"),
    ("\\boxed{1\\,234\\,567}", "1234567"), ("\\boxed{1{,}234}", "1234"),
])
def test_thousands_in_groups_of_three_are_one_number(completion, answer):
    assert math_answer(completion, answer, {}) == 1.0


@pytest.mark.parametrize(("completion", "answer"), [("\\boxed{1\\ 2}", "12"), ("3\\;4", "34"), ("1\\,2", "12")])
def test_latex_spacing_outside_a_thousands_group_is_a_space(completion, answer):
    assert math_answer(completion, answer, {}) == 0.0


@pytest.mark.parametrize(("completion", "answer"), [
    ("x = 2^{10}", "10"), ("2^10", "10"), ("\\sqrt{2}", "2"), ("3 \\times 10^{5}", "5"), ("10^{-3}", "-3"),
    ("3:4", "4"), ("1.2.3", "0.3"), ("1.2.3", "2.3"), ("\\sqrt[3]{8}", "8"),
])
def test_an_exponent_root_ratio_or_dotted_run_is_no_answer(completion, answer):
    assert math_answer(completion, answer, {}) == 0.0


def test_a_number_after_an_exponent_is_read():
    assert math_answer("The answer is 2^{10} = 1024", "1024", {}) == 1.0
    assert math_answer("\\sqrt{16} = 4", "4", {}) == 1.0


def test_a_box_while_thinking_is_no_answer():
    assert math_answer("<think>\\boxed{7}</think> The answer is 8", "7", {}) == 0.0
    assert math_answer("<think>\\boxed{7}</think> The answer is 8", "8", {}) == 1.0
    assert math_answer("<think>maybe 3</think> \\boxed{7}", "7", {}) == 1.0
    assert math_answer("plan \\boxed{7}</think> so 8", "7", {}) == 0.0  # the prompt opened the block
    assert math_answer("so 8 <think>\\boxed{7}", "7", {}) == 0.0  # a block never closed runs to the end


def test_a_huge_exponent_written_with_many_digits_scores_zero():
    assert math_answer(HUGE_EXPONENT, "1", {}) == 0.0
    assert math_answer("1", HUGE_EXPONENT, {}) == 0.0


def test_honest_answers_still_score():
    assert math_answer("\u22125", "-5", {}) == 1.0
    assert math_answer("\\frac{1}{4}", "0.25", {}) == 1.0
    assert math_answer("50%", "50", {}) == 1.0 and math_answer("50%", "0.5", {}) == 0.0
    assert math_answer("\u0665", "5", {}) == 1.0 and math_answer("\uff15", "5", {}) == 1.0
    assert math_answer("\\boxed{1} \\boxed{2}", "2", {}) == 1.0  # the last box


@pytest.mark.parametrize("reward", ["exact", "math"])
@pytest.mark.parametrize("answer", ["", "   "])
def test_a_blank_answer_is_refused_at_load(tmp_path, reward, answer):
    from rlmix.tasks.dataset import DatasetTask

    rows = [{"prompt": "a?", "answer": "1"}, {"prompt": "b?", "answer": answer}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ConfigError, match=r"^\S*d.jsonl: line 2: the answer is empty \(task.answer_key='answer'"):
        DatasetTask(DatasetTaskConfig(train_files=str(path), reward=reward))
    rows[1]["answer"] = "2"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert len(DatasetTask(DatasetTaskConfig(train_files=str(path), reward=reward)).split("train")) == 2
