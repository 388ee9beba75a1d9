"""The start-up and loop benchmarks measure the default run, the one ``make train`` starts.

Their goals (docs/performance.md) are about that run, so ``scripts/perf_common.DEFAULT_RUN`` must
stay the Makefile's ``train`` recipe: a benchmark that ran the config's bare default would print
another model's figures against the goals.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from unittest import mock

from rlmix.commands.compose import compose_plan
from rlmix.config.embedded import EmbeddedVersion

ROOT = Path(__file__).resolve().parents[1]


def default_run() -> tuple[str, ...]:
    with mock.patch.dict(os.environ), mock.patch.object(sys, "path", [str(ROOT / "scripts"), *sys.path]):
        return importlib.import_module("perf_common").DEFAULT_RUN


def test_the_benchmarks_default_run_is_make_trains():
    recipe = re.search(r"^train: .*\n\t(.+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE).group(1)
    assert recipe.split() == ["$(BIN)/rlmix", "train", *default_run()]


def test_the_default_run_is_the_v2_model():
    assert compose_plan(list(default_run())).cfg.model.embedded_version is EmbeddedVersion.v2
