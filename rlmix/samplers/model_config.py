"""A model's ``config.json`` completed as ``transformers`` completes it, without importing ``transformers``.

The torch sampler needs a handful of fields with each architecture's defaults filled in. Reading
them through ``transformers.AutoConfig`` cost every sampler process ~2.4 core-seconds of import
(docs/performance.md, Start-up) for a few dozen lines of logic, restated here: one row of class
defaults per architecture (``DEFAULTS``) and the rules the config classes apply on top
(``complete``). A wrong default would be a silent sampler–trainer mismatch, so
tests/test_model_config.py checks every field against ``AutoConfig`` for every row of
``architectures.ARCHITECTURES``, with fields omitted and set; a row of that table without a row
here fails those tests and is refused at run time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from rlmix.errors import ConfigError
from rlmix.samplers.architectures import describe

# The fields the emulated decoder, ``architectures.describe`` and the torch sampler read; the
# completed mapping holds each one the architecture's config class has or the file sets.
FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "mlp_bias",
          "attention_bias", "rope_parameters", "max_position_embeddings", "sliding_window", "use_sliding_window",
          "max_window_layers", "layer_types", "pad_token_id", "eos_token_id",
          # mixtures of experts (Qwen3-MoE, Mixtral)
          "num_local_experts", "num_experts_per_tok", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
          "moe_intermediate_size", "router_jitter_noise")

_COMMON = {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "pad_token_id": None,
           "rope_theta": 10000.0}  # rope_theta: ``RotaryEmbeddingConfigMixin.default_theta``
_QWEN = _COMMON | {"vocab_size": 151936, "num_key_value_heads": 32, "max_position_embeddings": 32768,
                   "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
                   "layer_types": None, "eos_token_id": None}
# The config classes' defaults (transformers 5.x ``LlamaConfig`` ... ``Qwen3Config``). A key a class
# lacks is absent from its row: the file's value, if any, passes through as transformers keeps it.
DEFAULTS: dict[str, dict[str, object]] = {
    "llama": _COMMON | {"num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048,
                        "attention_bias": False, "mlp_bias": False, "eos_token_id": 2},
    "mistral": _COMMON | {"num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 4096 * 32,
                          "sliding_window": 4096, "eos_token_id": 2},
    "qwen2": _QWEN,
    "qwen3": _QWEN | {"head_dim": 128, "attention_bias": False},
    # No head_dim field (the attention reads ``getattr(config, "head_dim", hidden // heads)``), no
    # layer types: the window, when on, is on every layer.
    "qwen3_moe": _COMMON | {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
                            "num_key_value_heads": 4, "max_position_embeddings": 32768, "attention_bias": False,
                            "use_sliding_window": False, "sliding_window": 4096, "eos_token_id": None,
                            "num_local_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": False,
                            "decoder_sparse_step": 1, "mlp_only_layers": None, "moe_intermediate_size": 768},
    "mixtral": _COMMON | {"num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 4096 * 32,
                          "rms_norm_eps": 1e-5, "sliding_window": None, "eos_token_id": 2, "rope_theta": 1e6,
                          "num_local_experts": 8, "num_experts_per_tok": 2, "router_jitter_noise": 0.0},
}
# Classes whose head_dim stays None when unset (the attention falls back to hidden // heads itself).
_NULL_HEAD_DIM = ("mixtral",)
# transformers' ``attribute_map`` spellings: a file's ``num_experts`` is the class's ``num_local_experts``.
_ALIASES = {"num_experts": "num_local_experts"}
# Rope types whose pre-training length transformers moves into the rope parameters.
_ORIGINAL_LENGTH_ROPES = ("llama3", "yarn", "longrope")


def _rope_parameters(raw: Mapping, row: Mapping) -> dict:
    """``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`` + ``standardize_rope_params`` for one
    global rope (a 4.x ``rope_scaling`` wins over ``rope_parameters``, as there)."""
    rope = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    if any(isinstance(v, Mapping) for v in rope.values()):
        raise ConfigError(f"{raw.get('model_type')}: rope parameters per layer type are not supported by "
                          "the torch sampler; pools with `backend: vllm` serve it")
    rope.setdefault("rope_theta", raw.get("rope_theta", row["rope_theta"]))
    if raw.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] in _ORIGINAL_LENGTH_ROPES:
        if "original_max_position_embeddings" in raw:  # the top-level value wins there too
            rope["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
        else:
            rope.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings",
                                                                        row.get("max_position_embeddings")))
    return rope


def complete(raw: Mapping, where: str = "model") -> dict:
    """The ``FIELDS`` of a config.json mapping as ``AutoConfig(...).to_dict()`` has them; the
    architecture's one-line ConfigError for a model type the torch sampler does not emulate."""
    model_type = raw.get("model_type")
    if model_type == "mistral" and "layer_types" in raw:
        # AutoConfig reads this file as Ministral (alternating windows, another model class); so do we.
        model_type = "ministral"
        raw = {**raw, "model_type": model_type}
    row = DEFAULTS.get(model_type)
    if row is None:
        describe(raw, where)  # refuses an unknown architecture with its one line
        raise ConfigError(f"{where}: model_type={model_type!r} has no row in model_config.DEFAULTS")
    raw = {**{_ALIASES[k]: v for k, v in raw.items() if k in _ALIASES and _ALIASES[k] in row}, **raw}
    out = {k: raw[k] if k in raw else row[k] for k in FIELDS if k in raw or k in row}
    out["model_type"] = model_type
    out["rope_parameters"] = _rope_parameters(raw, row)
    # What the classes' __post_init__ derive.
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if "head_dim" in out and out["head_dim"] is None and model_type not in _NULL_HEAD_DIM:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    if out.get("layer_types") is not None:  # ``remap_legacy_layer_types``: the old name of full attention
        out["layer_types"] = ["full_attention" if t == "attention" else t for t in out["layer_types"]]
    if "use_sliding_window" in row and not out["use_sliding_window"]:  # Qwen: the window only with use_sliding_window
        out["sliding_window"] = None
    if "max_window_layers" in row:  # Qwen2/3: ... on the layers past max_window_layers
        if out["layer_types"] is None:
            out["layer_types"] = [
                "sliding_attention" if out["sliding_window"] is not None and i >= out["max_window_layers"]
                else "full_attention" for i in range(out["num_hidden_layers"])
            ]
    if "mlp_only_layers" in row and out["mlp_only_layers"] is None:
        out["mlp_only_layers"] = []
    return out


def read_config(model_dir: Path) -> dict:
    """``complete`` of ``model_dir/config.json``; ConfigError when absent or not JSON."""
    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"model dir {model_dir} has no readable config.json ({err.__class__.__name__})") from None
    return complete(raw, f"model dir {model_dir}")
