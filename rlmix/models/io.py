"""Loading any Hugging Face causal-LM directory: the embedded default or a real checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from rlmix.errors import ConfigError
from rlmix.models.tokenizer_file import check_model_dir as _model_dir


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
    # transformers draws a bar per load ("Loading weights: 100%|..."): on a console its first line,
    # in a log a run of carriage returns; rlmix's commands report their own progress.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype)
    except (OSError, ValueError) as e:
        first_line = (str(e).splitlines() or [""])[0]  # ConfigError is one line
        raise ConfigError(f"model.path={str(path)!r}: weights do not load ({type(e).__name__}: {first_line})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.eval()
