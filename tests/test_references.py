"""Every reference to the project's documents resolves inside the repository.

Code and docs cite the math as ``docs/math.md §n``; each such section must exist as a heading of
docs/math.md, and every ``docs/<name>.md`` named anywhere must be a file of the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCHED = ("rlmix", "conf", "tests", "scripts", "docs", "README.md")
OUTSIDE = re.compile("corrections" + r"\.md|" + "shared" + "/spec")  # split so this file does not match itself


def texts():
    for top in SEARCHED:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in {".py", ".md", ".yaml"})
        for f in files:
            yield f, f.read_text()


def math_sections() -> set[str]:
    heads = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / "math.md").read_text(), flags=re.MULTILINE)
    return set(heads)


def test_every_math_section_cited_exists():
    sections = math_sections()
    assert {"1", "2", "3.2", "4", "7"} <= sections, "docs/math.md lost its numbered headings"
    missing = [
        f"{f.relative_to(ROOT)}: §{n}"
        for f, text in texts()
        for n in re.findall(r"docs/math\.md,? §\s?(\d+(?:\.\d+)?)", text)
        if n.rstrip(".") not in sections
    ]
    assert not missing, missing


def test_every_named_document_exists():
    missing = sorted(
        {f"{f.relative_to(ROOT)}: {name}" for f, text in texts() for name in re.findall(r"\bdocs/[\w./-]+\.md", text)
         if not (ROOT / name).is_file()}
    )
    assert not missing, missing


def test_nothing_points_outside_the_repository():
    outside = [str(f.relative_to(ROOT)) for f, text in texts() if OUTSIDE.search(text)]
    assert not outside, outside
