"""minicode: interpreter, parser, problem generation, splits and scoring."""

from __future__ import annotations

import pytest

from rlmix.errors import ConfigError
from rlmix.tasks.base import Problem, Score, Task
from rlmix.embedded.minicode import ALPHABET, MiniCode, catalog, extract_program
from rlmix.embedded.minicode_lang import ProgramSyntaxError, all_ops, parse, run, show, unparse


@pytest.mark.parametrize(
    "program, xs, expected",
    [
        ("rev", (3, 1, 2), (2, 1, 3)),
        ("sort", (3, 1, 2, 1), (1, 1, 2, 3)),
        ("even", (3, 4, 0, 7, 8), (4, 0, 8)),
        ("odd", (3, 4, 0, 7, 8), (3, 7)),
        ("add3", (1, 7, 9), (4, 0, 2)),  # mod 10
        ("take2", (5, 6, 7), (5, 6)),
        ("take4", (5, 6), (5, 6)),  # take past the end is the whole list
        ("drop1", (5, 6, 7), (6, 7)),
        ("drop3", (5, 6), ()),
        ("drop1|add3|rev", (5, 1, 2), (5, 4)),  # [1,2] -> [4,5] -> [5,4]
        ("sort|rev|take2", (4, 9, 1, 7), (9, 7)),
        ("odd|add1|sort", (9, 2, 3), (0, 4)),  # [9,3] -> [0,4] -> [0,4]
        (" rev | even ", (1, 2, 4), (4, 2)),  # whitespace around ops is allowed
    ],
)
def test_interpreter_on_hand_computed_programs(program, xs, expected):
    assert run(parse(program), xs) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty program"),
        ("rev|", "op 2 ''"),
        ("reverse", "op 1 'reverse'"),
        ("add0", "add takes 1..3"),
        ("add4", "add takes 1..3"),
        ("take5", "take takes 1..4"),
        ("add 3", "op 1 'add 3'"),
        ("rev;sort", "op 1 'rev;sort'"),
    ],
)
def test_parser_names_the_malformed_part(text, fragment):
    with pytest.raises(ProgramSyntaxError) as err:
        parse(text)
    assert fragment in str(err.value)


def test_unparse_round_trips_every_op():
    ops = all_ops()
    assert len(ops) == 4 + 3 + 4 + 3
    text = unparse(ops)
    assert parse(text) == ops
    assert show((1, 0, 9)) == "109" and show(()) == ""


def test_catalog_levels_are_minimal_and_distinct():
    cat = catalog()
    assert len(cat[1]) == 14  # every single op behaves differently
    for level in (2, 3):
        texts = {unparse(p) for p in cat[level]}
        assert all(len(p) == level for p in cat[level])
        # compositions that collapse to fewer ops never count as harder levels
        assert "rev|rev" not in texts and "add1|add2" not in texts and "sort|sort" not in texts
        assert "even|odd" not in texts  # always empty
    assert {"rev|even", "sort|rev", "sort|add1", "add1|sort"} <= {unparse(p) for p in cat[2]}


def test_sample_is_deterministic_in_seeds():
    task = MiniCode()
    a, b = task.sample(20, seed=3), task.sample(20, seed=3)
    assert a == b
    assert [p.prompt for p in task.sample(20, seed=4)] != [p.prompt for p in a]
    assert [p.prompt for p in MiniCode(seed=1).sample(20, seed=3)] != [p.prompt for p in a]
    assert {p.difficulty for p in MiniCode(levels=(2,)).sample(20, seed=0)} == {2}


def test_problems_are_consistent_and_short():
    task = MiniCode()
    problems = task.sample(300, seed=0) + task.split("test") + task.split("hard51")
    for p in problems:
        assert len(p.prompt) <= 36 and len(task.reference_answer(p)) <= 24
        assert set(p.prompt + task.reference_answer(p)) <= set(ALPHABET)
        program = parse(p.payload.program)
        assert len(program) == p.difficulty
        shown = ";".join(f"{show(xs)}>{show(run(program, xs))}" for xs, _ in p.payload.examples) + "?"
        assert p.prompt == shown  # the prompt shows the examples the hidden program computes
        assert task.score(p, task.reference_answer(p)).reward == 1.0
    assert {p.difficulty for p in task.sample(300, seed=0)} == {1, 2, 3}


def test_hard51_is_fixed_and_hard():
    hard = MiniCode(levels=(1,), seed=9).split("hard51")  # independent of the constructor
    assert len(hard) == 51
    assert [p.task_id for p in hard] == [f"minicode/hard51/{i:02d}" for i in range(51)]
    assert all(p.difficulty == 3 for p in hard)
    assert hard == MiniCode().split("hard51")
    assert len({p.prompt for p in hard}) == 51
    # pinned: a change to the generator that moves the split must be deliberate
    assert (hard[0].prompt, hard[0].payload.program) == ("95288>40;06897>51;39476>84?", "add2|add3|take2")
    assert (hard[50].prompt, hard[50].payload.program) == ("57148>84;35146>64;40078>04?", "even|take2|rev")
    test = MiniCode().split("test")
    assert len(test) == 60 and [sum(p.difficulty == lv for p in test) for lv in (1, 2, 3)] == [20, 20, 20]


def test_unknown_split_and_bad_levels_are_config_errors():
    with pytest.raises(ConfigError, match="hard51"):
        MiniCode().split("swebench")
    with pytest.raises(ConfigError, match="task.levels"):
        MiniCode(levels=(4,))


def _problem(program: str, inputs: list[tuple[int, ...]]) -> Problem:
    """A hand-made problem: first three inputs shown, the rest hidden."""
    from rlmix.embedded.minicode import MiniCodePayload

    p = parse(program)
    cases = tuple((xs, run(p, xs)) for xs in inputs)
    prompt = ";".join(f"{show(a)}>{show(b)}" for a, b in cases[:3]) + "?"
    return Problem("t/0", prompt, len(p), MiniCodePayload(program, cases[:3], cases[3:]))


def test_score_separates_format_errors_from_wrong_answers():
    task = MiniCode()
    prob = _problem("add3", [(3, 2, 1), (9, 9, 0), (4, 5, 6), (7,), (0, 1)])
    correct = ["<p>add3</p>", "<p>add1|add2</p>", "<p>add1|add1|add1</p>", "<p> add3 </p>", "<p>add3</p></s>"]
    for c in correct:
        assert task.score(prob, c) == task.score(prob, correct[0]) and task.score(prob, c).reward == 1.0, c
    for c in ["<p>add2</p>", "<p>rev</p>", "<p>add3|sort</p>"]:  # parses, wrong on the cases
        s = task.score(prob, c)
        assert s.format_ok and s.reward == 0.0, c
    malformed = ["add3", "<p>add3", "add3</p>", "<p>add3</p>x", "<p>add3</p>\n", " <p>add3</p>",
                 "<p>addd3</p>", "<p></p>", "<p>add3|</p>", "<p>add3</p><p>add3</p>", "<s><p>add3</p>"]
    for c in malformed:
        s = task.score(prob, c)
        assert not s.format_ok and s.reward == 0.0, c


def test_hidden_tests_reject_programs_that_only_fit_the_examples():
    task = MiniCode()
    # every shown input starts with two even digits, so take2 fits the examples of "even"; the
    # hidden input (1, 2, 3, 4, 6) tells them apart
    shown = [(2, 4, 1, 3, 5), (0, 8, 7, 9, 1), (6, 6, 5, 5, 3)]
    prob = _problem("even", [*shown, (1, 2, 3, 4, 6)])
    assert all(run(parse("take2"), xs) == out for xs, out in prob.payload.examples)
    assert task.score(prob, "<p>take2</p>") == Score(reward=0.0, format_ok=True)
    assert task.score(prob, "<p>even</p>").reward == 1.0


def test_extract_program_and_protocol():
    assert extract_program("<p>rev|sort</p>") == "rev|sort"
    assert extract_program("<p>rev</p>junk") is None
    protocol_methods = {"sample", "split", "score"}
    assert protocol_methods <= set(Task.__dict__) and all(callable(getattr(MiniCode(), m)) for m in protocol_methods)
    assert MiniCode.name == "minicode"
