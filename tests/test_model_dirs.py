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


# -- 7. no pad token and no EOS in the tokenizer: the model's end-of-sequence id pads -----------------


def _without_eos(model_dir: Path, *configs: str) -> Path:
    """``model_dir``'s tokenizer with no EOS token; ``configs`` (config.json, generation_config.json)
    without eos_token_id and pad_token_id."""
    _edit(model_dir / "tokenizer_config.json", eos_token=None)
    if (model_dir / "special_tokens_map.json").is_file():
        _edit(model_dir / "special_tokens_map.json", eos_token=None)
    for name in configs:
        _edit(model_dir / name, eos_token_id=None, pad_token_id=None)
    return model_dir


def _dataset_train(model_dir: Path, tmp_path: Path) -> list[str]:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "What is 2+3?", "answer": "5"}\n' * 4)
    return ["train", "fleet=smoke", f"model.path={model_dir}", "task=dataset", f"task.train_files={rows}",
            "task.prompt_key=question", "task.reward=math", "loop.steps=3", f"hydra.run.dir={tmp_path / 'run'}"]


@pytest.mark.parametrize("stated_in", ["config.json", "generation_config.json"])
def test_a_tokenizer_without_pad_or_eos_pads_with_the_models_end_of_sequence_id_in_every_process(tmp_path, stated_in):
    """The stop ids already came from config.json / generation_config.json; the pad id was None, and the
    trainer's first step failed in ``torch.full`` after Ray and every actor had started."""
    from rlmix.assembly.rules import resolve_correction
    from rlmix.config.schema import CorrectionConfig, TrainerConfig
    from rlmix.models.io import load_tokenizer
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from rlmix.trainers.torch_trainer import TorchTrainer

    others = {"config.json", "generation_config.json"} - {stated_in}
    model_dir = _without_eos(_without_pad(save_tiny_llama(tmp_path / "m")), *others)
    _edit(model_dir / stated_in, eos_token_id=EOS, pad_token_id=None)
    ours = load_fast_tokenizer(model_dir)
    assert ours.eos_token_id is None and ours.pad_token_id == EOS
    assert load_tokenizer(model_dir).pad_token_id == EOS
    trainer = TorchTrainer(model_dir, TrainerConfig(), resolve_correction(CorrectionConfig()), seed=0)
    assert trainer.pad_id == EOS
    _edit(model_dir / "tokenizer_config.json", add_bos_token=False)  # served by transformers' tokenizer
    assert load_fast_tokenizer(model_dir).pad_token_id == EOS


def test_without_any_end_of_sequence_id_the_configs_pad_token_id_pads(tmp_path):
    from rlmix.models.io import load_tokenizer
    from rlmix.models.tokenizer_file import load_fast_tokenizer

    model_dir = _without_eos(_without_pad(save_tiny_llama(tmp_path / "m")), "config.json", "generation_config.json")
    _edit(model_dir / "config.json", pad_token_id=1)
    assert load_fast_tokenizer(model_dir).pad_token_id == load_tokenizer(model_dir).pad_token_id == 1


def test_no_id_to_pad_with_is_one_line_naming_model_path_before_ray(tmp_path):
    from rlmix.models.io import load_tokenizer
    from rlmix.models.tokenizer_file import load_fast_tokenizer
    from tests.cli import rlmix_refusing

    model_dir = _without_eos(_without_pad(save_tiny_llama(tmp_path / "m")), "config.json", "generation_config.json")
    for load in (load_fast_tokenizer, load_tokenizer):
        with pytest.raises(ConfigError, match="no token to pad rows with") as err:
            load(model_dir)
        assert str(err.value).startswith(f"model.path={str(model_dir)!r}: ") and "\n" not in str(err.value)
    out = rlmix_refusing(*_dataset_train(model_dir, tmp_path), cwd=tmp_path)  # Ray is not started here
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"error: model.path={str(model_dir)!r}: no token to pad rows with")
    assert "add pad_token to tokenizer_config.json" in out.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow  # samples with the smoke fleet's pools (~5 s)
def test_the_probe_samples_a_model_whose_tokenizer_has_no_pad_or_eos(tmp_path):
    """``rlmix probe`` printed a traceback from ``sequence_input_ids`` (a None pad id)."""
    import json as json_

    from rlmix.commands.probe import run_probe

    model_dir = _without_eos(_without_pad(save_tiny_llama(tmp_path / "m")), "generation_config.json")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "What is 2+3?", "answer": "5"}\n')
    run_probe(["fleet=smoke", f"model.path={model_dir}", "task=dataset", f"task.train_files={rows}",
               "task.prompt_key=question", "task.reward=math", "task.split=train", "probe.prompts=1",
               "probe.samples_per_prompt=2", "loop.max_new_tokens=8", f"probe.out_dir={tmp_path / 'probe'}"])
    [written] = (tmp_path / "probe").rglob("probe.json")
    assert json_.loads(written.read_text())["pools"]


# -- 8. a sharded checkpoint missing a shard ----------------------------------------------------------


def _sharded(model_dir: Path) -> list[str]:
    """``model_dir``'s weights re-saved in shards (model.safetensors.index.json): the shard files."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir)
    (model_dir / "model.safetensors").unlink()
    model.save_pretrained(model_dir, max_shard_size="100KB")
    return sorted(set(json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"].values()))


def test_a_sharded_checkpoint_missing_a_shard_is_one_line_naming_it_before_ray(tmp_path):
    """Samplers found the parameters missing only after Ray started (exit 1, Ray's text, a run directory)."""
    from tests.cli import rlmix_refusing

    model_dir = save_tiny_llama(tmp_path / "m")
    shards = _sharded(model_dir)
    assert len(shards) > 2
    (model_dir / shards[1]).unlink()
    out = rlmix_refusing(*_dataset_train(model_dir, tmp_path), cwd=tmp_path)  # Ray is not started here
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"error: model.path={str(model_dir)!r}: model.safetensors.index.json names 1 ")
    assert f"({shards[1]})" in out.stderr and not (tmp_path / "run").exists()


def test_weight_indexes_are_checked_whatever_their_format(tmp_path):
    from rlmix.models.tokenizer_file import check_weight_files

    index = tmp_path / "pytorch_model.bin.index.json"
    check_weight_files(tmp_path, "m")  # no index: a single-file checkpoint
    names = [f"pytorch_model-0000{i}-of-00005.bin" for i in range(1, 6)]
    index.write_text(json.dumps({"metadata": {}, "weight_map": {f"w{i}": name for i, name in enumerate(names)}}))
    (tmp_path / names[0]).write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^model.path='m': pytorch_model.bin.index.json names 4 weight file\(s\) "
                                          r"the directory lacks \(pytorch_model-00002-of-00005.bin, .*, "
                                          r"pytorch_model-00004-of-00005.bin and 1 more\)"):
        check_weight_files(tmp_path, "m")
    for name in names[1:]:
        (tmp_path / name).write_bytes(b"")
    check_weight_files(tmp_path, "m")
    for text, match in (("{", "is not valid JSON"), ('{"weight_map": [1]}', "has no weight_map")):
        index.write_text(text)
        with pytest.raises(ConfigError, match=match) as err:
            check_weight_files(tmp_path, "m")
        assert "\n" not in str(err.value)
