"""scripts/gpu_check.py without a GPU: check 0 and the path into the CUDA checks, one line per check."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # runs the script in a subprocess
def test_check_0_passes_and_no_cuda_is_one_line(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    config = lines[0]
    assert config["check"].startswith("config:") and config["ok"], config
    assert config["model_positions"] == 256
    assert {e["max_model_len"] for e in config["engines"].values()} == {256}
    assert "the model's context is 256 positions" in config["refused"]["fleet=vllm_gpu_mixed"]
    assert lines[-1] == {"verdict": "FAILED", "failed": ["cuda"]}
    assert out.stderr.strip().splitlines()[-1].startswith("gpu_check: no CUDA device visible")


class FakeSampler:
    """Records the engines asked for and refuses to start, as an engine that cannot start would."""

    engines: list = []

    def __init__(self, model_dir, pool, engine, **_):
        FakeSampler.engines.append((pool, engine))
        raise RuntimeError(f"no engine for {pool} here\nsecond line")


@pytest.mark.slow  # builds a model
def test_cuda_checks_build_their_engines_and_report_each_failure_in_one_line(tmp_path, monkeypatch, capsys):
    """Past check 0 on a (faked) CUDA machine: every engine is built from a VllmEngine, and a check that
    raises is one JSON line; the trainer checks that need the bf16 pool's batch are skipped, not crashed."""
    import rlmix.samplers.vllm_sampler as vllm_sampler

    script = load_script()
    model = script.random_llama(tmp_path / "model")
    monkeypatch.setattr(script, "check_config_rules", lambda: script.report("config", True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake")
    monkeypatch.setattr(vllm_sampler, "VllmSampler", FakeSampler)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--model", str(model)])
    FakeSampler.engines = []
    with pytest.raises(SystemExit) as end:
        script.main()
    assert end.value.code == 1
    pools = {pool: (e.dtype, e.quantization, e.tensor_parallel_size) for pool, e in FakeSampler.engines}
    assert pools == {"gpu_bf16": ("bfloat16", None, 1), "gpu_fp8": ("bfloat16", "fp8", 1),
                     "gpu_engine_settings": ("bfloat16", None, 1)}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    failed = {r["check"]: r.get("error", "") for r in lines if "check" in r and not r["ok"]}
    assert failed["vllm bf16"] == "RuntimeError: no engine for gpu_bf16 here"
    assert failed["vllm fp8_e4m3"] == "RuntimeError: no engine for gpu_fp8 here"
    assert failed["deepspeed and weight sync"].startswith("skipped")
    assert lines[-1]["verdict"] == "FAILED"
