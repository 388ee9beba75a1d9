"""Scripted minicode_agent episodes: the warm start's teacher (try -> observe -> revise -> answer -> submit).

An episode tries ``0..MAX_WRONG`` wrong candidates before the reference program, each followed by
the observation the real environment would return (the same tool code, the same
``observation_text``), then writes the answer and submits. So the model learns the action format
and what a ``no`` means, and RL starts with something to improve: which candidate to try first.
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

MAX_WRONG = 2
P_WRONG = (0.5, 0.3)  # chance the first / second try is wrong


def tool_output(program: str, payload: MiniCodePayload) -> str:
    """What ``./mc PROGRAM`` prints on the examples (the tool's own code)."""
    ops = tool.parse(program)
    lines = []
    for xs, out in payload.examples:
        got = tool.run(ops, show(xs))
        lines.append(f"{got} {'ok' if got == show(out) else 'no'}\n")
    return "".join(lines)


def wrong_candidate(payload: MiniCodePayload, levels: tuple[int, ...], rng: random.Random) -> str:
    """A program of one of ``levels`` that fails at least one shown example."""
    while True:
        program = unparse(rng.choice(catalog()[rng.choice(levels)]))
        if " no" in tool_output(program, payload):
            return program


def observe(program_output: str, max_chars: int) -> str:
    return observation_text(0, program_output, False, 10.0, max_chars)


def scripted_episode(problem: Problem, levels: tuple[int, ...], rng: random.Random,
                     max_output_chars: int = 200) -> list[Message]:
    """The messages of one scripted episode, user prompt first (no system message)."""
    payload: MiniCodePayload = problem.payload
    messages = [Message("user", problem.prompt)]
    tries = []
    for p_wrong in P_WRONG[:MAX_WRONG]:
        if rng.random() >= p_wrong:
            break
        tries.append(wrong_candidate(payload, levels, rng))
    tries.append(payload.program)
    for program in tries:
        messages += [Message("assistant", try_action(program)),
                     Message("tool", observe(tool_output(program, payload), max_output_chars))]
    messages += [Message("assistant", answer_action(payload.program)), Message("tool", observe("", max_output_chars)),
                 Message("assistant", SUBMIT_ACTION)]
    return messages
