"""Hugging Face model directories as users bring them: dropout in the config, tokenizers without a
pad or EOS token, end-of-turn ids only in generation_config.json, config fields transformers rejects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlmix.errors import ConfigError
from tests.conftest import save_tiny_decoder, save_tiny_llama

EOS = 2  # the char tokenizer's </s>; <pad> is 0


def _edit(path: Path, **fields) -> None:
    """Set (or, with None, drop) top-level ``fields`` of the JSON file ``path``."""
    data = json.loads(path.read_text())
    for key, value in fields.items():
        data.pop(key, None)
        if value is not None:
            data[key] = value
    path.write_text(json.dumps(data))


def _without_pad(model_dir: Path, padding: dict | None = None) -> Path:
    """``model_dir``'s tokenizer with no pad token in tokenizer_config.json; ``padding`` in tokenizer.json."""
    _edit(model_dir / "tokenizer_config.json", pad_token=None)
    if (model_dir / "special_tokens_map.json").is_file():
        _edit(model_dir / "special_tokens_map.json", pad_token=None)
    data = json.loads((model_dir / "tokenizer.json").read_text())
    data["padding"] = padding
    (model_dir / "tokenizer.json").write_text(json.dumps(data))
    return model_dir


def _fleet(model_dir: Path, eos_id: int | None):
    from rlmix.assembly.fleet import resolve_fleet
    from rlmix.commands.compose import compose_plan

    plan = compose_plan(["fleet=smoke", f"model.path={model_dir}"], for_training=False)
    return resolve_fleet(plan, eos_id)


# -- 1. dropout ------------------------------------------------------------------------------------


def test_the_trainer_computes_without_the_dropout_config_json_sets(tmp_path, caplog):
    """A train-mode forward with attention dropout would not be the policy the samplers sample."""
    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig, TrainerConfig, TrainerPrecision
    from rlmix.trainers.torch_trainer import TorchTrainer

    model_dir = save_tiny_decoder(tmp_path / "m", "llama", attention_dropout=0.3)
    cfg = TrainerConfig(precision=TrainerPrecision.fp32)
    with caplog.at_level("INFO"):
        trainer = TorchTrainer(model_dir, cfg, resolve_correction(CorrectionConfig()), seed=0)
    model = trainer.model
    assert model.training
    ids = torch.randint(3, 40, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first, second = (torch.log_softmax(model(input_ids=ids).logits, -1) for _ in range(2))
        model.eval()
        evaluated = torch.log_softmax(model(input_ids=ids).logits, -1)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, evaluated, rtol=1e-6, atol=1e-6)
    assert "attention_dropout=0.3 in config.json turned off" in caplog.text


# -- 2 and 3. pad token ------------------------------------------------------------------------------


def test_a_tokenizer_without_a_pad_token_pads_with_its_eos_in_every_process(tmp_path):
    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig, TrainerConfig
    from rlmix.models.io import load_tokenizer
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.trainers.torch_trainer import TorchTrainer

    model_dir = _without_pad(save_tiny_llama(tmp_path / "m"))
    assert load_fast_tokenizer(model_dir).pad_token_id == EOS
    assert load_tokenizer(model_dir).pad_token_id == EOS
    trainer = TorchTrainer(model_dir, TrainerConfig(), resolve_correction(CorrectionConfig()), seed=0)
    assert trainer.pad_id == EOS
    # a directory only transformers' tokenizer reproduces (a BOS flag) gets the same fallback
    _edit(model_dir / "tokenizer_config.json", add_bos_token=False)
    assert load_fast_tokenizer(model_dir).pad_token_id == EOS


def test_the_pad_token_tokenizer_json_pads_with_is_read_as_transformers_reads_it(tmp_path):
    from rlmix.models.io import load_tokenizer
    from rlmix.models.tokenizer_file import FileTokenizer, load_fast_tokenizer

    padding = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
               "pad_type_id": 0, "pad_token": "<pad>"}
    model_dir = _without_pad(save_tiny_llama(tmp_path / "m"), padding)
    ours = load_fast_tokenizer(model_dir)
    assert isinstance(ours, FileTokenizer)
    assert ours.pad_token_id == load_tokenizer(model_dir).pad_token_id == 0


# -- 4 and 5. stop ids ------------------------------------------------------------------------------


def test_samplers_stop_on_generation_config_end_of_turn_ids_as_hf_generate_does(tmp_path):
    model_dir = save_tiny_llama(tmp_path / "m")
    _edit(model_dir / "generation_config.json", eos_token_id=[EOS, 5])
    _edit(model_dir / "config.json", eos_token_id=[EOS, 7])
    assert {spec.params.stop_token_ids for spec in _fleet(model_dir, EOS)} == {(EOS, 5, 7)}


def test_a_tokenizer_without_eos_stops_on_the_config_ids(tmp_path):
    model_dir = save_tiny_llama(tmp_path / "m")
    _edit(model_dir / "tokenizer_config.json", eos_token=None)
    assert {spec.params.stop_token_ids for spec in _fleet(model_dir, None)} == {(EOS,)}


def test_no_end_of_sequence_id_anywhere_is_one_line_before_any_process(tmp_path):
    model_dir = save_tiny_llama(tmp_path / "m")
    _edit(model_dir / "generation_config.json", eos_token_id=None)
    _edit(model_dir / "config.json", eos_token_id=None)
    with pytest.raises(ConfigError, match="no end-of-sequence token") as err:
        _fleet(model_dir, None)
    assert str(model_dir) in str(err.value) and "\n" not in str(err.value)


# -- 6. config fields transformers rejects -----------------------------------------------------------


def test_a_config_transformers_rejects_is_one_line(tmp_path):
    from rlmix.models.io import load_causal_lm

    model_dir = save_tiny_llama(tmp_path / "m")
    _edit(model_dir / "config.json", bos_token_id=[1])
    with pytest.raises(ConfigError, match="weights do not load") as err:
        load_causal_lm(model_dir)
    assert "\n" not in str(err.value)
