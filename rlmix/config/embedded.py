"""Schemas of the embedded default models (the Hydra ``model`` group's defaults): single-turn and agent.

The builder (``rlmix.embedded.model``) hashes these fields into its cache key.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EmbeddedModelSpec:
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
