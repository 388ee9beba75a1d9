"""Shared fixtures: tiny random decoder checkpoints (Llama and its relatives) in Hugging Face format,
and the fast tier's guard: a test not marked ``slow`` that starts Ray fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

TINY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 ()[],:=+-*<>"
TINY_SPECIAL = ("<pad>", "<s>", "</s>")


def build_char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast``: ids 0/1/2 = pad/bos/eos, then one id per char."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIAL + tuple(TINY_CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def save_tiny_llama(path: Path, seed: int = 0, tie: bool = False, kv_heads: int = 1, init: float = 0.3) -> Path:
    """Save a random tiny ``LlamaForCausalLM`` (GQA by default) plus the char tokenizer into ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32: the smallest vLLM's CPU attention kernels take
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        initializer_range=init,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_decoder(path: Path, model_type: str, seed: int = 0, **overrides) -> Path:
    """Save a random tiny ``<model_type>ForCausalLM`` plus the char tokenizer into ``path``.

    Hidden 64, 2 layers, 4 query heads over 2 KV heads of size 16. Every parameter is random,
    biases and norm weights included (HF initialises those to 0 and 1, which would hide them)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_char_tokenizer()
    fields = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    cfg = AutoConfig.for_model(model_type, **(fields | overrides))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
            else:  # norm weights around 1, biases around 0
                p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tmp_path_factory) -> Path:
    """A random tiny Qwen3-MoE: save_tiny_decoder's shapes, 4 experts of size 32, top-2 renormalised."""
    return save_tiny_decoder(tmp_path_factory.mktemp("tiny_qwen3_moe"), "qwen3_moe", num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A random tiny Llama (hidden 64, 2 layers, 2 heads / 1 KV head, char vocab) saved with save_pretrained."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


# The longest files, longest first (docs/testing.md, "Where the time goes"). ``make test``'s two
# workers take whole files in collection order: a long file taken last would leave one worker
# running it alone while the other has nothing left, so these go first and the rest fill in.
LONGEST_FIRST = ("test_faults_e2e.py", "test_signals_e2e.py", "test_agentic_train_cli.py", "test_dataset_e2e.py",
                 "test_install.py", "test_train_e2e.py", "test_session.py", "test_vllm_sampler.py",
                 "test_trainer_contract.py", "test_multinode.py", "test_embedded_v2.py", "test_deepspeed_trainer.py",
                 "test_scratch.py", "test_lag.py")


def pytest_configure(config):
    """pytest-xdist's ``--dist loadfile`` re-sorts the files by their number of tests unless told not
    to, which hands out the many-test unit files first and the few long end-to-end files last:
    collection order (``LONGEST_FIRST``) must be the order the files are handed out in."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """The files of ``LONGEST_FIRST`` first, in its order; every file's tests in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), order[id(item)]))


def _ray_in_the_fast_tier(*args, **kwargs):
    raise AssertionError("this test starts Ray: mark it @pytest.mark.slow (make test-fast leaves Ray out)")


@pytest.fixture(autouse=True)
def no_ray_in_the_fast_tier(request, monkeypatch):
    """``make test-fast`` is run on every change and kept under 2 minutes: Ray's start-up alone takes
    seconds, so a test that needs it belongs to the ``slow`` marker."""
    if request.node.get_closest_marker("slow") is None:
        import ray  # imported by rlmix.orchestration anyway; once per session

        monkeypatch.setattr(ray, "init", _ray_in_the_fast_tier)


@pytest.fixture(autouse=True)
def user_modules_go_with_their_test(tmp_path_factory):
    """What a test imported from a pytest temp directory (a reward's ``module:function`` module, the
    directory ``rlmix.tasks.rewards`` put on ``sys.path``) is dropped afterwards, as it would be with a
    process: a later test's module of the same name, in its own directory, is its own. Files run in
    any order and share a worker process (``make test``: pytest-xdist)."""
    yield
    base = str(tmp_path_factory.getbasetemp().resolve())
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(base):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not p.startswith(base)]


@pytest.fixture(scope="module")
def warm_ray():
    """One Ray instance for the in-process runs of a test module (``tests.cli.rlmix_in_process``):
    started by the first run, kept with its idle actor processes between runs as between the jobs
    of a sweep (each run still starts from fresh weights, optimizer and seeds), ended with the
    module, so that no other module finds Ray running in this process (some start their own)."""
    from rlmix.orchestration.session import SESSION

    with SESSION.hold():
        yield SESSION
