"""minicode with worked answers: the trace's format rule, its reference traces, and the budget check."""

from __future__ import annotations

import pytest

from rlmix.config.schema import MiniCodeTraceTaskConfig
from rlmix.embedded.chartok import build_char_tokenizer
from rlmix.embedded.minicode import ALPHABET, MiniCode
from rlmix.embedded.minicode_lang import parse, run, show
from rlmix.embedded.minicode_trace import MiniCodeTrace, check_trace
from rlmix.errors import ConfigError

TASK = MiniCodeTrace(seed=0)
TEST = TASK.split("test")


def _problem(level: int):
    return next(p for p in TEST if p.difficulty == level)


def test_same_problems_as_minicode():
    assert [p.prompt for p in TEST] == [p.prompt for p in MiniCode().split("test")]
    assert [p.prompt for p in TASK.sample(4, 1)] == [p.prompt for p in MiniCode().sample(4, 1)]


@pytest.mark.parametrize("problem", TEST, ids=lambda p: p.task_id)
def test_every_reference_trace_is_well_formed_correct_and_stops_at_the_first_match(problem):
    answer = TASK.reference_answer(problem)
    assert TASK.score(problem, answer).reward == 1.0 and TASK.score(problem, answer + "</s>").reward == 1.0
    assert set(answer) <= set(ALPHABET)  # the embedded character vocabulary holds it
    first_in, first_out = problem.payload.examples[0]
    tries = answer[len("<t>"):answer.index("</t>")].split(";")
    outputs = [t.split(">")[1] for t in tries]
    assert outputs.index(show(first_out)) == len(tries) - 1  # no earlier try matched the first example
    assert len(set(tries)) == len(tries)


def test_reference_traces_are_long_and_vary_in_their_free_part():
    lengths = [len(TASK.reference_answer(p)) for p in TEST]
    assert 100 <= sorted(lengths)[len(lengths) // 2] <= 300
    # the search order is the free part: problems of one level do not share a trace prefix
    firsts = {TASK.reference_answer(p).split(";")[0] for p in TEST if p.difficulty == 2}
    assert len(firsts) > 5
    assert TASK.reference_answer(TEST[0]) == MiniCodeTrace(seed=7).reference_answer(TEST[0])  # by problem id


def test_tries_bound_the_reference_length():
    short = MiniCodeTrace(tries=(0, 0))
    problem = _problem(2)
    assert short.reference_answer(problem).count(";") == 0
    assert MiniCodeTrace(tries=(3, 3)).reference_answer(problem).count(";") == 3
    with pytest.raises(ConfigError, match=r"task.trace_tries=\[5, 2\]"):
        MiniCodeTrace(tries=(5, 2))


def test_format_rule_separates_format_errors_from_wrong_answers():
    problem = _problem(1)
    first_in = problem.payload.examples[0][0]
    program = problem.payload.program
    wrong = "sort" if program != "sort" else "rev"
    right_out, wrong_out = show(run(parse(program), first_in)), show(run(parse(wrong), first_in))
    ok = f"<t>{wrong}>{wrong_out};{program}>{right_out}</t><p>{program}</p>"
    assert TASK.score(problem, ok).reward == 1.0
    # a well-formed trace that answers a wrong program: a wrong answer, not a format error
    stopped_early = f"<t>{wrong}>{wrong_out}</t><p>{wrong}</p>"
    assert (TASK.score(problem, stopped_early).reward, TASK.score(problem, stopped_early).format_ok) == (0.0, True)
    slip = str((int(wrong_out[0]) + 1) % 10) + wrong_out[1:] if wrong_out else "0"
    broken = {
        "arithmetic slip": f"<t>{wrong}>{slip};{program}>{right_out}</t><p>{program}</p>",
        "answer is not the last try": f"<t>{program}>{right_out};{wrong}>{wrong_out}</t><p>{program}</p>",
        "no trace": f"<p>{program}</p>",
        "empty trace": f"<t></t><p>{program}</p>",
        "unknown op": f"<t>flip>{right_out};{program}>{right_out}</t><p>{program}</p>",
        "text after the answer": ok + "x",
        "missing output": f"<t>{program}</t><p>{program}</p>",
    }
    for why, completion in broken.items():
        score = TASK.score(problem, completion)
        assert (score.reward, score.format_ok) == (0.0, False), why
    assert check_trace(ok, first_in) == program


def test_a_budget_that_would_cut_a_reference_trace_is_refused_with_the_number_needed():
    from rlmix.assembly.task_kinds import task_kind

    tokenizer = build_char_tokenizer(ALPHABET)
    task = task_kind(MiniCodeTraceTaskConfig())
    longest = max(len(TASK.reference_answer(p)) for p in TEST) + 1
    with pytest.raises(ConfigError, match=rf"loop.max_new_tokens=24: .* takes {longest} tokens.*>={longest}"):
        task.build(0, tokenizer, 24)
    assert task.build(0, tokenizer, longest).name == "minicode_trace"
    with pytest.raises(ConfigError, match="eval.max_new_tokens"):
        task.build(0, tokenizer, longest - 1, key="eval.max_new_tokens")


def test_the_option_composes_and_builds_the_trace_task():
    from rlmix.assembly.parts import make_task
    from rlmix.commands.compose import compose_run_config

    cfg = compose_run_config(["task=minicode_trace", "task.trace_tries=[2,4]", "model=embedded_v2",
                              "model.embedded_v2.answer=trace"])
    task = make_task(cfg.task, 0)
    assert isinstance(task, MiniCodeTrace) and task.tries == (2, 4)


@pytest.mark.parametrize(("overrides", "message"), [
    (["task=minicode_trace"], r"task=minicode_trace: the embedded model \(model.embedded_version=v1\) was warm-started "
                              r"to answer with the program alone; give a model.path that writes traces"),
    (["task=minicode_trace", "model=embedded_v2"], r"model.embedded_version=v2\) was warm-started"),
    (["model=embedded_v2", "model.embedded_v2.answer=trace"],
     r"model.embedded_v2.answer=trace: the model answers with a worked trace; use task=minicode_trace"),
])
def test_the_embedded_model_and_the_task_must_ask_for_the_same_answer_form(overrides, message):
    from rlmix.commands.compose import compose_run_config

    with pytest.raises(ConfigError, match=message):
        compose_run_config(overrides)


def test_the_trace_model_is_warm_started_on_traces_with_room_for_them():
    from rlmix.config.embedded import EmbeddedMoeSpec, MiniCodeAnswer
    from rlmix.embedded.v2.warmstart import answer_budget, answer_task

    spec = EmbeddedMoeSpec(answer=MiniCodeAnswer.trace, trace_tries=[3, 5])
    task = answer_task(spec, (1, 2, 3))
    assert isinstance(task, MiniCodeTrace) and task.tries == (3, 5)
    tokenizer = build_char_tokenizer(ALPHABET)
    longest = max(len(task.reference_answer(p)) for p in task.split("test"))
    assert answer_budget(tokenizer, task) == longest + 8  # one token per character here
    assert type(answer_task(EmbeddedMoeSpec(), (1,))) is MiniCode
