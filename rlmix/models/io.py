"""Loading any Hugging Face causal-LM directory: the embedded default or a real checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from rlmix.errors import ConfigError


def _model_dir(path: str | Path) -> Path:
    """``path`` as a directory with a config.json naming a causal-LM architecture, else ConfigError."""
    p = Path(path).expanduser()
    config = p / "config.json"
    if not config.is_file():
        raise ConfigError(f"model.path={str(path)!r} is not a Hugging Face model directory (no config.json)")
    try:
        fields = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"model.path={str(path)!r}: config.json is not valid JSON ({e.msg})") from None
    archs = fields.get("architectures") or []  # an HF file's optional field, not our config
    if not any(a.endswith("ForCausalLM") for a in archs):
        raise ConfigError(f"model.path={str(path)!r} is not a causal LM (architectures={archs})")
    return p


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The fast tokenizer saved in the model directory."""
    p = _model_dir(path)
    try:
        return AutoTokenizer.from_pretrained(p, use_fast=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path={str(path)!r}: no loadable tokenizer ({type(e).__name__})") from None


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM in ``path`` in eval mode, weights cast to ``dtype``."""
    p = _model_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype)
    except (OSError, ValueError) as e:
        first_line = (str(e).splitlines() or [""])[0]  # ConfigError is one line
        raise ConfigError(f"model.path={str(path)!r}: weights do not load ({type(e).__name__}: {first_line})") from None
    return model.eval()
