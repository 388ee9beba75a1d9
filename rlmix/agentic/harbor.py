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


def _memory_mb(env: dict) -> int:
    if "memory_mb" in env:
        return int(env["memory_mb"])
    if "memory" in env:  # the older spelling: "4G", "512M"
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GgMm])[Bb]?\s*", str(env["memory"]))
        if not m:
            raise ValueError(f"[environment] memory={env['memory']!r} is not like '4G' or '512M'")
        return int(float(m.group(1)) * (1024 if m.group(2) in "Gg" else 1))
    return 2048


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
    problems = []
    for line in sums.read_text().splitlines():
        if not line.strip():
            continue
        digest, _, name = line.strip().partition(" ")
        target = task_dir / name.strip().lstrip("*")
        if not target.is_file():
            problems.append(f"{task_dir.name}: checksums.sha256 lists missing file {name.strip()}")
        elif hashlib.sha256(target.read_bytes()).hexdigest() != digest.lower():
            problems.append(f"{task_dir.name}: checksum mismatch for {name.strip()}")
    return problems


def load_task(task_dir: Path) -> tuple[HarborTask | None, list[str]]:
    """Parse one task directory; returns (task or None, problems, one line each)."""
    name = task_dir.name
    missing = [f for f in REQUIRED_FILES if not (task_dir / f).is_file()]
    if missing:
        return None, [f"{name}: missing {', '.join(missing)}"]
    problems = _checksum_problems(task_dir)
    try:
        doc = tomllib.loads((task_dir / "task.toml").read_text())
        meta, agent = doc.get("metadata", {}), doc.get("agent", {})
        verifier, env = doc.get("verifier", {}), doc.get("environment", {})
        test_files = meta.get("test_files")
        task = HarborTask(
            task_id=name,
            path=task_dir.resolve(),
            instruction=(task_dir / "instruction.md").read_text(),
            workdir=workdir_from_dockerfile(task_dir / "environment" / "Dockerfile"),
            agent_timeout_s=float(agent.get("timeout_sec", 3600.0)),
            verifier_timeout_s=float(verifier.get("timeout_sec", 1800.0)),
            verifier_env=tuple((str(k), str(v)) for k, v in verifier.get("env", {}).items()),
            build_timeout_s=float(env.get("build_timeout_sec", 1800.0)),
            cpus=float(env.get("cpus", 1)),
            memory_mb=_memory_mb(env),
            docker_image=env.get("docker_image"),
            test_globs=tuple(str(f) for f in test_files) if test_files is not None else DEFAULT_TEST_GLOBS,
            instance_id=str(meta.get("instance_id", name)),
        )
    except (tomllib.TOMLDecodeError, ValueError, TypeError, AttributeError) as e:
        return None, problems + [f"{name}: bad task.toml: {e}".replace("\n", " ")]
    return task, problems


def read_subset_file(path: Path) -> list[str]:
    """Instance ids, one per line (``#`` starts a comment), or a JSON list of strings."""
    if not path.is_file():
        raise ConfigError(f"task.subset_file={path} does not exist")
    text = path.read_text()
    if text.lstrip().startswith("["):
        ids = json.loads(text)
    else:
        ids = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    ids = [i for i in ids if i]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"task.subset_file={path} lists ids more than once: {', '.join(dupes[:5])}")
    return ids


def load_tasks(tasks_dir: Path) -> dict[str, HarborTask]:
    """Every task directory under ``tasks_dir`` (sorted by id); raises one ConfigError listing all problems."""
    if not tasks_dir.is_dir():
        raise ConfigError(f"task.tasks_dir={tasks_dir} is not a directory")
    tasks, problems = {}, []
    for d in sorted(p for p in tasks_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        task, found = load_task(d)
        problems += found
        if task is not None:
            tasks[task.task_id] = task
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise ConfigError(f"{len(problems)} problem(s) with the tasks in task.tasks_dir={tasks_dir}:\n{lines}")
    if not tasks:
        raise ConfigError(f"task.tasks_dir={tasks_dir} holds no task directories")
    return tasks


def select_subset(tasks: dict[str, HarborTask], ids: list[str], expected: int | None,
                  source: str) -> list[str]:
    """Map subset ids (directory names or ``instance_id``) to task ids; unknown ids and a wrong size are errors."""
    by_instance = {t.instance_id: t.task_id for t in tasks.values()}
    problems, selected = [], []
    for i in ids:
        tid = i if i in tasks else by_instance.get(i)
        if tid is None:
            problems.append(f"  unknown instance id {i!r} in task.subset_file={source}")
        else:
            selected.append(tid)
    if expected is not None and len(ids) != expected:
        problems.append(f"  task.subset_file={source} lists {len(ids)} ids, task.expected_subset_size={expected}")
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) with the subset:\n" + "\n".join(problems))
    return selected
