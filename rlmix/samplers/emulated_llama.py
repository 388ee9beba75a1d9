"""A Llama forward pass with precision hooks: the torch sampler's model.

Same math as Hugging Face ``LlamaForCausalLM`` (RMSNorm, RoPE with ``rope_theta``, grouped-query
attention, SiLU-gated MLP, tied or untied lm_head); under ``PrecisionView.exact()`` its log-probs
match HF fp32 to ~1e-5. Under other views it computes with the values the emulated hardware
would: decoder linear weights quantise-dequantised once per weight version, every activation
rounded after each matmul / norm / residual add, linear-layer inputs quantised (W8A8), the KV
cache stored in its format, and attention by the view's kernel family.

Shapes: B batch, L new positions, C cache columns, H query heads, Hkv KV heads, G = H / Hkv,
D head dim, V vocabulary. Everything is computed in fp32 tensors holding the rounded values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlmix.errors import ConfigError
from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.attention import attend
from rlmix.samplers.precision import quantize_dequantize, round_activation, round_kv

_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class LlamaShape:
    """The parts of a HF Llama config the forward pass needs."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    tie_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg) -> LlamaShape:
        """Read a ``transformers`` Llama-family config; ConfigError for features not emulated."""
        model_type = getattr(cfg, "model_type", "llama")
        if model_type != "llama":
            raise ConfigError(f"model_type={model_type!r} is not supported by the torch sampler (llama only); "
                              "use the vllm sampler backend for other architectures")
        theta = _default_rope_theta(cfg)
        if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "attention_bias", False) \
                or getattr(cfg, "mlp_bias", False):
            raise ConfigError("torch sampler supports Llama models with hidden_act=silu and no attention/mlp bias")
        heads = cfg.num_attention_heads
        return cls(
            vocab=cfg.vocab_size,
            hidden=cfg.hidden_size,
            layers=cfg.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            rms_eps=cfg.rms_norm_eps,
            rope_theta=float(theta),
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )


def _default_rope_theta(cfg) -> float:
    """``rope_theta`` of a default-RoPE config (transformers 5 ``rope_parameters`` or 4.x
    ``rope_theta``/``rope_scaling``); ConfigError for scaled RoPE variants."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    for params in (rope, scaling):
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"model rope_type={rope_type!r} is not supported by the torch sampler; allowed: default")
    return rope["rope_theta"] if "rope_theta" in rope else cfg.rope_theta


@dataclass
class Layer:
    """One decoder block's parameters after this view's quantisation (fp32 tensors)."""

    ln_attn: torch.Tensor  # (hidden,)
    w_qkv: torch.Tensor  # ((H + 2·Hkv)·D, hidden): q, k, v stacked (scales are per row, so stacking is exact)
    w_o: torch.Tensor  # (hidden, H·D)
    ln_mlp: torch.Tensor  # (hidden,)
    w_gate_up: torch.Tensor  # (2·I, hidden)
    w_down: torch.Tensor  # (hidden, I)


class KVCache:
    """Preallocated keys/values per layer, (B, Hkv, C, D) each, holding values in the view's KV format."""

    def __init__(self, shape: LlamaShape, batch: int, max_len: int) -> None:
        size = (shape.layers, batch, shape.kv_heads, max_len, shape.head_dim)
        self.k = torch.zeros(size)
        self.v = torch.zeros(size)


class EmulatedLlama:
    """Llama forward under a ``PrecisionView``; weights set with ``load``."""

    def __init__(self, shape: LlamaShape, view: PrecisionView) -> None:
        self.shape = shape
        self.view = view
        exponents = torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim
        self.inv_freq = 1.0 / (shape.rope_theta**exponents)  # as HF's default rope init
        self.layers: list[Layer] = []

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Apply the view to a HF-named state dict: decoder linears in the weight format, embeddings,
        norms and lm_head in the activation dtype (as fp8/int/fp4 serving recipes keep them)."""
        missing = [n for n in self._required_names() if n not in weights]
        if missing:
            raise ValueError(f"weights lack {len(missing)} Llama parameters, e.g. {missing[:3]}")
        act, view = self.view.activations, self.view

        def w(name: str) -> torch.Tensor:
            return quantize_dequantize(weights[name], view.weights, view.int4_group)

        def a(name: str) -> torch.Tensor:
            return round_activation(weights[name].float(), act)

        self.embed = a("model.embed_tokens.weight")
        self.lm_head = self.embed if self.shape.tie_embeddings else a("lm_head.weight")
        self.norm = a("model.norm.weight")
        self.layers = []
        for i in range(self.shape.layers):
            p = f"model.layers.{i}."
            qkv = [w(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            gate_up = [w(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
            self.layers.append(Layer(
                a(p + "input_layernorm.weight"), torch.cat(qkv), w(p + "self_attn.o_proj.weight"),
                a(p + "post_attention_layernorm.weight"), torch.cat(gate_up), w(p + "mlp.down_proj.weight"),
            ))

    def _required_names(self) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.shape.tie_embeddings:
            names.append("lm_head.weight")
        for i in range(self.shape.layers):
            names += [f"model.layers.{i}.{n}.weight" for n in _LINEARS]
            names += [f"model.layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")]
        return names

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.shape, batch, max_len)

    # -- pieces -----------------------------------------------------------------------------

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        return round_activation(x, self.view.activations)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x Wᵀ`` with inputs in the view's linear-input format, output rounded to the activation dtype.

        Inputs already hold activation-dtype values, so they are re-quantised only for W8A8 views."""
        if self.view.linear_inputs is not self.view.activations:
            x = round_activation(x, self.view.linear_inputs)
        return self._act(F.linear(x, weight))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """HF LlamaRMSNorm: ``weight · x / sqrt(mean(x²) + eps)`` in fp32, normalised value rounded first."""
        normed = self._act(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.shape.rms_eps))
        return self._act(weight * normed)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """HF ``apply_rotary_pos_emb``: ``x·cos + rotate_half(x)·sin``; x (B, h, L, D), cos/sin (B, 1, L, D)."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return self._act(x * cos + rotated * sin)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (B, 1, L, D) exactly as HF LlamaRotaryEmbedding computes them (default rope)."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]

    def _attention(self, x, layer: Layer, i: int, rope, cache: KVCache, start: int, allowed) -> torch.Tensor:
        s, (b, n, _) = self.shape, x.shape
        qkv = self._linear(x, layer.w_qkv)
        q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        q = self._rope(q.view(b, n, s.heads, s.head_dim).transpose(1, 2), *rope)
        k = self._rope(k.view(b, n, s.kv_heads, s.head_dim).transpose(1, 2), *rope)
        v = v.view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        end = start + n
        if self.view.kv_cache is not self.view.activations:  # else k, v already hold these values
            k, v = round_kv(k, self.view.kv_cache), round_kv(v, self.view.kv_cache)
        cache.k[i, :, :, start:end] = k
        cache.v[i, :, :, start:end] = v
        group = s.heads // s.kv_heads
        # Query heads sharing a KV head are stacked along the query axis: (B, Hkv, G·L, D).
        q = q.reshape(b, s.kv_heads, group * n, s.head_dim)
        out = attend(q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], allowed,
                     s.head_dim**-0.5, self.view.activations, self.view.kernel)
        out = out.view(b, s.heads, n, s.head_dim).transpose(1, 2).reshape(b, n, s.heads * s.head_dim)
        return self._linear(out, layer.w_o)

    def _mlp(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        gate, up = self._linear(x, layer.w_gate_up).chunk(2, dim=-1)
        return self._linear(self._act(F.silu(gate) * up), layer.w_down)

    # -- forward ----------------------------------------------------------------------------

    def forward(self, ids, positions, key_valid, cache: KVCache, start: int, last_only: bool = False):
        """Logits (B, L, V) — or (B, 1, V) with ``last_only`` — fp32, for ``ids`` (B, L) written at
        cache columns [start, start + L).

        ``positions`` (B, L): RoPE positions. ``key_valid`` (B, start + L) bool: columns holding
        real tokens (False for left padding). A query attends to valid columns at or before its
        own; a padding query attends to itself only, so no row is empty.
        """
        b, n = ids.shape
        end = start + n
        cols = torch.arange(end)
        rows = torch.arange(start, end)
        causal = cols[None, :] <= rows[:, None]  # (L, C)
        allowed = (causal[None] & key_valid[:, None, :]) | (cols[None, :] == rows[:, None])[None]
        group = self.shape.heads // self.shape.kv_heads
        allowed = allowed[:, None, None].expand(b, 1, group, n, end).reshape(b, 1, group * n, end)
        rope = self._rope_tables(positions)
        h = self.embed[ids]
        for i, layer in enumerate(self.layers):
            h = self._act(h + self._attention(self._rms_norm(h, layer.ln_attn), layer, i, rope, cache, start, allowed))
            h = self._act(h + self._mlp(self._rms_norm(h, layer.ln_mlp), layer))
        if last_only:
            h = h[:, -1:]
        return self._act(F.linear(self._rms_norm(h, self.norm), self.lm_head))
