"""Loading any Hugging Face causal-LM directory: the embedded default or a real checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from rlmix.errors import ConfigError
from rlmix.models.tokenizer_file import check_model_dir as _model_dir, check_tokenizer_files, pad_fallback

try:  # what transformers' strict config classes raise for a field of the wrong type (bos_token_id: [1])
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub: configs are not validated
    StrictDataclassError = ValueError

log = logging.getLogger(__name__)

# The dropout modules torch has; a trainer zeroes every one it finds (``without_dropout``).
DROPOUT_MODULES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                   torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The fast tokenizer saved in the model directory. Without a pad token of its own it pads with
    ``pad_fallback`` (its EOS, else the model's end-of-sequence id), as ``load_fast_tokenizer`` does, so
    every process pads alike (rows are right-padded and masked)."""
    p = _model_dir(path)
    check_tokenizer_files(p, path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, use_fast=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path={str(path)!r}: no loadable tokenizer ({type(e).__name__})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = pad_fallback(p, tokenizer.eos_token_id, len(tokenizer))
    return tokenizer


def _load_error(path: str | Path, e: Exception) -> ConfigError:
    first_line = (str(e).splitlines() or [""])[0]  # ConfigError is one line
    return ConfigError(f"model.path={str(path)!r}: weights do not load ({type(e).__name__}: {first_line})")


def dropout_fields(config) -> dict[str, float]:
    """The nonzero dropout probabilities a config sets (``attention_dropout``, ``hidden_dropout``,
    ``resid_pdrop``, ...): what a train-mode forward would apply."""
    return {key: value for key, value in config.to_dict().items()
            if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, (int, float))
            and not isinstance(value, bool) and value != 0}


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32, dropout: bool = True) -> PreTrainedModel:
    """The causal LM in ``path`` in eval mode, weights cast to ``dtype``.

    ``dropout=False`` (a trainer): every dropout probability of the config and of the modules is 0,
    so its train-mode forward is the deterministic policy the samplers sample; one line logs what
    ``config.json`` set that was turned off.
    """
    p = _model_dir(path)
    # transformers draws a bar per load ("Loading weights: 100%|..."): on a console its first line,
    # in a log a run of carriage returns; rlmix's commands report their own progress.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(p)
        turned_off = {} if dropout else dropout_fields(config)
        for key in turned_off:
            setattr(config, key, 0.0)
        model = AutoModelForCausalLM.from_pretrained(p, config=config, dtype=dtype)
    except (OSError, ValueError, StrictDataclassError) as e:
        raise _load_error(path, e) from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if not dropout:
        for module in model.modules():
            if isinstance(module, DROPOUT_MODULES):
                module.p = 0.0
        if turned_off:
            log.info("model.path=%s: %s in config.json turned off: the trainer computes without dropout, as the "
                     "samplers do", path, ", ".join(f"{key}={value}" for key, value in turned_off.items()))
    return model.eval()


def load_trainable_lm(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM a trainer updates: in train mode, without dropout (``load_causal_lm``)."""
    return load_causal_lm(path, dtype, dropout=False).train()
