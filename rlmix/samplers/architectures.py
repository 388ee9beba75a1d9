"""The decoder architectures the torch sampler emulates: one table row per Hugging Face ``model_type``.

Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE and Mixtral share one forward pass (RMSNorm, rotary
embeddings, grouped-query attention, SiLU-gated MLP or a sparse mixture of SiLU-gated experts); a
row says only what differs. ``describe`` reads a
``config.json`` as a plain mapping, completed with the architecture's defaults
(``model_config.complete``) both in the run's pre-flight check and in the model build, so the two
apply the same rules. Nothing here imports torch or transformers: the check answers in
milliseconds, before Ray starts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from rlmix.errors import ConfigError


class Bias(enum.Enum):
    """Which attention projections carry a bias."""

    none = "none"
    qkv = "qkv"  # q, k and v always; o never (Qwen2)
    config = "config"  # q, k, v and o when the config's ``attention_bias`` is true (Llama, Qwen3)


class Window(enum.Enum):
    """Where a sliding attention window comes from."""

    none = "none"
    every_layer = "every_layer"  # ``sliding_window`` on every layer when set (Mistral)
    layer_types = "layer_types"  # ``sliding_window`` on the layers ``layer_types`` marks "sliding_attention" (Qwen)


class Experts(enum.Enum):
    """Whether the MLP is a sparse mixture of experts, and how its checkpoint names and routes them."""

    none = "none"
    # mlp.gate, mlp.experts.{e}.{gate,up,down}_proj; sparse layers by decoder_sparse_step and
    # mlp_only_layers; the top-k weights renormalised only with norm_topk_prob (Qwen3-MoE)
    qwen = "qwen"
    # block_sparse_moe.gate, block_sparse_moe.experts.{e}.w1/w3/w2 (gate/up/down); every layer
    # sparse; the top-k weights always renormalised (Mixtral)
    mixtral = "mixtral"


# Saved (per-expert) checkpoint names: (module prefix, gate, up, down). transformers 5 holds the
# experts fused in memory (mlp.experts.gate_up_proj / down_proj), which is what a trainer publishes.
EXPERT_NAMES = {
    Experts.qwen: ("mlp", "gate_proj", "up_proj", "down_proj"),
    Experts.mixtral: ("block_sparse_moe", "w1", "w3", "w2"),
}


@dataclass(frozen=True)
class Architecture:
    """What one architecture changes in the shared decoder forward."""

    bias: Bias
    qk_norm: bool  # RMSNorm over each head's q and k before the rotation (Qwen3)
    window: Window
    experts: Experts = Experts.none


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(Bias.config, qk_norm=False, window=Window.none),
    "mistral": Architecture(Bias.none, qk_norm=False, window=Window.every_layer),
    "qwen2": Architecture(Bias.qkv, qk_norm=False, window=Window.layer_types),
    "qwen3": Architecture(Bias.config, qk_norm=True, window=Window.layer_types),
    # the window (only with use_sliding_window, model_config.complete) on every layer
    "qwen3_moe": Architecture(Bias.config, qk_norm=True, window=Window.every_layer, experts=Experts.qwen),
    "mixtral": Architecture(Bias.none, qk_norm=False, window=Window.every_layer, experts=Experts.mixtral),
}
# Rotary variants whose frequencies are fixed at load (a length-dependent one, e.g. dynamic NTK,
# would change the logits of a prefix as the sequence grows); the tables are in emulated_decoder.py.
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class MoeSpec:
    """A sparse MLP's routing: softmax over ``experts`` router logits, the ``top_k`` largest kept."""

    experts: int
    top_k: int
    renormalize: bool  # the kept probabilities divided by their sum (Mixtral; Qwen3-MoE's norm_topk_prob)
    sparse: tuple[bool, ...]  # per layer: a mixture of experts (else a dense SiLU-gated MLP)

    @property
    def layers(self) -> tuple[int, ...]:
        """Indices of the sparse layers: the order of a rollout's ``routed_experts`` axis."""
        return tuple(i for i, s in enumerate(self.sparse) if s)


@dataclass(frozen=True)
class ModelSpec:
    """A supported config, read: the architecture row and the values the forward pass needs."""

    model_type: str
    arch: Architecture
    rope_type: str
    rope: Mapping[str, float]  # rope_theta plus the variant's own parameters (factor, ...)
    attention_bias: bool  # projections q, k, v carry a bias
    o_bias: bool  # the output projection carries one
    windows: tuple[int | None, ...]  # per layer: the sliding window, None for full attention
    moe: MoeSpec | None = None  # None: a dense model


def _rope(fields: Mapping) -> tuple[str, dict]:
    """(rope_type, parameters) from either spelling: transformers 5 ``rope_parameters`` or 4.x
    ``rope_theta`` + ``rope_scaling`` (``type`` in older files)."""
    params = dict(fields.get("rope_scaling") or {}) | dict(fields.get("rope_parameters") or {})
    params.setdefault("rope_theta", fields.get("rope_theta") or 10000.0)
    return params.get("rope_type", params.get("type", "default")), params


def _windows(fields: Mapping, arch: Architecture, layers: int) -> tuple[int | None, ...]:
    window = fields.get("sliding_window")
    if arch.window is Window.every_layer:
        return (window,) * layers
    if arch.window is Window.layer_types and window is not None and fields.get("use_sliding_window", False):
        types = fields.get("layer_types") or ["full_attention"] * layers
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (None,) * layers


def _moe(fields: Mapping, arch: Architecture, layers: int, where: str) -> MoeSpec | None:
    if arch.experts is Experts.none:
        return None
    model_type = fields.get("model_type")
    jitter = fields.get("router_jitter_noise") or 0.0
    if jitter:  # the trainer's train-mode forward would scale its router input by random noise
        raise ConfigError(f"{where}: {model_type} with router_jitter_noise={jitter!r} is not supported by the "
                          "torch sampler (allowed: 0.0); pools with `backend: vllm` serve it")
    experts = int(fields.get("num_local_experts") or 0)
    if arch.experts is Experts.mixtral:
        return MoeSpec(experts, int(fields["num_experts_per_tok"]), True, (True,) * layers)
    step, dense = int(fields.get("decoder_sparse_step") or 1), set(fields.get("mlp_only_layers") or ())
    sparse = tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(layers))
    return MoeSpec(experts, int(fields["num_experts_per_tok"]), bool(fields.get("norm_topk_prob")), sparse)


def describe(fields: Mapping, where: str = "model") -> ModelSpec:
    """The ``ModelSpec`` of a config mapping; one-line ``ConfigError`` naming what is not emulated."""
    model_type = fields.get("model_type")
    if model_type not in ARCHITECTURES:
        archs = ",".join(fields.get("architectures") or []) or "?"
        raise ConfigError(
            f"{where}: architecture {archs} (model_type={model_type!r}) is not supported by the torch sampler "
            f"(supported: {', '.join(ARCHITECTURES)}); pools with `backend: vllm` serve it"
        )
    arch = ARCHITECTURES[model_type]
    refused = {
        "hidden_act": (fields.get("hidden_act", "silu"), "silu"),
        "mlp_bias": (bool(fields.get("mlp_bias", False)), False),
    }
    for key, (value, allowed) in refused.items():
        if value != allowed:
            raise ConfigError(f"{where}: {model_type} with {key}={value!r} is not supported by the torch sampler "
                              f"(allowed: {allowed!r}); pools with `backend: vllm` serve it")
    rope_type, rope = _rope(fields)
    if rope_type not in ROPE_TYPES or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"{where}: rope_type={rope_type!r} is not supported by the torch sampler "
                          f"(allowed: {', '.join(ROPE_TYPES)}); pools with `backend: vllm` serve it")
    config_bias = arch.bias is Bias.config and bool(fields.get("attention_bias", False))
    layers = int(fields.get("num_hidden_layers", 0))
    return ModelSpec(model_type, arch, rope_type, rope, attention_bias=arch.bias is Bias.qkv or config_bias,
                     o_bias=config_bias, windows=_windows(fields, arch, layers), moe=_moe(fields, arch, layers, where))
