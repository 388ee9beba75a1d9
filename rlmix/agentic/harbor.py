"""Harbor task directories: loading, validation and subset selection.

A Harbor task directory (the format SWE-bench Pro V2 ships in, docs/math.md §7)::

    <id>/task.toml               [metadata], [agent] timeout_sec, [verifier] timeout_sec + env,
                                 [environment] build_timeout_sec, cpus, memory_mb (or memory = "4G"),
                                 docker_image (optional prebuilt image)
    <id>/instruction.md          the problem statement shown to the policy
    <id>/environment/Dockerfile  builds the task image; its last WORKDIR is where the repository lives
    <id>/environment/repo/       (local runtime only) the repository, copied in by the Dockerfile
    <id>/tests/test.sh           the verifier; writes a reward to $LOGS_DIR/verifier/reward.txt
                                 (/logs/verifier/reward.txt in an image) or signals by exit code
    <id>/checksums.sha256        optional, ``sha256sum`` format, paths relative to the task directory

Every problem found is reported on its own line of one ``ConfigError``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from rlmix.errors import ConfigError

DEFAULT_WORKDIR = "/app"  # where SWE-bench Pro images keep the repository when the Dockerfile says nothing
REQUIRED_FILES = ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh")
# Files a policy may not change: SWE-bench resets test files before grading, and so do we.
# Used when task.toml's [metadata] test_files does not list them (git-apply wildmatch patterns).
DEFAULT_TEST_GLOBS = ("*test_*.py", "*_test.py", "*/tests/*", "tests/*", "*/test/*", "test/*",
                      "*_test.go", "*.test.js", "*.test.ts", "*.spec.js", "*.spec.ts", "*conftest.py")
MAX_PROBLEMS_SHOWN = 6  # of one task, on its line; the rest are counted


@dataclass(frozen=True)
class HarborTask:
    """One task as the harness needs it; ``path`` is the task directory on the host."""

    task_id: str
    path: Path
    instruction: str
    workdir: str  # repository path inside the image
    agent_timeout_s: float
    verifier_timeout_s: float
    verifier_env: tuple[tuple[str, str], ...]
    build_timeout_s: float
    cpus: float
    memory_mb: int
    docker_image: str | None
    test_globs: tuple[str, ...]  # protected test files (restored before grading)
    instance_id: str  # [metadata] instance_id, else the directory name

    @property
    def repo_dir(self) -> Path:
        return self.path / "environment" / "repo"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"


def _read_text(task_dir: Path, rel: str, problems: list[str]) -> str | None:
    """The UTF-8 text of ``task_dir/rel``, else None with the reason added to ``problems``."""
    try:
        return (task_dir / rel).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        problems.append(f"{rel} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})")
    except OSError as e:
        problems.append(f"{rel} cannot be read: {e.strerror or e}")
    return None


def _table(doc: dict, key: str, problems: list[str]) -> dict:
    value = doc.get(key, {})
    if isinstance(value, dict):
        return value
    problems.append(f"[{key}] must be a table, not {type(value).__name__} {value!r}")
    return {}


def _positive(table: dict, section: str, key: str, default: float, problems: list[str]) -> float:
    """``table[key]`` (else ``default``) as a finite number > 0."""
    value = table.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    problems.append(f"[{section}] {key}={value!r}: must be a number > 0")
    return default


def _memory_mb(env: dict, problems: list[str]) -> int:
    if "memory_mb" in env:
        value = env["memory_mb"]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        problems.append(f"[environment] memory_mb={value!r}: must be a whole number of MB >= 1")
    elif "memory" in env:  # the older spelling: "4G", "512M"
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GgMm])[Bb]?\s*", str(env["memory"]))
        mb = int(float(m.group(1)) * (1024 if m.group(2) in "Gg" else 1)) if m else 0
        if mb >= 1:
            return mb
        problems.append(f"[environment] memory={env['memory']!r}: must be like '4G' or '512M' (at least 1M)")
    return 2048


def _test_globs(value: object, problems: list[str]) -> tuple[str, ...]:
    """git-apply exclude patterns for ``[metadata] test_files`` (DEFAULT_TEST_GLOBS when absent).

    Entries are paths (or wildmatch patterns) relative to the repository root; a leading ``./`` is
    dropped, and each entry protects the path itself and, for a directory, everything under it."""
    if value is None:
        return DEFAULT_TEST_GLOBS
    if not isinstance(value, list) or not value or not all(isinstance(f, str) for f in value):
        problems.append(f"[metadata] test_files={value!r}: must be a non-empty list of paths in the repository, "
                        f"e.g. [\"tests/test_x.py\"] (leave it out for the default test patterns)")
        return ()
    globs: list[str] = []
    for entry in value:
        parts = [p for p in entry.strip().split("/") if p not in ("", ".")]
        if entry.strip().startswith("/") or ".." in parts or not parts:
            problems.append(f"[metadata] test_files entry {entry!r}: must be a path inside the repository "
                            f"(relative, no '..')")
            continue
        path = "/".join(parts)
        globs += [g for g in (path, f"{path}/*") if g not in globs]  # wildmatch's * also matches '/'
    return tuple(globs)


def workdir_from_dockerfile(dockerfile: Path) -> str:
    """The last ``WORKDIR`` of the Dockerfile (absolute), else ``DEFAULT_WORKDIR``."""
    workdir = DEFAULT_WORKDIR
    for line in dockerfile.read_text(errors="replace").splitlines():
        m = re.match(r"\s*WORKDIR\s+(\S+)", line, flags=re.IGNORECASE)
        if m:
            arg = m.group(1).strip("\"'")
            workdir = arg if arg.startswith("/") else f"{workdir.rstrip('/')}/{arg}"
    return workdir


def _checksum_problems(task_dir: Path) -> list[str]:
    sums = task_dir / "checksums.sha256"
    if not sums.is_file():
        return []
    problems: list[str] = []
    text = _read_text(task_dir, "checksums.sha256", problems)
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        digest, _, name = line.strip().partition(" ")
        target = task_dir / name.strip().lstrip("*")
        if not target.is_file():
            problems.append(f"checksums.sha256 lists missing file {name.strip()}")
        elif hashlib.sha256(target.read_bytes()).hexdigest() != digest.lower():
            problems.append(f"checksum mismatch for {name.strip()}")
    return [f"{task_dir.name}: {p}" for p in problems]


def _one_line(name: str, problems: list[str]) -> str:
    shown = problems[:MAX_PROBLEMS_SHOWN]
    more = f"; and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    return f"{name}: {'; '.join(shown)}{more}".replace("\n", " ")


def load_task(task_dir: Path) -> tuple[HarborTask | None, list[str]]:
    """Parse one task directory; returns (task or None, problems, one line each).

    A task's own problems (missing files, unreadable text, bad task.toml values) share one line;
    each checksum problem has its own."""
    name = task_dir.name
    problems: list[str] = []
    missing = [f for f in REQUIRED_FILES if not (task_dir / f).is_file()]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    doc: dict = {}
    if "task.toml" not in missing:
        text = _read_text(task_dir, "task.toml", problems)
        try:
            doc = tomllib.loads(text) if text is not None else {}
        except tomllib.TOMLDecodeError as e:
            problems.append(f"bad task.toml: {e}")
    instruction = _read_text(task_dir, "instruction.md", problems) if "instruction.md" not in missing else None
    toml_problems: list[str] = []
    meta, agent = _table(doc, "metadata", toml_problems), _table(doc, "agent", toml_problems)
    verifier, env = _table(doc, "verifier", toml_problems), _table(doc, "environment", toml_problems)
    verifier_env = verifier.get("env", {})
    if not isinstance(verifier_env, dict):
        toml_problems.append(f"[verifier] env={verifier_env!r}: must be a table of variables")
        verifier_env = {}
    docker_image = env.get("docker_image")
    if docker_image is not None and not (isinstance(docker_image, str) and docker_image.strip()):
        toml_problems.append(f"[environment] docker_image={docker_image!r}: must be an image name")
    fields = dict(
        agent_timeout_s=_positive(agent, "agent", "timeout_sec", 3600.0, toml_problems),
        verifier_timeout_s=_positive(verifier, "verifier", "timeout_sec", 1800.0, toml_problems),
        build_timeout_s=_positive(env, "environment", "build_timeout_sec", 1800.0, toml_problems),
        cpus=_positive(env, "environment", "cpus", 1, toml_problems),
        memory_mb=_memory_mb(env, toml_problems),
        test_globs=_test_globs(meta.get("test_files"), toml_problems),
    )
    problems += [f"bad task.toml: {p}" for p in toml_problems]
    problems = [_one_line(name, problems)] if problems else []
    problems += _checksum_problems(task_dir)
    if problems or instruction is None:
        return None, problems
    task = HarborTask(
        task_id=name,
        path=task_dir.resolve(),
        instruction=instruction,
        workdir=workdir_from_dockerfile(task_dir / "environment" / "Dockerfile"),
        verifier_env=tuple((str(k), str(v)) for k, v in verifier_env.items()),
        docker_image=docker_image,
        instance_id=str(meta.get("instance_id", name)),
        **fields,
    )
    return task, []


def read_subset_file(path: Path) -> list[str]:
    """Instance ids, one per line (``#`` starts a comment), or a JSON list of strings; at least one."""
    if not path.is_file():
        raise ConfigError(f"task.subset_file={path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"task.subset_file={path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                          f"{e.start}): give one instance id per line, or a JSON list of strings") from None
    if text.lstrip().startswith("["):
        try:
            ids = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"task.subset_file={path} is not valid JSON ({e}): give a JSON list of strings, "
                              f"or one instance id per line") from None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ConfigError(f"task.subset_file={path}: the JSON must be a list of strings (instance ids)")
        ids = [i.strip() for i in ids]
    else:
        ids = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    ids = [i for i in ids if i]
    if not ids:
        raise ConfigError(f"task.subset_file={path}: lists no ids (give one instance id per line, "
                          f"or set task.subset=all)")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"task.subset_file={path} lists ids more than once: {', '.join(dupes[:5])}")
    return ids


def load_tasks(tasks_dir: Path) -> dict[str, HarborTask]:
    """Every task directory under ``tasks_dir`` (sorted by id); raises one ConfigError listing all problems."""
    if not tasks_dir.is_dir():
        raise ConfigError(f"task.tasks_dir={tasks_dir} is not a directory")
    if (tasks_dir / "task.toml").is_file():
        raise ConfigError(f"task.tasks_dir={tasks_dir} points at one task (it holds task.toml): "
                          f"give its parent directory, the one holding the task directories")
    tasks, problems = {}, []
    for d in sorted(p for p in tasks_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        task, found = load_task(d)
        problems += found
        if task is not None:
            tasks[task.task_id] = task
    by_instance: dict[str, list[str]] = {}
    for t in tasks.values():
        by_instance.setdefault(t.instance_id, []).append(t.task_id)
    problems += [f"[metadata] instance_id {iid!r} is shared by task directories {', '.join(dirs)}"
                 for iid, dirs in by_instance.items() if len(dirs) > 1]
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise ConfigError(f"{len(problems)} problem(s) with the tasks in task.tasks_dir={tasks_dir}:\n{lines}")
    if not tasks:
        raise ConfigError(f"task.tasks_dir={tasks_dir} holds no task directories")
    return tasks


def select_subset(tasks: dict[str, HarborTask], ids: list[str], expected: int | None,
                  source: str) -> list[str]:
    """Map subset ids (directory names or ``instance_id``) to task ids; unknown or ambiguous ids, two ids of
    one task, an empty subset and a wrong size are errors."""
    by_instance: dict[str, list[str]] = {}
    for t in tasks.values():
        by_instance.setdefault(t.instance_id, []).append(t.task_id)
    problems, selected, named_by = [], [], {}
    for i in ids:
        found = [i] if i in tasks else by_instance.get(i, [])
        if not found:
            problems.append(f"  unknown instance id {i!r} in task.subset_file={source}")
        elif len(found) > 1:
            problems.append(f"  instance id {i!r} in task.subset_file={source} matches task directories "
                            f"{', '.join(found)}")
        elif found[0] in named_by:
            problems.append(f"  task.subset_file={source} names task {found[0]} twice: {named_by[found[0]]!r}, {i!r}")
        else:
            named_by[found[0]] = i
            selected.append(found[0])
    if not ids:
        problems.append(f"  task.subset_file={source}: lists no ids")
    elif expected is not None and len(ids) != expected:
        problems.append(f"  task.subset_file={source} lists {len(ids)} ids, task.expected_subset_size={expected}")
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) with the subset:\n" + "\n".join(problems))
    return selected
