"""The ``docker`` runtime: the task's image, network off during the agent phase, limits from task.toml.

The image is ``[environment] docker_image`` (pulled if absent) or built from ``environment/`` and
tagged ``<prefix>/<task id>:latest``. A sandbox is a container started with ``sleep infinity``,
``--cpus`` and ``--memory`` from task.toml, and ``--network none`` unless asked otherwise; commands
run with ``docker exec`` in the task's WORKDIR under coreutils ``timeout`` (which signals the whole
process group, then SIGKILLs it 5 s later); their output is read in chunks and capped. The task's
tests are copied to ``/tests`` and the verifier writes to ``/logs/verifier``, as in Harbor.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from rlmix.agentic.harbor import HarborTask
from rlmix.agentic.sandbox import DEFAULT_OUTPUT_CAP_BYTES, ExecResult, FileTooLarge, InfraError
from rlmix.isolation.process import read_capped

TIMEOUT_EXIT = 124  # coreutils timeout's exit status when the time limit was hit
# What the docker CLI prints when the engine or the container (not the command) failed.
DAEMON_ERRORS = ("Error response from daemon", "Cannot connect to the Docker daemon", "No such container")


def _docker(args: list[str], timeout_s: float, data: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["docker", *args], input=data, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InfraError(f"docker {args[0]} failed: {e}") from e


def docker_available() -> bool:
    """True when a Docker engine answers ``docker info``."""
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class DockerSandbox:
    def __init__(self, image: str, task: HarborTask, network: bool, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES):
        self._output_cap = output_cap_bytes
        self.name = f"rlmix-{re.sub(r'[^a-zA-Z0-9_.-]', '-', task.task_id)[:40]}-{uuid.uuid4().hex[:8]}"
        self.workdir, self.tests_dir, self.logs_dir = task.workdir, "/tests", "/logs"
        args = ["run", "-d", "--name", self.name, "--cpus", f"{task.cpus:g}", "--memory", f"{task.memory_mb}m",
                "--entrypoint", "sleep", "-w", self.workdir]
        if not network:
            args += ["--network", "none"]
        res = _docker([*args, image, "infinity"], timeout_s=300.0)
        if res.returncode != 0:
            raise InfraError(f"docker run {image} failed: {res.stderr.decode(errors='replace')[-500:]}")

    def run(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult:
        envs = {"APP_DIR": self.workdir, "TESTS_DIR": self.tests_dir, "LOGS_DIR": self.logs_dir, **(env or {})}
        args = ["exec", "-w", self.workdir]
        for k, v in envs.items():
            args += ["-e", f"{k}={v}"]
        args += [self.name, "timeout", "-k", "5", f"{timeout_s:g}", "bash", "-c", command]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(["docker", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
        except OSError as e:
            raise InfraError(f"docker exec failed: {e}") from e
        # `timeout` inside the container ends the command; the CLI itself gets a minute more.
        raw, cli_hung = read_capped(proc, timeout_s + 60.0, self._output_cap, proc.kill)
        returncode = proc.wait()
        out = raw.decode("utf-8", errors="replace")
        if cli_hung or (returncode != 0 and any(m in out[-2000:] for m in DAEMON_ERRORS)):
            raise InfraError(f"docker exec in {self.name} failed: {out[-500:]}")
        timed_out = returncode in (TIMEOUT_EXIT, 137) and time.monotonic() - start >= timeout_s
        return ExecResult(-1 if timed_out else returncode, out, timed_out, time.monotonic() - start)

    def put_dir(self, host_dir: Path, sandbox_dir: str) -> None:
        self.run(f"mkdir -p {shlex.quote(sandbox_dir)}", timeout_s=60.0)
        res = _docker(["cp", f"{host_dir}/.", f"{self.name}:{sandbox_dir}"], timeout_s=300.0)
        if res.returncode != 0:
            raise InfraError(f"docker cp into {self.name} failed: {res.stderr.decode(errors='replace')[-500:]}")

    def put_file(self, sandbox_path: str, data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "f").write_bytes(data)
            parent = sandbox_path.rsplit("/", 1)[0] or "/"
            self.run(f"mkdir -p {shlex.quote(parent)}", timeout_s=60.0)
            res = _docker(["cp", f"{tmp}/f", f"{self.name}:{sandbox_path}"], timeout_s=300.0)
        if res.returncode != 0:
            raise InfraError(f"docker cp into {self.name} failed: {res.stderr.decode(errors='replace')[-500:]}")

    def read_file(self, sandbox_path: str, max_bytes: int) -> bytes | None:
        # One byte past the cap tells a larger file; a FIFO or device is not read (it could block or never end).
        res = _docker(["exec", self.name, "sh", "-c", 'test -f "$1" && head -c "$2" -- "$1"', "sh", sandbox_path,
                       str(max_bytes + 1)], timeout_s=120.0)
        if res.returncode != 0:
            return None
        if len(res.stdout) > max_bytes:
            raise FileTooLarge(f"{sandbox_path} has more than the {max_bytes} bytes read")
        return res.stdout

    def close(self) -> None:
        try:
            _docker(["rm", "-f", self.name], timeout_s=120.0)
        except InfraError:
            pass  # nothing to recover; a leftover container is named rlmix-* for manual cleanup


class DockerRuntime:
    def __init__(self, image_prefix: str, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES):
        self._prefix, self._output_cap = image_prefix, output_cap_bytes
        self._images: dict[str, str] = {}

    def unavailable(self) -> str | None:
        if docker_available():
            return None
        return ("task.runtime=docker needs a running Docker engine and `docker info` does not answer: start one "
                "(README, \"Agentic tasks: the sandbox and the Docker engine\"), or use task.runtime=local")

    def image_tag(self, task: HarborTask) -> str:
        return f"{self._prefix}/{re.sub(r'[^a-z0-9_.-]', '-', task.task_id.lower())}:latest"

    def check(self, task: HarborTask) -> str | None:
        return None  # every Harbor task has a Dockerfile (checked at load)

    def prepare(self, task: HarborTask) -> None:
        if task.task_id in self._images:
            return
        if task.docker_image:
            image = task.docker_image
            if _docker(["image", "inspect", image], timeout_s=60.0).returncode != 0:
                res = _docker(["pull", image], timeout_s=task.build_timeout_s)
                if res.returncode != 0:
                    raise InfraError(f"docker pull {image} failed: {res.stderr.decode(errors='replace')[-500:]}")
        else:
            image = self.image_tag(task)
            res = _docker(["build", "-t", image, str(task.path / "environment")], timeout_s=task.build_timeout_s)
            if res.returncode != 0:
                raise InfraError(f"docker build for {task.task_id} failed: "
                                 f"{res.stderr.decode(errors='replace')[-500:]}")
        self._images[task.task_id] = image

    def start(self, task: HarborTask, network: bool, proc: bool = True) -> DockerSandbox:  # a container has /proc
        self.prepare(task)
        return DockerSandbox(self._images[task.task_id], task, network, self._output_cap)
