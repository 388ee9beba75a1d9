"""minicode: infer a short list program from input>output examples (the embedded default task).

Prompt (examples in the compact digit notation of ``minicode_lang``, then ``?``)::

    51234>43215;90412>21409;77001>10077?

Answer: the program inside ``<p>...</p>``, then end of sequence, e.g. ``<p>rev</p>``.

Format rule (checked before correctness): the completion, as decoded without the prompt, must be
exactly ``<p>`` + program text + ``</p>``; the only thing allowed after ``</p>`` is the literal
end-of-sequence marker ``</s>`` (callers that decode with special tokens). The program text must
parse. Anything else — a missing tag, text after ``</p>``, an unknown op — is a *format error*
(``Score.format_ok=False``, reward 0). A well-formed program is *correct* (reward 1) iff it
reproduces the shown examples and the hidden tests (held-out inputs); so every program equivalent to
the reference on those inputs is accepted, e.g. ``add1|add2`` for ``add3``.

Difficulty = the length of the shortest program that explains the examples' generator: level L
problems use a program of L ops that no program with fewer ops computes (checked on a fixed probe
set), so ``rev|rev`` or ``add3|add4`` never appear as harder levels. The reference answer is the
first program of its equivalence class in enumeration order, so supervised warm-up sees one
canonical answer per class.

Splits are fixed and independent of the constructor: ``test`` (20 problems per level 1-3) and
``hard51`` (51 level-3 problems; this task's own hard split). ``sample`` draws training problems from
the constructor's ``levels``, deterministic in ``(self.seed, seed)``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache

from rlmix.errors import ConfigError
from rlmix.tasks.base import Problem, Score
from rlmix.embedded.minicode_lang import (
    Digits,
    Program,
    ProgramSyntaxError,
    all_programs,
    parse,
    run,
    show,
    unparse,
)

MAX_LEVEL = 3
NUM_EXAMPLES = 3
NUM_HIDDEN = 6
EXAMPLE_LEN = (5, 5)  # every list has five digits: output digit i sits at a fixed offset from its source
HIDDEN_LEN = (5, 5)  # held-out inputs, same length as the shown ones
_PROBE_SEED = 20261202
_SPLIT_SEEDS = {"test": 1_000_003, "hard51": 5_100_051}
_FORMAT_RE = re.compile(r"<p>(.*?)</p>(?:</s>)?", re.DOTALL)
# Every character a prompt or answer can contain (the char tokenizer's vocabulary is built from it).
ALPHABET = "0123456789>;?<p/|" + "".join(sorted(set("revsortevenoddaddtakedrop")))


@dataclass(frozen=True)
class MiniCodePayload:
    """Task-private data of one problem: the reference program and every graded input/output."""

    program: str  # reference program text (canonical representative of its class)
    examples: tuple[tuple[Digits, Digits], ...]  # shown in the prompt
    hidden: tuple[tuple[Digits, Digits], ...]  # held out; graded together with the examples


def _random_list(rng: random.Random, length_range: tuple[int, int]) -> Digits:
    return tuple(rng.randrange(10) for _ in range(rng.randint(*length_range)))


@lru_cache(maxsize=1)
def _probes() -> tuple[Digits, ...]:
    rng = random.Random(_PROBE_SEED)
    return tuple(_random_list(rng, EXAMPLE_LEN) for _ in range(48))


@lru_cache(maxsize=1)
def catalog() -> dict[int, tuple[Program, ...]]:
    """Canonical programs by level: level L holds, for each behaviour first reached with L ops,
    the first L-op program (enumeration order) that has it. Probes have the shown examples' lengths.
    Excluded: the identity, and programs that return the empty list on over 2/3 of the probes
    (their examples would rarely show anything)."""
    probes = _probes()
    seen = {tuple(probes)}  # the identity (0 ops)
    outputs: dict[Program, tuple[Digits, ...]] = {(): tuple(probes)}  # by program, all lengths
    levels: dict[int, tuple[Program, ...]] = {}
    for length in range(1, MAX_LEVEL + 1):
        fresh = []
        for program in all_programs(length):
            # extend the prefix's outputs by one op rather than rerunning the whole program
            signature = tuple(program[-1].apply(xs) for xs in outputs[program[:-1]])
            outputs[program] = signature
            if signature in seen:
                continue
            seen.add(signature)
            if 3 * sum(1 for out in signature if out) >= len(probes):
                fresh.append(program)
        levels[length] = tuple(fresh)
    return levels


def make_problem(rng: random.Random, level: int, task_id: str) -> Problem:
    """One problem of the given level drawn with ``rng``."""
    program = rng.choice(catalog()[level])
    for _ in range(1000):  # redraw until the examples show the program doing something
        inputs = [_random_list(rng, EXAMPLE_LEN) for _ in range(NUM_EXAMPLES)]
        examples = tuple((xs, run(program, xs)) for xs in inputs)
        if any(out != xs for xs, out in examples) and any(out for _, out in examples):
            break
    else:
        raise AssertionError(f"no informative examples for {unparse(program)}")
    hidden_inputs = [_random_list(rng, HIDDEN_LEN) for _ in range(NUM_HIDDEN)]
    hidden = tuple((xs, run(program, xs)) for xs in hidden_inputs)
    prompt = ";".join(f"{show(xs)}>{show(out)}" for xs, out in examples) + "?"
    payload = MiniCodePayload(unparse(program), examples, hidden)
    return Problem(task_id=task_id, prompt=prompt, difficulty=level, payload=payload)


def extract_program(completion: str) -> str | None:
    """The program text inside the required ``<p>...</p>`` wrapper, or None if the format is wrong."""
    m = _FORMAT_RE.fullmatch(completion)
    return None if m is None else m.group(1)


class MiniCode:
    """The embedded verifiable coding task (implements ``rlmix.tasks.base.Task``)."""

    name = "minicode"

    def __init__(self, levels: tuple[int, ...] = (1, 2, 3), seed: int = 0) -> None:
        bad = [lv for lv in levels if lv not in range(1, MAX_LEVEL + 1)]
        if not levels or bad:
            raise ConfigError(f"task.levels={list(levels)}: each level must be in 1..{MAX_LEVEL}")
        self.levels = tuple(levels)
        self.seed = seed

    def sample(self, n: int, seed: int) -> list[Problem]:
        """n training problems, levels uniform over ``self.levels``, deterministic in (self.seed, seed)."""
        rng = random.Random(f"minicode-train:{self.seed}:{seed}")
        return [
            make_problem(rng, rng.choice(self.levels), f"minicode/train/s{self.seed}.{seed}/{i}")
            for i in range(n)
        ]

    def split(self, name: str) -> list[Problem]:
        """A fixed evaluation split: ``test`` (20 per level 1-3) or ``hard51`` (51 level-3)."""
        if name not in _SPLIT_SEEDS:
            raise ConfigError(f"task.split={name!r} is not a minicode split; use one of {sorted(_SPLIT_SEEDS)}")
        return list(_fixed_split(name))

    def score(self, problem: Problem, completion: str) -> Score:
        """Format first (``<p>PROGRAM</p>`` and a parsable program), then hidden-test correctness."""
        text = extract_program(completion)
        if text is None:
            return Score(reward=0.0, format_ok=False)
        try:
            program = parse(text)
        except ProgramSyntaxError:
            return Score(reward=0.0, format_ok=False)
        payload: MiniCodePayload = problem.payload
        cases = payload.examples + payload.hidden
        correct = all(run(program, xs) == out for xs, out in cases)
        return Score(reward=1.0 if correct else 0.0, format_ok=True)

    def reference_answer(self, problem: Problem) -> str:
        """The canonical correct completion (without end-of-sequence), used by the warm start."""
        payload: MiniCodePayload = problem.payload
        return f"<p>{payload.program}</p>"


@lru_cache(maxsize=None)
def _fixed_split(name: str) -> tuple[Problem, ...]:
    rng = random.Random(_SPLIT_SEEDS[name])
    if name == "hard51":
        return tuple(make_problem(rng, MAX_LEVEL, f"minicode/hard51/{i:02d}") for i in range(51))
    levels = [lv for lv in range(1, MAX_LEVEL + 1) for _ in range(20)]
    return tuple(make_problem(rng, lv, f"minicode/test/{i:02d}") for i, lv in enumerate(levels))
