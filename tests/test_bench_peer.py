"""``make bench-peer``'s workload, checked without running either trainer (scripts/bench_peer.py).

The benchmark compares step times, so what must hold is that both sides do the same work: rlmix
accepts the workload's Qwen3 directory and rows under the benchmark's own overrides, in each of its
three arms; both sides render the same prompt ids; and the reward gives the same number through
rlmix's call and TRL's.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

from rlmix.commands.compose import compose_plan
from rlmix.models.tokenizer_file import load_fast_tokenizer
from rlmix.tasks.chat import render_ids
from rlmix.tasks.rewards import resolve_reward

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
STEPS = 12


def import_script(name: str):
    """A module of scripts/, imported without leaving the benchmarks' environment defaults behind."""
    with mock.patch.dict(os.environ), mock.patch.object(sys, "path", [str(SCRIPTS), *sys.path]):
        return importlib.import_module(name)


bench = import_script("bench_peer")
peer_trl = import_script("peer_trl")


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    return bench.build_workload(tmp_path_factory.mktemp("peer") / "workload")


def plan_for(workload, arm: list[str], monkeypatch):
    monkeypatch.chdir(workload.root)  # where rlmix runs: task.reward's module is imported from it
    return compose_plan([*workload.rlmix_overrides(), *bench.loop_overrides(STEPS), *arm])


def test_the_workload_is_an_ordinary_qwen3_directory_with_a_fast_tokenizer(workload):
    config = json.loads((workload.model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert (workload.model_dir / "tokenizer.json").is_file()
    rows = [json.loads(line) for line in workload.prompts.read_text().splitlines()]
    assert len(rows) >= bench.GROUPS and all(set(r) == {"question", "answer"} for r in rows)


@pytest.mark.parametrize("arm", sorted(bench.ARMS))
def test_each_arm_composes_into_the_step_the_bench_compares(workload, arm, monkeypatch):
    """The bench's overrides on the workload plan a run of 16 prompts x 8 samples, 24 new tokens."""
    plan = plan_for(workload, bench.ARMS[arm], monkeypatch)
    loop = plan.cfg.loop
    assert (loop.groups_per_step, loop.group_size, loop.max_new_tokens, loop.steps) == (16, 8, 24, STEPS)
    pools = {"one_pool": ["h100_fp8"], "six_pools": list(bench.DEFAULT_POOLS),
             "synchronous": list(bench.DEFAULT_POOLS)}[arm]
    assert list(plan.pools) == pools  # DEFAULT_POOLS is the default fleet, in its order
    assert loop.max_staleness == (0 if arm == "synchronous" else None)
    assert plan.cfg.task.reward == "peer_reward:reward" and plan.cfg.model.path == str(workload.model_dir)


def test_both_sides_sample_from_the_same_prompt_ids(workload, monkeypatch):
    """rlmix's sampler renders the row through the tokenizer file; TRL through transformers'
    apply_chat_template on its conversational prompt column (scripts/peer_trl.py)."""
    from transformers import AutoTokenizer

    plan = plan_for(workload, [], monkeypatch)
    tokenizer = load_fast_tokenizer(workload.model_dir)
    task = plan.task.build(0, tokenizer)  # ConfigError if the tokenizer cannot encode the rows
    hf = AutoTokenizer.from_pretrained(workload.model_dir)
    trl_rows = peer_trl.load_rows(workload.prompts)
    for problem in task.sample_at(0, bench.GROUPS):
        index = int(problem.task_id.rsplit("/", 1)[1])
        ours = render_ids(tokenizer, problem.messages, plan.cfg.task.chat_template)
        theirs = hf.apply_chat_template(trl_rows[index]["prompt"], add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
        assert ours == list(theirs)
        assert hf.decode(ours).endswith("<|im_start|>assistant\n")


def test_the_reward_is_the_same_through_rlmixs_call_and_trls(workload, monkeypatch):
    monkeypatch.chdir(workload.root)
    ours = resolve_reward(workload.reward_spec, timeout_s=5.0)
    trl_reward = sys.modules["peer_reward"].trl_reward  # the copy in the workload, which both import
    rows = [{"question": f"q{i}", "answer": "12"} for i in range(4)]
    texts = ["12", "it is 12!", "3456", "none"]
    expected = [ours.grade(t, r["answer"], r).reward for t, r in zip(texts, rows)]
    assert expected == [1.0, 0.5, 0.25, 0.0]  # exact; the answer inside; four digits; nothing
    columns = {key: [r[key] for r in rows] for key in ("question", "answer")}
    chat = [[{"role": "assistant", "content": t}] for t in texts]
    for completions in (chat, texts):  # conversational prompts (the bench's) and plain text
        assert trl_reward([None] * 4, completions, **columns, trainer_state=None, completion_ids=None) == expected
