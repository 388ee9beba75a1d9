"""Schemas of the embedded default models (the Hydra ``model`` group's defaults): single-turn v1 and
v2, and agent.

The builders (``rlmix.embedded.model``, ``rlmix.embedded.v2.model``) hash these fields into their
cache keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from rlmix.errors import ConfigError


class EmbeddedVersion(str, Enum):
    """Which embedded model a run starts from when ``model.path`` is null."""

    auto = "auto"  # by the task (rlmix.assembly.rules.resolve_embedded_version): v2 for task=dataset, else v1
    v1 = "v1"  # a small Llama with a character vocabulary (``model.embedded``)
    v2 = "v2"  # a small Qwen3-MoE with a byte-level BPE vocabulary (``model.embedded_v2``)


@dataclass
class WarmStartSpec:
    """The single-turn warm start both embedded models share: supervised steps on minicode that stop
    once the sampled reward reaches a band, leaving room for RL."""

    seed: int = 0
    """Seeds the initial weights, the warm-start problems and the reward measurement."""
    warmup_steps: int = 1000
    """Upper bound on supervised warm-start steps (it usually stops earlier, on reward)."""
    warmup_lr: float = 5e-3
    """AdamW learning rate of the warm start (linear ramp over the first 10% of steps)."""
    warmup_batch_size: int = 32
    """Problems per warm-start step."""
    eval_every: int = 100
    """Warm-start steps between reward measurements."""
    eval_problems: int = 96
    """Held problems (levels 1-3, one sampled completion each) per reward measurement."""
    target_reward_low: float = 0.12
    """The warm start stops once the sampled reward (temperature 1.0) reaches this."""
    target_reward_high: float = 0.6
    """Upper end of the intended band; a build that overshoots it says so in rlmix_build.json."""


@dataclass
class EmbeddedModelSpec(WarmStartSpec):
    """The embedded default model and its warm start (the Hydra ``model`` group's defaults)."""

    hidden_size: int = 128
    """Width d of the residual stream."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (no grouped-query attention: key/value heads = heads)."""
    intermediate_size: int = 384
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 256
    """Longest sequence (prompt + completion) the model accepts; minicode needs under 72."""


@dataclass
class AgentModelSpec:
    """The embedded agent model and its warm start (``model.embedded_agent``)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 512
    """Longest episode (prompt, turns, observations); minicode_agent's budget is 480."""
    seed: int = 0
    warmup_steps: int = 500
    """Supervised steps on scripted episodes."""
    warmup_lr: float = 3e-3
    warmup_batch_size: int = 16
    levels: list[int] = field(default_factory=lambda: [1, 2])
    """minicode levels of the scripted episodes (and of their wrong tries)."""


class MiniCodeAnswer(str, Enum):
    """What the v2 warm start teaches the model to answer a minicode prompt with."""

    program = "program"  # <p>PROGRAM</p>: task=minicode
    trace = "trace"  # a worked search, then the program: task=minicode_trace (long answers)


@dataclass
class EmbeddedMoeSpec(WarmStartSpec):
    """The v2 embedded model (``model=embedded_v2``): a small Qwen3-MoE, its byte-level BPE tokenizer
    and its warm start on minicode through the chat template."""

    vocab_size: int = 1024
    """Tokens of the byte-level BPE (3 special + 256 bytes + merges); the shipped corpus supports up to 1175."""
    hidden_size: int = 128
    """Width d of the residual stream."""
    num_layers: int = 2
    """Transformer blocks, each with a sparse MoE MLP."""
    num_heads: int = 4
    """Attention heads (key/value heads = heads); head size hidden_size / num_heads."""
    num_experts: int = 4
    """Experts per MoE layer."""
    experts_per_token: int = 2
    """Experts each token is routed to (top-k; their weights renormalised to sum to 1)."""
    moe_intermediate_size: int = 192
    """Width of each expert's SwiGLU MLP."""
    max_position_embeddings: int = 256
    """Longest sequence (template + prompt + completion) the model accepts; minicode needs under 64."""
    warmup_steps: int = 600
    """Upper bound on supervised warm-start steps (it stops earlier on reward). 600, not v1's 1000: a
    step costs about twice v1's, and the held-set reward was as high after 300 steps as after 900."""
    answer: MiniCodeAnswer = MiniCodeAnswer.program
    """The warm start's answers: the program alone (task=minicode) or a worked trace of tries and
    then the program (task=minicode_trace). The trace warm start reaches no reward yet at the default
    sizes (docs/embedded.md); set ``max_position_embeddings`` to hold the traces (384)."""
    trace_tries: list[int] = field(default_factory=lambda: [12, 24])
    """answer=trace: [min, max] wrong tries before the right one in the warm start's traces."""

    def hf_config(self) -> dict:
        """The ``config.json`` fields of the built model (``Qwen3MoeConfig``); special-token ids are
        the tokenizer's (``rlmix.embedded.v2.bpe``: pad 0, end of turn 2, no BOS)."""
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.moe_intermediate_size,  # dense MLP width: unused, every layer is sparse
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "use_sliding_window": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "num_local_experts": self.num_experts,  # transformers 5 spelling; `num_experts` maps to it
            "num_experts_per_tok": self.experts_per_token,
            "moe_intermediate_size": self.moe_intermediate_size,
            "norm_topk_prob": True,
            "output_router_logits": False,  # no load-balancing loss: the RL loss has none either
            "tie_word_embeddings": False,
            "pad_token_id": 0,
            "bos_token_id": None,
            "eos_token_id": 2,
        }


def v2_agent_hf_config(moe: EmbeddedMoeSpec, agent: AgentModelSpec) -> dict:
    """The ``config.json`` fields of the v2 agent model (``rlmix.embedded.minicode_agent.v2``): v2's
    shapes and tokens, with the agent's context."""
    return {**moe.hf_config(), "max_position_embeddings": agent.max_position_embeddings}


def check_moe_spec(spec: EmbeddedMoeSpec) -> None:
    """ConfigError naming the ``model.embedded_v2`` field a spec cannot be built with."""
    key = "model.embedded_v2"
    rules = (
        (spec.vocab_size >= 3 + 256,
         f"{key}.vocab_size={spec.vocab_size}: must be >= 259 (3 special tokens and 256 bytes)"),
        (spec.num_heads >= 1 and spec.hidden_size % spec.num_heads == 0,
         f"{key}.num_heads={spec.num_heads}: must divide hidden_size={spec.hidden_size}"),
        (spec.num_layers >= 1, f"{key}.num_layers={spec.num_layers}: must be >= 1"),
        (spec.num_experts >= 1, f"{key}.num_experts={spec.num_experts}: must be >= 1"),
        (1 <= spec.experts_per_token <= spec.num_experts,
         f"{key}.experts_per_token={spec.experts_per_token}: must be in 1..num_experts={spec.num_experts}"),
        (spec.warmup_steps >= 1, f"{key}.warmup_steps={spec.warmup_steps}: must be >= 1"),
        (spec.eval_every >= 1, f"{key}.eval_every={spec.eval_every}: must be >= 1"),
        (len(spec.trace_tries) == 2 and 0 <= spec.trace_tries[0] <= spec.trace_tries[1],
         f"{key}.trace_tries={list(spec.trace_tries)}: need [min, max] with 0 <= min <= max"),
    )
    for ok, message in rules:
        if not ok:
            raise ConfigError(message)
