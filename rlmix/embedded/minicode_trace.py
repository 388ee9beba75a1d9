"""minicode with worked answers: the policy searches for the program in writing, then answers.

Same problems and prompts as ``minicode`` (``51234>43215;90412>21409;77001>10077?``). The answer
is a *trace* of tries, then the program::

    <t>sort>12345;add1|rev>54326;rev>43215</t><p>rev</p>

Each try is ``PROGRAM>OUTPUT``: a program and what it computes on the FIRST example's input.

Format rule (checked before correctness; a break is a *format error*, reward 0):

- the completion is exactly ``<t>`` + tries separated by ``;`` + ``</t><p>`` + program + ``</p>``,
  optionally followed by the literal ``</s>``;
- every try's program parses, and its OUTPUT is exactly what that program computes on the first
  example's input (an arithmetic slip anywhere in the trace is a format error);
- the answered program is the last try's, character for character.

Reward 1 iff the answered program reproduces every shown example and the hidden tests (as in
``minicode``). So most of an answer is determined by its tries (the outputs, the closing tags),
while which programs to try, in which order, and when to stop are the policy's free choices: long
answers with free tokens beside forced ones, where one wrong digit costs the whole answer.

``reference_answer`` (the warm start's target) is a search that tries ``tries`` programs that do
not reproduce the first example (drawn from levels up to the problem's, in an order seeded by the
problem id), then the reference program, whose output matches; between ``tries[0]`` and
``tries[1]`` wrong tries (the ``trace_tries`` setting) make it 10-20 characters per try.
"""

from __future__ import annotations

import random
import re

from rlmix.embedded.minicode import MiniCode, MiniCodePayload, catalog
from rlmix.embedded.minicode_lang import ProgramSyntaxError, parse, run, show, unparse
from rlmix.errors import ConfigError
from rlmix.tasks.base import Problem, Score

_TRACE_RE = re.compile(r"<t>(.*?)</t><p>(.*?)</p>(?:</s>)?", re.DOTALL)
_TRY_RE = re.compile(r"([^>;]*)>([0-9]*)")


def check_trace(completion: str, first_input: tuple[int, ...]) -> str | None:
    """The answered program's text if ``completion`` keeps the format rule, else None."""
    m = _TRACE_RE.fullmatch(completion)
    if m is None or not m.group(1):
        return None
    last = None
    for part in m.group(1).split(";"):
        t = _TRY_RE.fullmatch(part)
        if t is None:
            return None
        try:
            program = parse(t.group(1))
        except ProgramSyntaxError:
            return None
        if show(run(program, first_input)) != t.group(2):
            return None
        last = t.group(1)
    return m.group(2) if m.group(2) == last else None


class MiniCodeTrace(MiniCode):
    """minicode answered with a worked trace (implements ``rlmix.tasks.base.Task``)."""

    name = "minicode_trace"

    def __init__(self, levels: tuple[int, ...] = (1, 2, 3), seed: int = 0, tries: tuple[int, int] = (8, 16)) -> None:
        super().__init__(levels, seed)
        if len(tries) != 2 or not 0 <= tries[0] <= tries[1]:
            raise ConfigError(f"task.trace_tries={list(tries)}: need [min, max] with 0 <= min <= max "
                              "(wrong tries in a reference trace)")
        self.tries = tuple(tries)

    def score(self, problem: Problem, completion: str) -> Score:
        """Format first (the trace's syntax and arithmetic, the answer = the last try), then
        correctness on the examples and hidden tests."""
        payload: MiniCodePayload = problem.payload
        text = check_trace(completion, payload.examples[0][0])
        if text is None:
            return Score(reward=0.0, format_ok=False)
        program = parse(text)
        correct = all(run(program, xs) == out for xs, out in payload.examples + payload.hidden)
        return Score(reward=1.0 if correct else 0.0, format_ok=True)

    def longest_reference_tokens(self, tokenizer) -> int:
        """Tokens of the longest reference trace of the test split in ``tokenizer``'s encoding (no
        special tokens): the budget a sampled answer needs so that no taught trace is cut."""
        return max(len(tokenizer.encode(self.reference_answer(p), add_special_tokens=False))
                   for p in self.split("test"))

    def reference_answer(self, problem: Problem) -> str:
        """A worked search ending in the reference program (deterministic in the problem's id)."""
        payload: MiniCodePayload = problem.payload
        first_in, first_out = payload.examples[0]
        rng = random.Random(f"minicode-trace:{problem.task_id}")
        wrong = [p for level in range(1, problem.difficulty + 1) for p in catalog()[level]
                 if run(p, first_in) != first_out]
        tries = rng.sample(wrong, min(rng.randint(*self.tries), len(wrong)))
        steps = [f"{unparse(p)}>{show(run(p, first_in))}" for p in tries]
        steps.append(f"{payload.program}>{show(first_out)}")
        return f"<t>{';'.join(steps)}</t><p>{payload.program}</p>"
