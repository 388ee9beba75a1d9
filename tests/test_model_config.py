"""The config reader against ``transformers``' own configs: every field, every supported
architecture, with fields omitted (the class defaults) and set; and the decoder either builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlmix.errors import ConfigError
from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.architectures import ARCHITECTURES
from rlmix.samplers.emulated_decoder import DecoderShape, EmulatedDecoder
from rlmix.samplers.model_config import DEFAULTS, FIELDS, complete, read_config
from tests.conftest import save_tiny_decoder

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
# Config files by what they set, each written for every supported architecture.
VARIANTS = {
    "omitted": {},
    "shapes": {"vocab_size": 77, "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6,
               "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
               "max_position_embeddings": 512, "pad_token_id": 0, "eos_token_id": [2, 7]},
    "head_dim_set": {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32},
    "kv_heads_null": {"num_attention_heads": 8, "num_key_value_heads": None},
    "biases": {"attention_bias": True},
    "rope_theta_4x": {"rope_theta": 1e6},
    "rope_linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}},
    "rope_llama3_4x": {"rope_theta": 5e5, "max_position_embeddings": 8192, "rope_scaling": {**LLAMA3, "type": "llama3"}},
    "rope_llama3_length": {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 64}},
    "sliding_off": {"sliding_window": 8, "max_window_layers": 1, "num_hidden_layers": 3},
    "sliding_on": {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1, "num_hidden_layers": 3},
    "sliding_default": {"use_sliding_window": True, "num_hidden_layers": 30},
    "sliding_null": {"sliding_window": None},
    "layer_types_set": {"use_sliding_window": True, "sliding_window": 5, "num_hidden_layers": 3,
                        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "layer_types_legacy": {"num_hidden_layers": 2, "layer_types": ["attention", "full_attention"]},
    # mixtures of experts: the 4.x name num_experts (Qwen3-MoE files), the class's num_local_experts
    "experts": {"num_experts": 6, "num_experts_per_tok": 3, "norm_topk_prob": True, "decoder_sparse_step": 2,
                "mlp_only_layers": [0], "moe_intermediate_size": 24, "router_jitter_noise": 0.0},
    "experts_local": {"num_local_experts": 5, "num_experts_per_tok": 1, "mlp_only_layers": None},
}

# Files transformers refuses outright (MistralConfig, Qwen3MoeConfig and MixtralConfig type
# num_key_value_heads as int, not None).
REFUSED_BY_TRANSFORMERS = {("mistral", "kv_heads_null"), ("qwen3_moe", "kv_heads_null"), ("mixtral", "kv_heads_null")}


def _hf_fields(model_dir: Path) -> dict:
    """What ``transformers`` makes of ``model_dir/config.json``, restricted to the reader's fields."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir).to_dict()
    return {k: hf[k] for k in FIELDS if k in hf}


def _write(path: Path, fields: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(fields))
    return path


def test_every_supported_architecture_has_a_defaults_row():
    """A row added to ARCHITECTURES without one here fails (and the reader refuses its configs)."""
    assert set(DEFAULTS) == set(ARCHITECTURES)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))  # not DEFAULTS: a missing row must fail here too
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_field_matches_transformers(model_type, variant, tmp_path):
    model_dir = _write(tmp_path / "m", {"model_type": model_type} | VARIANTS[variant])
    try:
        hf = _hf_fields(model_dir)
    except Exception as err:  # a strict type check; the trainer cannot load such a file either
        assert (model_type, variant) in REFUSED_BY_TRANSFORMERS, err
        return
    if hf["model_type"] not in ARCHITECTURES:  # transformers reads it as another architecture
        with pytest.raises(ConfigError, match=f"model_type='{hf['model_type']}'.*not supported"):
            read_config(model_dir)
        return
    mine = read_config(model_dir)
    assert mine == hf
    assert {"model_type", "vocab_size", "num_key_value_heads", "rope_parameters"} <= mine.keys()


def test_the_embedded_models_config_matches_transformers(tmp_path):
    from rlmix.config.embedded import EmbeddedModelSpec
    from rlmix.embedded.model import llama_config

    llama_config(EmbeddedModelSpec(), 40, {"pad": 0, "bos": 1, "eos": 2}).save_pretrained(tmp_path)
    assert read_config(tmp_path) == _hf_fields(tmp_path)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_the_decoder_from_either_reading_gives_identical_logits(model_type, tmp_path):
    model_dir = save_tiny_decoder(tmp_path / model_type, model_type)
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")
    ids = torch.randint(3, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = []
    for fields in (read_config(model_dir), _hf_fields(model_dir)):
        decoder = EmulatedDecoder(DecoderShape.from_fields(fields), PrecisionView.exact())
        decoder.load(weights)
        positions = torch.arange(12).expand(2, 12)
        logits.append(decoder.forward(ids, positions, torch.ones(2, 12, dtype=torch.bool), decoder.new_cache(2, 12), 0))
    assert torch.equal(*logits)


@pytest.mark.parametrize("raw, match", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, r"GPT2LMHeadModel \(model_type='gpt2'\).*vllm"),
    ({"architectures": ["FooForCausalLM"]}, r"model_type=None"),
    ({"model_type": "qwen2", "layer_types": ["full_attention"],
      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}}, r"per layer type"),
])
def test_configs_it_cannot_complete_are_one_line(raw, match):
    with pytest.raises(ConfigError, match=match) as err:
        complete(raw)
    assert "\n" not in str(err.value)


def test_a_supported_architecture_without_a_defaults_row_is_refused(monkeypatch):
    monkeypatch.delitem(DEFAULTS, "mistral")
    with pytest.raises(ConfigError, match=r"model_type='mistral' has no row in model_config.DEFAULTS"):
        complete({"model_type": "mistral"})


def test_unreadable_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no readable config.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"no readable config.json \(JSONDecodeError\)"):
        read_config(tmp_path)


@pytest.mark.parametrize("fields, positions, where", [
    ({"model_type": "gpt2", "n_positions": 1024}, 1024, "n_positions in"),
    ({"model_type": "llava", "text_config": {"max_position_embeddings": 4096}}, 4096,
     "text_config.max_position_embeddings in"),
    ({"model_type": "chatglm", "max_position_embeddings": 8192, "seq_length": 2048}, 2048, "seq_length in"),
    ({"model_type": "llama"}, 2048, "llama's default max_position_embeddings"),  # LlamaConfig's default
    ({"model_type": "something_new"}, None, None),
])
def test_the_models_context_is_read_wherever_its_config_states_it(fields, positions, where, tmp_path):
    # Read as max_position_embeddings alone, a GPT-2 or a vision-language config, or a Llama file
    # that leaves it to the default, stated no context: prompts past it were never refused.
    from rlmix.assembly.parts import model_context, room_for_prompts

    (tmp_path / "config.json").write_text(json.dumps(fields))
    context = model_context(tmp_path)
    assert (context and context[0], context and context[1].split(str(tmp_path))[0].strip()) == (positions, where)
    if positions is not None:
        with pytest.raises(ConfigError, match=f"the model takes {positions} positions in all \\({where}"):
            room_for_prompts(tmp_path, positions, "loop.max_new_tokens")


@pytest.mark.slow  # a fresh interpreter builds a sampler worker: ~14 s
def test_a_sampler_worker_never_imports_transformers(tiny_llama_dir):
    """Start-up cost: ``transformers`` is ~2.4 core-seconds per sampler process (docs/performance.md),
    OmegaConf and Hydra ~0.13; the actor's whole path — worker, torch sampler, tokenizer, task, one
    request — runs without them."""
    script = f"""
import sys
from rlmix.assembly.fleet import SamplerSpec, sampling_params
from rlmix.assembly.parts import make_task
from rlmix.assembly.task_kinds import task_kind
from rlmix.assembly.plan import plan_pool
from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import MiniCodeTaskConfig, PoolConfig, RunConfig
from rlmix.orchestration.workers import SamplerWorker, make_request

pool = PoolConfig(accelerator="H100", precision="fp8_e4m3")
cfg = RunConfig(task=MiniCodeTaskConfig())
cfg.loop.max_new_tokens = 4
planned = plan_pool("h100", pool, cfg, None)
params = sampling_params(planned, cfg, resolve_correction(cfg.correction), (2,))
spec = SamplerSpec("h100", 0, pool, params, planned.view)
worker = SamplerWorker(spec, {str(tiny_llama_dir)!r}, task_kind(cfg.task), seed=0, threads=1)
out = worker.generate(make_request(make_task(cfg.task, 0), 0, 1, 0), 2, None, 0)
assert len(out) == 2, len(out)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "omegaconf", "hydra"))[:5])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
