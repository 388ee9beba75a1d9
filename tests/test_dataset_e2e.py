"""task=dataset through the CLI's own entry, in this process (one Ray instance and its warm actors for
the module, ``warm_ray``): the embedded model, a user-built HF model, eval, vLLM + DeepSpeed."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.byo_model import save_model
from tests.cli import rlmix_in_process

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ray")]

ROOT = Path(__file__).resolve().parents[1]
ARITH = ROOT / "examples" / "arith"
# v1: the arith rows are in its characters, and its model is the one the suite builds anyway (a task=dataset
# run without model.path would otherwise start from v2, model.embedded_version=auto).
SMALL = ["fleet=smoke", "loop.groups_per_step=4", "loop.group_size=4", "loop.groups_per_request=2",
         "logger=disabled", "model.embedded_version=v1"]


def rlmix(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = rlmix_in_process(*args, cwd=cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_embedded_model_trains_and_evaluates_a_jsonl_task_with_a_flaky_reward(tmp_path):
    """A user reward that raises on odd answers: counted as reward/errors, the run goes on; then pass@k."""
    (tmp_path / "flaky.py").write_text(textwrap.dedent("""
        def reward(completion, answer, row):
            if int(answer) % 2:
                raise ValueError("odd answers are not scored")
            return float(completion.strip() == answer)
    """))
    (tmp_path / "eval.jsonl").write_text("".join((ARITH / "test.jsonl").read_text().splitlines(True)[:6]))
    run_dir = tmp_path / "run"
    task = ["task=dataset", f"task.train_files={ARITH / 'train.jsonl'}", "task.eval_files=eval.jsonl",
            "task.prompt_key=question", "task.reward=flaky:reward"]
    rlmix("train", "+experiment=sc_mis", *SMALL, *task, "loop.steps=3", "loop.max_new_tokens=12",
          f"hydra.run.dir={run_dir}", cwd=tmp_path)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sum(r["reward/errors"] for r in rows) > 0  # 16 prompts a step: some have odd answers
    assert all(r["reward/errors"] < 16 for r in rows)
    rlmix("eval", f"checkpoint={run_dir}", *task, "eval.samples=2", "eval.k=[1,2]", "eval.max_new_tokens=8",
          "logger=disabled", cwd=tmp_path)
    result = json.loads((run_dir / "eval_test" / "eval.json").read_text())
    assert result["task"] == "dataset" and len(result["tasks"]) == 6
    assert set(result["pass_at_k"]) == {"1", "2"} and "stderr" in result["pass_at_k"]["1"]
    odd = [r for r in result["tasks"] if r["reward_errors"]]
    assert odd and all(r["c"] == 0 for r in odd)


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2"])
def test_user_model_with_bpe_tokenizer_and_chat_template(tmp_path, arch):
    """A BPE tokenizer trained in the test, a ChatML template, a random tiny model; the math verifier."""
    model = save_model(tmp_path / "model", arch)
    run_dir = tmp_path / "run"
    rlmix("train", "+experiment=sc_mis", *SMALL, f"model.path={model}", "task=dataset",
          f"task.train_files={ARITH / 'train.jsonl'}", "task.prompt_key=question", "task.reward=math",
          "task.system_prompt=Answer with a number.", "loop.steps=2", "loop.max_new_tokens=8",
          f"hydra.run.dir={run_dir}", cwd=tmp_path)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and all(r["reward/errors"] == 0 for r in rows)
    assert (run_dir / "checkpoints" / "step_2" / "model.safetensors").is_file()


def test_vllm_pool_and_deepspeed_trainer_on_a_dataset_task(tmp_path):
    pytest.importorskip("vllm")
    pytest.importorskip("deepspeed")
    model = save_model(tmp_path / "model", "llama")
    run_dir = tmp_path / "run"
    rlmix("train", "+experiment=smoke", "fleet=vllm_cpu_smoke", "trainer=deepspeed", f"model.path={model}",
          "task=dataset", f"task.train_files={ARITH / 'train.jsonl'}", "task.prompt_key=question",
          "task.reward=math", 'task.format_regex="<p>(.*?)</p>"', "loop.steps=3", "logger=disabled",
          f"hydra.run.dir={run_dir}", cwd=tmp_path)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any("mismatch/kl_k3/cpu_vllm_bf16" in r for r in rows)
    assert all(r["format/error_rate"] > 0.5 for r in rows)  # a random model rarely writes <p>N</p>


def test_the_eval_command_a_dataset_run_prints_scores_its_rows_with_its_reward(tmp_path):
    """The run's closing block names an eval command; run as printed, it scores the user's test rows
    with the user's reward (a reward only the user's rows satisfy), not the built-in task."""
    import shlex

    (tmp_path / "mine.py").write_text("def reward(completion, answer, row):\n    return float('question' in row)\n")
    (tmp_path / "test.jsonl").write_text("".join((ARITH / "test.jsonl").read_text().splitlines(True)[:3]))
    out = rlmix("train", "+experiment=sc_mis", *SMALL, "task=dataset", f"task.train_files={ARITH / 'train.jsonl'}",
                "task.eval_files=test.jsonl", "task.prompt_key=question", "task.reward=mine:reward",
                "loop.steps=1", "loop.max_new_tokens=4", "hydra.run.dir=run", cwd=tmp_path)
    lines = out.stdout.strip().splitlines()
    printed = lines[lines.index("next:") + 1].strip()
    assert printed == "rlmix eval checkpoint=run", printed
    rlmix(*shlex.split(printed)[1:], "eval.samples=2", "eval.k=[1]", cwd=tmp_path)
    result = json.loads((tmp_path / "run" / "eval_test" / "eval.json").read_text())
    assert (result["task"], result["split"]) == ("dataset", "test")
    assert [r["task_id"] for r in result["tasks"]] == ["dataset/test/0", "dataset/test/1", "dataset/test/2"]
    assert all(r["c"] == 2 for r in result["tasks"]) and result["pass_at_k"]["1"]["mean"] == 1.0


def test_a_user_qwen3_moe_model_trains_on_the_default_emulated_fleet_with_routing_replay(tmp_path):
    """A random tiny Qwen3-MoE on the six emulated pools (fp8, nvfp4, bf16), the routing-replay arm:
    every pool serves it, the trainer logs each pool's router-flip rate, and the checkpoint is an
    HF qwen3_moe directory the torch sampler serves again."""
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler

    model = save_model(tmp_path / "model", "qwen3_moe")
    run_dir = tmp_path / "run"
    # lag mode: request i goes to sampler i mod 6, so 3 steps of 2 requests reach every pool once
    rlmix("train", "+experiment=sc_mis_replay", f"model.path={model}", "task=dataset",
          f"task.train_files={ARITH / 'train.jsonl'}", "task.prompt_key=question", "task.reward=math",
          "loop.groups_per_step=4", "loop.group_size=4", "loop.groups_per_request=2", "loop.lag=1",
          "logger=disabled", "loop.steps=3", "loop.max_new_tokens=8", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    flips = {k.split("/")[-1]: v for r in rows for k, v in r.items() if k.startswith("mismatch/router_flip/")}
    assert set(flips) == {"h100_fp8", "h200_fp8", "b200_nvfp4", "b300_nvfp4", "a100_bf16", "rtxpro6000_bf16"}
    assert all(0 <= v <= 1 for v in flips.values()) and all(0 <= r["mismatch/router_flip"] <= 1 for r in rows)
    checkpoint = run_dir / "checkpoints" / "step_3"
    assert json.loads((checkpoint / "config.json").read_text())["model_type"] == "qwen3_moe"
    TorchSampler(checkpoint, resolve_view("B200", "nvfp4"), "again")
