"""A user-built model: a byte-level BPE tokenizer trained here, a ChatML template, a random tiny LM."""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "7 pens add 5 pens? <p>12</p>", "What is 3 plus 4? The answer is 7.", "def add(a, b):\n    return a + b\n",
    "system user assistant tool", "Solve: 12 * 3 = 36. Then 36 / 4 = 9.",
] * 20


def train_bpe_tokenizer(vocab_size: int = 320):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on a tiny corpus, with the ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    fast.chat_template = CHATML
    return fast


# Llama 3's RoPE frequency scaling, shrunk to the tiny model's context.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def save_model(path: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A random tiny causal LM of ``arch`` (llama | llama3 | qwen2 | qwen3_moe) with the BPE tokenizer, saved
    to ``path``. qwen3_moe: 4 experts of size 32, top-2 renormalised, on both layers."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3MoeConfig

    tok = train_bpe_tokenizer()
    common = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    if arch == "llama3":
        config = LlamaConfig(**common, rope_parameters=LLAMA3_ROPE)
    elif arch == "qwen3_moe":
        config = Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                norm_topk_prob=True)
    else:
        config = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch](**common)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path

