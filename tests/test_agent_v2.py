"""The v2 agent model (``model=embedded_v2`` with an agentic task): planned, built, cached, trained on."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlmix.commands.compose import compose_plan
from rlmix.config.embedded import AgentModelSpec, EmbeddedMoeSpec, v2_agent_hf_config
from rlmix.config.schema import SamplerBackend
from rlmix.embedded.minicode_agent import v2 as agent_v2
from rlmix.embedded.minicode_agent.model import agent_spec_key
from rlmix.embedded.minicode_agent.v2 import v2_agent_key
from rlmix.embedded.v2 import model as v2_model
from rlmix.samplers.checks import POOL_CHECKS

# head size 32 (as the single-turn tests' tiny v2); a 10-step warm start: seconds on a cold cache
TINY_MOE = EmbeddedMoeSpec(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_experts=4,
                           moe_intermediate_size=32)
TINY_AGENT = AgentModelSpec(warmup_steps=10, warmup_batch_size=4)
TINY_ARGS = ["model=embedded_v2",
             *(f"model.embedded_v2.{f}={getattr(TINY_MOE, f)}" for f in
               ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_experts", "moe_intermediate_size")),
             f"model.embedded_agent.warmup_steps={TINY_AGENT.warmup_steps}",
             f"model.embedded_agent.warmup_batch_size={TINY_AGENT.warmup_batch_size}"]


def test_pool_checks_see_the_v2_agent_fields(monkeypatch):
    """An agentic task on model=embedded_v2 plans the v2 agent model: v2's qwen3_moe with the
    agent's 512-token context, handed to every pool's check before anything is built."""
    seen = []
    monkeypatch.setitem(POOL_CHECKS, SamplerBackend.torch, lambda name, pool, model: seen.append(model) or (None, None))
    compose_plan(["model=embedded_v2", "task=minicode_agent", "fleet=single_bf16"])
    fields = v2_agent_hf_config(EmbeddedMoeSpec(), AgentModelSpec())
    assert seen and all(m == fields for m in seen)
    assert fields["model_type"] == "qwen3_moe" and fields["max_position_embeddings"] == 512
    assert {k: v for k, v in fields.items() if k != "max_position_embeddings"} == \
        {k: v for k, v in EmbeddedMoeSpec().hf_config().items() if k != "max_position_embeddings"}


def test_the_key_follows_both_specs_and_the_sources_it_builds_from(monkeypatch):
    key = v2_agent_key(TINY_MOE, TINY_AGENT)
    assert key.startswith("agent-v2-") and key == v2_agent_key(dataclasses.replace(TINY_MOE),
                                                               dataclasses.replace(TINY_AGENT))
    assert v2_agent_key(dataclasses.replace(TINY_MOE, num_experts=8), TINY_AGENT) != key
    assert v2_agent_key(TINY_MOE, dataclasses.replace(TINY_AGENT, warmup_lr=1e-3)) != key
    assert key not in (agent_spec_key(TINY_AGENT), v2_model.v2_spec_key(TINY_MOE))
    source = v2_model.module_source
    monkeypatch.setattr(v2_model, "module_source", lambda name: source(name) + "# changed\n")
    assert v2_agent_key(TINY_MOE, TINY_AGENT) != key  # the v2 package (tokenizer, corpus, shapes)
    monkeypatch.undo()
    source = agent_v2.module_source
    monkeypatch.setattr(agent_v2, "module_source", lambda name: source(name) + "# changed\n")
    assert v2_agent_key(TINY_MOE, TINY_AGENT) != key  # this builder


@pytest.mark.slow  # builds a tiny model: seconds
def test_a_tiny_v2_agent_build_is_an_hf_directory_cached_under_its_key(tmp_path, monkeypatch):
    from rlmix.assembly.parts import resolve_model_dir
    from rlmix.embedded.minicode_agent.scripted import scripted_episode
    from rlmix.embedded.minicode_agent.warmstart import episode_tokens
    from rlmix.embedded.minicode import MiniCode
    from rlmix.models.io import load_causal_lm
    from rlmix.models.tokenizer_file import load_fast_tokenizer

    import random

    monkeypatch.setenv("RLMIX_CACHE", str(tmp_path))
    plan = compose_plan([*TINY_ARGS, "task=minicode_agent"])
    messages = []
    path = resolve_model_dir(plan, progress=messages.append)
    assert path == tmp_path / "embedded" / v2_agent_key(TINY_MOE, TINY_AGENT)
    assert any("training the byte-level BPE" in m for m in messages)
    assert any(m.startswith("agent warm start step 10/10") for m in messages)
    info = json.loads((path / "rlmix_build.json").read_text())
    assert (info["kind"], info["vocab_size"], info["warmup_steps_run"]) == ("agent-v2", 300, 10)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["max_position_embeddings"] == 512
    model, tok = load_causal_lm(path), load_fast_tokenizer(path)
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and len(tok) == model.config.vocab_size == 300
    # The warm start's stream is the runtime's: the episode renders through the saved tokenizer's
    # template, and each policy turn ends with the model's end-of-turn token.
    episode = scripted_episode(MiniCode(levels=(1,), seed=0).sample(1, seed=0)[0], (1,), random.Random(0))
    ids, mask = episode_tokens(tok, episode)
    policy_turns = sum(1 for m in episode if m.role == "assistant")
    ends = [i for i, (t, m) in enumerate(zip(ids, mask)) if m and t == tok.eos_token_id == model.config.eos_token_id]
    assert len(ends) == policy_turns and len(ids) < config["max_position_embeddings"]
    messages.clear()
    assert resolve_model_dir(plan, progress=messages.append) == path and messages == []  # from the cache


@pytest.mark.slow  # the real CLI: Ray, the smoke fleet's two emulated pools serving the MoE, the trainer
def test_an_agentic_run_trains_on_the_v2_agent_with_routing_replay_and_no_model_path(tmp_path):
    """Episodes on the v2 MoE agent through ``rlmix train``: an fp8 and a bf16 emulated pool play
    them in sandboxes and record the experts they chose, the trainer takes one step on them with
    routing replay, and the run reports the episodes' endings and the router flips."""
    args = ["+experiment=sc_mis_replay", "task=minicode_agent", "task.levels=[1]", *TINY_ARGS, "fleet=smoke",
            "loop.steps=1", "loop.groups_per_step=2", "loop.group_size=2", "loop.groups_per_request=1",
            "logger=disabled", f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, "RLMIX_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([str(Path(sys.executable).with_name("rlmix")), "train", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "cache" / "embedded" / v2_agent_key(TINY_MOE, TINY_AGENT) / "rlmix_build.json").is_file()
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["agent/infra_errors"] == 0 and row["agent/turns_mean"] >= 1
    assert any(k.startswith("agent/end_reason/") for k in row)
    assert 0 <= row["mismatch/router_flip"] <= 1  # NaN (no record) would fail this
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
