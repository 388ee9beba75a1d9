"""Scripted minicode_agent episodes: the warm start's teacher (try -> observe -> revise -> answer -> submit).

An episode tries up to ``MAX_WRONG`` wrong candidates, each followed by the observation the real
environment would return (the same tool code, the same ``observation_text``), never the same
candidate twice. Then either the reference program passes and is answered, or, after ``MAX_WRONG``
failures, the candidate that matched the most examples is answered anyway; the episode always
ends with the submit. So the model learns the action format, what a ``no`` means (try something
else), and that the turn budget ends in an answer rather than in ``max_turns``: with
``MAX_WRONG`` = 4, a give-up episode takes exactly minicode_agent's six turns.

The wrong candidates are drawn from all the warm start's levels, not only the problem's: a level-1
problem's wrong tries are then mostly two-op programs, so a one-op first try is almost always the
teacher's answer (docs/agentic.md has what each choice measured).
"""

from __future__ import annotations

import random

from rlmix.agentic.actions import SUBMIT_ACTION, observation_text
from rlmix.embedded.minicode_agent import answer_action, try_action
from rlmix.embedded.minicode_agent import tool
from rlmix.agentic.policy import Message
from rlmix.tasks.base import Problem
from rlmix.embedded.minicode import MiniCodePayload, catalog
from rlmix.embedded.minicode_lang import show, unparse

MAX_WRONG = 4  # wrong tries before giving up; + answer + submit = minicode_agent's max_turns (6)
P_WRONG = 0.5  # chance each next try is wrong (while fewer than MAX_WRONG were)


def tool_output(program: str, payload: MiniCodePayload) -> str:
    """What ``./mc PROGRAM`` prints on the examples (the tool's own code)."""
    ops = tool.parse(program)
    lines = []
    for xs, out in payload.examples:
        got = tool.run(ops, show(xs))
        lines.append(f"{got} {'ok' if got == show(out) else 'no'}\n")
    return "".join(lines)


def wrong_candidate(payload: MiniCodePayload, levels: tuple[int, ...], rng: random.Random,
                    tried: set[str] = frozenset()) -> str:
    """A program of one of ``levels``, not in ``tried``, that fails at least one shown example."""
    while True:
        program = unparse(rng.choice(catalog()[rng.choice(levels)]))
        if program not in tried and " no" in tool_output(program, payload):
            return program


def observe(program_output: str, max_chars: int) -> str:
    return observation_text(0, program_output, False, 10.0, max_chars)


def scripted_episode(problem: Problem, levels: tuple[int, ...], rng: random.Random,
                     max_output_chars: int = 200) -> list[Message]:
    """The messages of one scripted episode, user prompt first (no system message)."""
    payload: MiniCodePayload = problem.payload
    messages = [Message("user", problem.prompt)]
    tries: list[str] = []
    while len(tries) < MAX_WRONG and rng.random() < P_WRONG:
        tries.append(wrong_candidate(payload, levels, rng, set(tries)))
    answer = payload.program
    if len(tries) < MAX_WRONG:
        tries.append(payload.program)
    else:  # out of turns: answer the candidate that matched the most examples (the first such)
        answer = max(tries, key=lambda p: tool_output(p, payload).count(" ok"))
    for program in tries:
        messages += [Message("assistant", try_action(program)),
                     Message("tool", observe(tool_output(program, payload), max_output_chars))]
    messages += [Message("assistant", answer_action(answer)), Message("tool", observe("", max_output_chars)),
                 Message("assistant", SUBMIT_ACTION)]
    return messages
