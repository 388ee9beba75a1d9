"""Write the example arithmetic word problems (train.jsonl, test.jsonl) beside this file.

The wording uses only characters the embedded model's tokenizer knows (digits, a few letters,
space and ``?``), so the embedded model can at least attempt them; answers are ``<p>N</p>``-wrapped
by the format rule in docs/tasks.md. Deterministic: ``python examples/arith/make_data.py``
rewrites the same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
# (template, answer) — each template is a sentence the embedded vocabulary can spell.
TEMPLATES = (
    ("{a} pens add {b} pens?", lambda a, b: a + b),
    ("add {a} to {b}?", lambda a, b: a + b),
    ("{a} pens drop {b}?", lambda a, b: a - b),
    ("{a} rats take {b}?", lambda a, b: a - b),
    ("{a} nests and {b} nests?", lambda a, b: a + b),
)


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        template, answer = rng.choice(TEMPLATES)
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        a, b = max(a, b), min(a, b)  # no negative answers
        out.append({"question": template.format(a=a, b=b), "answer": str(answer(a, b))})
    return out


def main() -> None:
    for name, n, seed in (("train", 512, 0), ("test", 64, 1)):
        path = HERE / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows(n, seed)))
        print(f"wrote {n} rows to {path}")


if __name__ == "__main__":
    main()
