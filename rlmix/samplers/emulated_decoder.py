"""The torch sampler's model: one decoder forward pass with precision hooks.

Same math as Hugging Face ``LlamaForCausalLM`` and the architectures that differ from it only in
the ways ``rlmix.samplers.architectures`` tabulates (Mistral's sliding window, Qwen2's q/k/v bias,
Qwen3's per-head q/k RMSNorm, Qwen3-MoE's and Mixtral's sparse experts): RMSNorm, RoPE (default,
linear or Llama-3 scaled frequencies), grouped-query attention, SiLU-gated MLP or a top-k mixture
of SiLU-gated experts, tied or untied lm_head. Under ``PrecisionView.exact()``
its log-probs match HF fp32 to ~1e-5 for each architecture. Under other views it computes with
the values the emulated hardware would: decoder linear weights quantise-dequantised once per
weight version, every activation rounded after each matmul / norm / residual add, linear-layer
inputs quantised (W8A8), the KV cache stored in its format, and attention by the view's kernel
family. Biases and norm weights are kept in the activation dtype, as serving recipes keep them.
Experts are quantised like the other linear weights; the router is not (``_moe``), so a pool
routes by its own rounded hidden states and may pick other experts than the trainer.

Shapes: B batch, L new positions, C cache columns, H query heads, Hkv KV heads, G = H / Hkv,
D head dim, V vocabulary. Everything is computed in fp32 tensors holding the rounded values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlmix.samplers.accelerators import PrecisionView
from rlmix.samplers.architectures import EXPERT_NAMES, ModelSpec, describe
from rlmix.samplers.attention import attend
from rlmix.samplers.precision import fp8_qdq_tensor, quantize_dequantize, round_activation, round_kv

_ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class DecoderShape:
    """The parts of a HF decoder config the forward pass needs."""

    spec: ModelSpec
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    tie_embeddings: bool

    @classmethod
    def from_fields(cls, fields: Mapping) -> DecoderShape:
        """Read a complete config mapping (``model_config.complete``: the class defaults filled in)
        of a supported architecture; ConfigError otherwise."""
        spec = describe(fields)  # first: an unsupported config may lack the fields read below
        heads = fields["num_attention_heads"]
        return cls(
            spec=spec,
            vocab=fields["vocab_size"],
            hidden=fields["hidden_size"],
            layers=fields["num_hidden_layers"],
            heads=heads,
            kv_heads=fields.get("num_key_value_heads") or heads,
            head_dim=fields.get("head_dim") or fields["hidden_size"] // heads,
            rms_eps=fields["rms_norm_eps"],
            tie_embeddings=bool(fields.get("tie_word_embeddings", False)),
        )


def _default_inv_freq(rope: Mapping, dim: int) -> torch.Tensor:
    """``1 / θ^(2i/D)`` in fp32, as HF's default rope init (integer exponents, then cast)."""
    return 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _linear_inv_freq(rope: Mapping, dim: int) -> torch.Tensor:
    """Position interpolation: every frequency divided by ``factor``."""
    return _default_inv_freq(rope, dim) / rope["factor"]


def _llama3_inv_freq(rope: Mapping, dim: int) -> torch.Tensor:
    """Llama 3.1 scaling: wavelengths above ``original_max_position_embeddings / low_freq_factor``
    are stretched by ``factor``, those below ``... / high_freq_factor`` kept, the band between
    interpolated smoothly (HF ``_compute_llama3_parameters``)."""
    inv_freq = _default_inv_freq(rope, dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


# One row per rope_type of ``architectures.ROPE_TYPES``; each keeps HF's attention factor of 1.
INV_FREQ = {"default": _default_inv_freq, "linear": _linear_inv_freq, "llama3": _llama3_inv_freq}


@dataclass
class ExpertWeights:
    """A sparse MLP's parameters: E experts of intermediate size I."""

    router: torch.Tensor  # (E, hidden), in the activation dtype, never quantised
    gate_up: torch.Tensor  # (E, 2·I, hidden), each expert quantised as its own matrix
    down: torch.Tensor  # (E, hidden, I)


@dataclass
class Layer:
    """One decoder block's parameters after this view's quantisation (fp32 tensors)."""

    ln_attn: torch.Tensor  # (hidden,)
    w_qkv: torch.Tensor  # ((H + 2·Hkv)·D, hidden): q, k, v stacked (scales are per row, so stacking is exact)
    w_o: torch.Tensor  # (hidden, H·D)
    ln_mlp: torch.Tensor  # (hidden,)
    w_gate_up: torch.Tensor | None  # (2·I, hidden); None in a sparse layer
    w_down: torch.Tensor | None  # (hidden, I)
    experts: ExpertWeights | None = None  # a sparse layer's experts
    b_qkv: torch.Tensor | None = None  # ((H + 2·Hkv)·D,)
    b_o: torch.Tensor | None = None  # (hidden,)
    q_norm: torch.Tensor | None = None  # (D,)
    k_norm: torch.Tensor | None = None  # (D,)


class KVCache:
    """Preallocated keys/values per layer, (B, Hkv, C, D) each, holding values in the view's KV format."""

    def __init__(self, shape: DecoderShape, batch: int, max_len: int) -> None:
        size = (shape.layers, batch, shape.kv_heads, max_len, shape.head_dim)
        self.k = torch.zeros(size)
        self.v = torch.zeros(size)


class EmulatedDecoder:
    """The decoder forward under a ``PrecisionView``; weights set with ``load``."""

    def __init__(self, shape: DecoderShape, view: PrecisionView) -> None:
        self.shape = shape
        self.view = view
        self.inv_freq = INV_FREQ[shape.spec.rope_type](shape.spec.rope, shape.head_dim)  # (D/2,)
        self.layers: list[Layer] = []

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Apply the view to a HF-named state dict: decoder linears in the weight format, embeddings,
        norms, biases and lm_head in the activation dtype (as fp8/int/fp4 serving recipes keep them)."""
        missing = [n for n in self._required_names(weights) if n not in weights]
        if missing:
            raise ValueError(f"weights lack {len(missing)} {self.shape.spec.model_type} parameters, e.g. {missing[:3]}")
        act, view, spec = self.view.activations, self.view, self.shape.spec

        def w(name: str) -> torch.Tensor:
            return quantize_dequantize(weights[name], view.weights, view.int4_group, per_tensor=view.per_tensor)

        def a(name: str) -> torch.Tensor:
            return round_activation(weights[name].float(), act)

        moe = spec.moe
        self.embed = a("model.embed_tokens.weight")
        self.lm_head = self.embed if self.shape.tie_embeddings else a("lm_head.weight")
        self.norm = a("model.norm.weight")
        self.layers = []
        for i in range(self.shape.layers):
            p = f"model.layers.{i}."
            qkv = [w(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            sparse = moe is not None and moe.sparse[i]
            experts = self._experts(weights, p, a) if sparse else None
            self.layers.append(Layer(
                a(p + "input_layernorm.weight"), torch.cat(qkv), w(p + "self_attn.o_proj.weight"),
                a(p + "post_attention_layernorm.weight"),
                None if sparse else torch.cat([w(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]),
                None if sparse else w(p + "mlp.down_proj.weight"),
                experts=experts,
                b_qkv=torch.cat([a(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if spec.attention_bias else None,
                b_o=a(p + "self_attn.o_proj.bias") if spec.o_bias else None,
                q_norm=a(p + "self_attn.q_norm.weight") if spec.arch.qk_norm else None,
                k_norm=a(p + "self_attn.k_norm.weight") if spec.arch.qk_norm else None,
            ))

    def _experts(self, weights: Mapping[str, torch.Tensor], p: str, a) -> ExpertWeights:
        """Layer ``p``'s experts from either layout: fused (E, 2·I, hidden) / (E, hidden, I) tensors as
        transformers 5 holds them in memory (a trainer's published weights), or one matrix per
        expert as checkpoints store them (module, gate, up, down names: ``EXPERT_NAMES``)."""
        view, moe = self.view, self.shape.spec.moe
        module, gate, up, down = EXPERT_NAMES[self.shape.spec.arch.experts]

        def w(t: torch.Tensor) -> torch.Tensor:
            return quantize_dequantize(t, view.weights, view.int4_group, per_tensor=view.per_tensor)

        if p + "mlp.experts.gate_up_proj" in weights:
            gate_up = torch.stack([w(t) for t in weights[p + "mlp.experts.gate_up_proj"]])
            downs = torch.stack([w(t) for t in weights[p + "mlp.experts.down_proj"]])
            router = p + "mlp.gate.weight"
        else:
            e = f"{p}{module}.experts."
            gate_up = torch.stack([torch.cat([w(weights[f"{e}{j}.{gate}.weight"]), w(weights[f"{e}{j}.{up}.weight"])])
                                   for j in range(moe.experts)])
            downs = torch.stack([w(weights[f"{e}{j}.{down}.weight"]) for j in range(moe.experts)])
            router = f"{p}{module}.gate.weight"
        # Real fp8/int/nvfp4 engines keep the router (gate) weight unquantised, in the activation
        # dtype (bf16): only its input and its logits carry the pool's precision.
        return ExpertWeights(a(router), gate_up, downs)

    def _required_names(self, weights: Mapping[str, torch.Tensor]) -> list[str]:
        """The names ``load`` reads; experts in the layout ``weights`` has (``_experts``)."""
        spec = self.shape.spec
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.shape.tie_embeddings:
            names.append("lm_head.weight")
        per_layer = [f"{n}.weight" for n in _ATTENTION] + ["input_layernorm.weight", "post_attention_layernorm.weight"]
        if spec.attention_bias:
            per_layer += [f"self_attn.{n}_proj.bias" for n in "qkv"]
        if spec.o_bias:
            per_layer.append("self_attn.o_proj.bias")
        if spec.arch.qk_norm:
            per_layer += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        names += [f"model.layers.{i}.{n}" for i in range(self.shape.layers) for n in per_layer]
        for i in range(self.shape.layers):
            p = f"model.layers.{i}."
            if spec.moe is None or not spec.moe.sparse[i]:
                names += [f"{p}{n}.weight" for n in _MLP]
            elif p + "mlp.experts.gate_up_proj" in weights:
                names += [p + "mlp.experts.down_proj", p + "mlp.gate.weight"]
            else:
                module, *projections = EXPERT_NAMES[spec.arch.experts]
                names.append(f"{p}{module}.gate.weight")
                names += [f"{p}{module}.experts.{j}.{n}.weight" for j in range(spec.moe.experts) for n in projections]
        return names

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.shape, batch, max_len)

    # -- pieces -----------------------------------------------------------------------------

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        return round_activation(x, self.view.activations)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        """``x Wᵀ + b`` with inputs in the view's linear-input format, output rounded to the activation
        dtype (the bias is added in the GEMM epilogue, before that rounding).

        Inputs already hold activation-dtype values, so they are re-quantised only where the view's
        GEMMs take another format (fp8 W8A8, int8 W8A8, nvfp4 W4A4);
        with per-tensor scales one scale covers the whole input, its amax over the ``real`` rows
        (bool, ``x.shape[:-1]``: the step's tokens, not its left padding)."""
        if self.view.linear_inputs is not self.view.activations:
            if self.view.per_tensor:
                x = fp8_qdq_tensor(x, self.view.linear_inputs, real)
            else:
                x = round_activation(x, self.view.linear_inputs)
        return self._act(F.linear(x, weight, bias))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """HF RMSNorm: ``weight · x / sqrt(mean(x²) + eps)`` in fp32, normalised value rounded first."""
        normed = self._act(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.shape.rms_eps))
        return self._act(weight * normed)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """HF ``apply_rotary_pos_emb``: ``x·cos + rotate_half(x)·sin``; x (B, h, L, D), cos/sin (B, 1, L, D)."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return self._act(x * cos + rotated * sin)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (B, 1, L, D) exactly as HF's rotary embedding computes them."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]

    def _heads(self, x: torch.Tensor, heads: int, norm: torch.Tensor | None) -> torch.Tensor:
        """(B, L, h·D) -> (B, h, L, D), each head RMS-normalised first where the architecture does (Qwen3)."""
        b, n, _ = x.shape
        x = x.view(b, n, heads, self.shape.head_dim)
        if norm is not None:
            x = self._rms_norm(x, norm)
        return x.transpose(1, 2)

    def _attention(self, x, layer: Layer, i: int, rope, cache: KVCache, start: int, allowed, real) -> torch.Tensor:
        s, (b, n, _) = self.shape, x.shape
        qkv = self._linear(x, layer.w_qkv, layer.b_qkv, real)
        q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        q = self._rope(self._heads(q, s.heads, layer.q_norm), *rope)
        k = self._rope(self._heads(k, s.kv_heads, layer.k_norm), *rope)
        v = self._heads(v, s.kv_heads, None)
        end = start + n
        if self.view.kv_cache is not self.view.activations:  # else k, v already hold these values
            k, v = round_kv(k, self.view.kv_cache), round_kv(v, self.view.kv_cache)
        cache.k[i, :, :, start:end] = k
        cache.v[i, :, :, start:end] = v
        group = s.heads // s.kv_heads
        # Query heads sharing a KV head are stacked along the query axis: (B, Hkv, G·L, D).
        q = q.reshape(b, s.kv_heads, group * n, s.head_dim)
        out = attend(q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], allowed,
                     s.head_dim**-0.5, self.view.activations, self.view.kernel, self.view.fp8_attention)
        out = out.view(b, s.heads, n, s.head_dim).transpose(1, 2).reshape(b, n, s.heads * s.head_dim)
        return self._linear(out, layer.w_o, layer.b_o, real)

    def _mlp(self, x: torch.Tensor, layer: Layer, real: torch.Tensor) -> torch.Tensor:
        gate, up = self._linear(x, layer.w_gate_up, real=real).chunk(2, dim=-1)
        return self._linear(self._act(F.silu(gate) * up), layer.w_down, real=real)

    def _moe(self, x: torch.Tensor, experts: ExpertWeights, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A top-k mixture of SiLU-gated experts over ``x`` (B, L, hidden): its output (B, L, hidden)
        and the experts each position chose (B, L, k) int64, in descending router probability.

        The router GEMM runs in the activation dtype on the rounded hidden state with its bf16
        weight (no W8A8 input: engines keep the gate out of the quantised GEMMs), its logits rounded
        to the activation dtype; softmax and top-k in fp32 (HF's ``TopKRouter``). Each expert is a
        quantised linear pair; its output scaled by the routing weight, summed over the k experts.
        """
        moe = self.shape.spec.moe
        b, n, hidden = x.shape
        flat = x.reshape(-1, hidden)
        logits = self._act(F.linear(flat, experts.router))  # (N, E)
        weights, chosen = torch.softmax(logits, dim=-1).topk(moe.top_k, dim=-1)  # (N, k)
        if moe.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = self._act(weights)
        out = torch.zeros_like(flat)
        real = real.reshape(-1)
        for e in chosen.unique().tolist():
            token, slot = (chosen == e).nonzero(as_tuple=True)
            gate, up = self._linear(flat[token], experts.gate_up[e], real=real[token]).chunk(2, dim=-1)
            y = self._linear(self._act(F.silu(gate) * up), experts.down[e], real=real[token])
            out.index_add_(0, token, self._act(y * weights[token, slot, None]))
        return self._act(out).view(b, n, hidden), chosen.view(b, n, moe.top_k)

    def _masks(self, key_valid: torch.Tensor, start: int, n: int) -> dict[int | None, torch.Tensor]:
        """Per distinct sliding window (None: full attention): allowed (B, 1, G·L, C) bool.

        A query attends to valid columns at or before its own (and, with a window W, fewer than W
        columns back: HF's ``kv_idx > q_idx - W``); a padding query attends to itself only, so no
        row is empty. Columns and positions differ by a row's constant left padding, so a column
        distance is a token distance.
        """
        b, end = key_valid.shape[0], start + n
        cols, rows = torch.arange(end), torch.arange(start, end)
        distance = rows[:, None] - cols[None, :]  # (L, C)
        group = self.shape.heads // self.shape.kv_heads
        masks = {}
        for window in set(self.shape.spec.windows):
            visible = (distance >= 0) if window is None else (distance >= 0) & (distance < window)
            allowed = (visible[None] & key_valid[:, None, :]) | (distance == 0)[None]
            masks[window] = allowed[:, None, None].expand(b, 1, group, n, end).reshape(b, 1, group * n, end)
        return masks

    # -- forward ----------------------------------------------------------------------------

    def forward(self, ids, positions, key_valid, cache: KVCache, start: int, last_only: bool = False,
                routes: list[torch.Tensor] | None = None):
        """Logits (B, L, V) — or (B, 1, V) with ``last_only`` — fp32, for ``ids`` (B, L) written at
        cache columns [start, start + L).

        ``positions`` (B, L): RoPE positions. ``key_valid`` (B, start + L) bool: columns holding
        real tokens (False for left padding); see ``_masks`` for who attends to what. ``routes``, a
        list, receives each sparse layer's chosen experts (B, L, k) in layer order.
        """
        masks = self._masks(key_valid, start, ids.shape[1])
        real = key_valid[:, start:start + ids.shape[1]]  # the step's tokens: per-tensor fp8 scales span these
        rope = self._rope_tables(positions)
        h = self.embed[ids]
        for i, layer in enumerate(self.layers):
            allowed = masks[self.shape.spec.windows[i]]
            h = self._act(h + self._attention(self._rms_norm(h, layer.ln_attn), layer, i, rope, cache, start, allowed,
                                              real))
            normed = self._rms_norm(h, layer.ln_mlp)
            if layer.experts is None:
                h = self._act(h + self._mlp(normed, layer, real))
                continue
            mlp, chosen = self._moe(normed, layer.experts, real)
            h = self._act(h + mlp)
            if routes is not None:
                routes.append(chosen)
        if last_only:
            h = h[:, -1:]
        return self._act(F.linear(self._rms_norm(h, self.norm), self.lm_head))
