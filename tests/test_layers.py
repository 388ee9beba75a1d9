"""The package's layer order (docs/architecture.md), checked against every import of every module.

A module may import its own package and any package in a LOWER layer; never a package in its own
layer or above. Imports inside functions count too: deferring an import does not change which way
the arrow points. The order is parsed from docs/architecture.md, so the picture and the code agree.
A few rules the order alone does not state (a unit that must not use some lower layers) follow.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlmix"
DOC = ROOT / "docs" / "architecture.md"


def documented_layers() -> list[set[str]]:
    """Layers from the doc's ``layer N: a, b`` lines, lowest first."""
    layers = {}
    for n, names in re.findall(r"^\s*layer (\d+): (.+)$", DOC.read_text(), flags=re.MULTILINE):
        layers[int(n)] = {name.strip() for name in names.split(",")}
    assert layers and sorted(layers) == list(range(len(layers))), "docs/architecture.md: layers 0..n, each once"
    return [layers[i] for i in range(len(layers))]


def unit_of(module: str) -> str:
    """``rlmix.trainers.loss`` -> ``trainers``; a top-level module is its own unit (``rollout``)."""
    return module.split(".")[1]


def rlmix_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("rlmix.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("rlmix."):
                out.append((node.lineno, node.module))
            elif node.module == "rlmix":  # from rlmix import x
                out += [(node.lineno, f"rlmix.{a.name}") for a in node.names]
    return out


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def test_every_unit_has_a_layer():
    placed = set().union(*documented_layers())
    units = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in modules()}
    assert units - placed == set(), "add these to the layer picture in docs/architecture.md"
    assert placed - units == set(), "the layer picture names units that do not exist"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    layer = {unit: i for i, units in enumerate(documented_layers()) for unit in units}
    own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    bad = [
        f"line {line}: {target} (layer {layer[unit_of(target)]}) from {own} (layer {layer[own]})"
        for line, target in rlmix_imports(path)
        if unit_of(target) != own and layer[unit_of(target)] >= layer[own]
    ]
    assert not bad, f"{path.relative_to(ROOT)} imports upward or sideways: " + "; ".join(bad)


def test_the_check_can_fail():
    """A planted upward import is caught (guards the parser, not the package)."""
    planted = PACKAGE / "correction" / "_planted_upward_import.py"
    planted.write_text("def f():\n    from rlmix.orchestration.runner import train\n")
    try:
        with pytest.raises(AssertionError, match="imports upward"):
            test_imports_point_down(planted)
    finally:
        planted.unlink()


def imports_of_unit_from(unit: str, banned: set[str], paths: list[Path] | None = None) -> list[str]:
    """``path: line: target`` for each import of a ``banned`` unit by a module of ``unit``."""
    paths = paths if paths is not None else [p for p in modules() if p.relative_to(PACKAGE).parts[0] == unit]
    return [f"{p.relative_to(ROOT)}:{line}: {target}" for p in paths for line, target in rlmix_imports(p)
            if unit_of(target) in banned]


# models/ is generic HF model I/O and the tokenizer-file reader: a model directory knows no task, so
# the embedded model (a task and a model at once) lives in embedded/, above both.
MODELS_BAN = {"tasks", "agentic", "embedded"}


def test_models_import_no_task():
    assert not imports_of_unit_from("models", MODELS_BAN)


def test_the_models_rule_can_fail():
    planted = PACKAGE / "models" / "_planted_task_import.py"
    planted.write_text("def f():\n    from rlmix.tasks.base import Problem\n")
    try:
        assert imports_of_unit_from("models", MODELS_BAN, [planted]) == [
            "rlmix/models/_planted_task_import.py:2: rlmix.tasks.base"]
    finally:
        planted.unlink()


def test_commands_import_no_sampler_model_or_agentic_module():
    # embedded/ counts: it holds the embedded models' builds and the minicode agent
    assert not imports_of_unit_from("commands", {"samplers", "models", "agentic", "embedded"})


def test_eval_imports_no_trainer_internals():
    assert not imports_of_unit_from("eval", {"trainers"})


# The task kinds live in one table (rlmix.assembly.task_kinds): code below the commands asks the
# plan's task (RunPlan.task) what differs between tasks and never tests a task config's class.
# assembly/rules.py holds the config's own cross-field rules and tasks/checks.py each task's rules,
# both about the classes they name; commands/ sits above the line.
TASK_KIND_MODULES = {"rlmix/assembly/task_kinds.py", "rlmix/assembly/rules.py", "rlmix/tasks/checks.py"}


def task_config_classes() -> set[str]:
    """The task config classes and every base class of theirs (object aside)."""
    from rlmix.assembly.parts import TASKS
    from rlmix.assembly.task_kinds import TASK_KINDS

    return {base.__name__ for cls in (*TASKS, *TASK_KINDS) for base in cls.__mro__ if base is not object}


def isinstance_on_task_configs(path: Path, names: set[str]) -> list[str]:
    """``path:line`` of each ``isinstance(x, C)`` (or a tuple of classes) whose ``C`` is in ``names``."""
    def named(node) -> set[str]:
        if isinstance(node, ast.Tuple):
            return set().union(*map(named, node.elts))
        return {node.id} if isinstance(node, ast.Name) else {node.attr} if isinstance(node, ast.Attribute) else set()

    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            and len(node.args) == 2 and named(node.args[1]) & names]


def test_no_module_below_the_commands_tests_a_task_configs_class():
    names = task_config_classes()
    assert {"MiniCodeTaskConfig", "DatasetTaskConfig", "AgentEnvConfig", "SwebenchProConfig"} <= names
    below = [p for p in modules() if p.relative_to(PACKAGE).parts[0] not in ("commands", "cli.py")
             and str(p.relative_to(ROOT)) not in TASK_KIND_MODULES]
    found = [hit for p in below for hit in isinstance_on_task_configs(p, names)]
    assert not found, "ask the plan's task kind (rlmix.assembly.task_kinds) instead: " + ", ".join(found)


def test_the_task_kind_rule_can_fail():
    planted = PACKAGE / "eval" / "_planted_kind_test.py"
    planted.write_text("def f(cfg):\n    return isinstance(cfg.task, (int, config.AgentEnvConfig))\n")
    try:
        assert isinstance_on_task_configs(planted, task_config_classes()) == ["rlmix/eval/_planted_kind_test.py:2"]
    finally:
        planted.unlink()


# One tokenizer loader for whatever encodes and decodes (the driver, samplers, eval, probe, agents):
# rlmix.models.tokenizer_file.load_fast_tokenizer, which serves transformers' own tokenizer wherever
# its tokenizer.json reader would not reproduce it. transformers' object itself is loaded only by the
# trainers, which save it with each checkpoint, and as that fallback.
TRANSFORMERS_TOKENIZER_USERS = {"trainers", "models"}


def transformers_tokenizer_loads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "rlmix.models.io"
            and any(a.name == "load_tokenizer" for a in node.names)]


def test_one_tokenizer_loader_encodes_and_decodes():
    outside = [p for p in modules() if p.relative_to(PACKAGE).parts[0] not in TRANSFORMERS_TOKENIZER_USERS]
    found = [hit for p in outside for hit in transformers_tokenizer_loads(p)]
    assert not found, "load the tokenizer with rlmix.models.tokenizer_file.load_fast_tokenizer: " + ", ".join(found)
    assert transformers_tokenizer_loads(PACKAGE / "trainers" / "torch_trainer.py")  # the check can find one
