"""Protected test files ([metadata] test_files) stay as shipped whatever the patch does to them.

Real git makes the patches and the local runtime grades them (bubblewrap where it runs, else trusted):
a patch that guts a protected test scores 0 in every spelling of test_files, and so does one that
renames a protected test away (``git apply --exclude`` judges a rename by its new path only).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmix.agentic.grading import grade_patch, renamed_protected
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime
from rlmix.errors import ConfigError
from tests.test_agentic_fixtures import TASK_TOML, TEST, TRUSTED, make_task

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "diff.renames=true"]
GUTTED = "print('ok')\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
# The verifier runs every check under spec/, as a Harbor task's test.sh runs its test directory.
SPEC_TEST_SH = ('#!/bin/bash\ncd "$APP_DIR"\nfor f in spec/*.py; do bash "$TESTS_DIR/rlmix_verify.sh" "$f" || exit 1; '
                'done\n')


def _task(tmp_path: Path, test_files: str, spec: bool = False):
    toml = TASK_TOML.replace('test_files = ["test_calc.py"]', f"test_files = {test_files}")
    d = make_task(tmp_path / "tasks", "calc", toml=toml)
    if spec:  # the fail-to-pass check in spec/check.py, a pass-to-pass one beside it
        repo = d / "environment" / "repo"
        (repo / "spec").mkdir()
        (repo / "test_calc.py").rename(repo / "spec" / "check.py")
        (repo / "spec" / "other.py").write_text("from calc import sub\n\nassert sub(5, 3) == 2\n")
        (d / "tests" / "test.sh").write_text(SPEC_TEST_SH)
    return load_tasks(tmp_path / "tasks")["calc"]


def _patch(task, tmp_path: Path, edit: Callable[[Path], None]) -> str:
    """The patch ``edit`` makes to the task's repository, as the agent phase takes it."""
    repo = tmp_path / "work"
    shutil.copytree(task.repo_dir, repo)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*GIT, *args], cwd=repo, check=True)
    edit(repo)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    return subprocess.run([*GIT, "diff", "--cached", "--binary", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def _grade(task, patch: str):
    return grade_patch(task, patch, LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED), retries=0)


def _gut(path: str) -> Callable[[Path], None]:
    return lambda repo: (repo / path).write_text(GUTTED)


def _rename_away(path: str) -> Callable[[Path], None]:
    return lambda repo: (repo / path).rename(repo / "moved.py")


# (test_files as written in task.toml, spec/ layout, the edit to the tests)
CHEATS = {
    "dot_slash": ('["./test_calc.py"]', False, _gut("test_calc.py")),
    "directory": ('["spec"]', True, _gut("spec/check.py")),
    "directory_slash": ('["spec/"]', True, _gut("spec/check.py")),
    "dot_slash_directory": ('["./spec"]', True, _gut("spec/check.py")),
    "rename_out_of_directory": ('["spec"]', True, _rename_away("spec/check.py")),
    "rename_out_of_glob": ('["spec/*"]', True, _rename_away("spec/check.py")),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_patch_that_guts_or_moves_a_protected_test_scores_zero(tmp_path, name):
    test_files, spec, edit = CHEATS[name]
    task = _task(tmp_path, test_files, spec)
    patch = _patch(task, tmp_path, edit)
    assert "print('ok')" in patch or "rename from" in patch
    grade = _grade(task, patch)
    assert (grade.reward, grade.infra_error) == (0.0, None), grade


@pytest.mark.parametrize("test_files,spec", [('["./test_calc.py"]', False), ('["spec"]', True)])
def test_the_fix_still_passes_beside_a_gutted_test(tmp_path, test_files, spec):
    task = _task(tmp_path, test_files, spec)
    check = "spec/check.py" if spec else "test_calc.py"

    def fix_and_gut(repo: Path) -> None:
        (repo / "calc.py").write_text(FIXED)
        (repo / check).write_text(GUTTED)

    grade = _grade(task, _patch(task, tmp_path, fix_and_gut))
    assert (grade.reward, grade.patch_applied) == (1.0, True), grade
    assert (task.path / "environment" / "repo" / check).read_text() == TEST


def test_a_rename_of_an_unprotected_file_is_applied(tmp_path):
    task = _task(tmp_path, '["test_calc.py"]')
    patch = _patch(task, tmp_path, lambda repo: (repo / "calc.py").rename(repo / "calc2.py"))
    assert "rename from calc.py" in patch and renamed_protected(patch, task.test_globs) == []
    assert renamed_protected('rename from "sp\\303\\251c/x.py"\r\n', ("sp\u00e9c/*",)) == ["sp\u00e9c/x.py"]
    assert renamed_protected("rename old test_calc.py\n", task.test_globs) == ["test_calc.py"]


@pytest.mark.parametrize("test_files,why", [
    ('"test_calc.py"', "must be a non-empty list"),
    ("[]", "must be a non-empty list"),
    ('["/work/repo/test_calc.py"]', "must be a path inside the repository"),
    ('["../test_calc.py"]', "must be a path inside the repository"),
    ('["spec/../../x"]', "must be a path inside the repository"),
    ('["."]', "must be a path inside the repository"),
    ("[1]", "must be a non-empty list"),
])
def test_test_files_that_protect_nothing_are_refused_at_load(tmp_path, test_files, why):
    with pytest.raises(ConfigError) as e:
        _task(tmp_path, test_files)
    line = str(e.value).splitlines()[1]
    assert "calc: bad task.toml: [metadata] test_files" in line and why in line


def test_test_files_entries_are_normalised_to_protect_a_path_and_what_is_under_it(tmp_path):
    task = _task(tmp_path, '["./spec/", "a//b.py", "test_calc.py", "./test_calc.py"]')
    assert task.test_globs == ("spec", "spec/*", "a/b.py", "a/b.py/*", "test_calc.py", "test_calc.py/*")


# A verifier that runs Python in the repository with it on PYTHONPATH, as many Harbor tasks' test.sh do.
PYTHONPATH_TEST_SH = ('#!/bin/bash\ncd "$APP_DIR"\nPYTHONPATH="$APP_DIR" python3 -c '
                      '"from calc import add; assert add(2, 3) == 5"\n')


@pytest.mark.parametrize("name", ["sitecustomize.py", "lib/sitecustomize.py", "usercustomize.py"])
def test_a_patch_adding_python_start_up_code_is_not_applied(tmp_path, name):
    """sitecustomize.py is imported at start-up from any directory on PYTHONPATH: one that ends the
    process with status 0 would pass the unfixed code. It is dropped from the patch like a test file."""
    task = _task(tmp_path, '["test_calc.py"]')
    (task.tests_dir / "test.sh").write_text(PYTHONPATH_TEST_SH)

    def cheat(repo: Path) -> None:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("import os\nos._exit(0)\n")

    if name != "lib/sitecustomize.py":  # the cheat works where the file lands on PYTHONPATH
        assert _grade(task, _patch(task, tmp_path, cheat)).reward == 0.0
    fixed = _patch(task, tmp_path / "fixed", lambda repo: (cheat(repo), (repo / "calc.py").write_text(FIXED)))
    assert _grade(task, fixed).reward == 1.0  # the rest of the patch still applies
