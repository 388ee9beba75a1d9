"""A character-level tokenizer in Hugging Face format (loads in transformers and in vLLM).

One token per character (WordLevel over single characters; the pre-tokenizer isolates every
character, spaces included) plus four special tokens. Encoding prepends ``<s>``; decoding fuses the
characters back without separators, so ``decode(encode(text)[1:]) == text`` for every text over
the alphabet.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order


def char_vocab(alphabet: str) -> dict[str, int]:
    """Special tokens first, then the sorted distinct characters of ``alphabet`` plus space."""
    chars = sorted(set(alphabet) | {" "})
    return {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(chars))}


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """A fast tokenizer whose vocabulary covers every character of ``alphabet``."""
    vocab = char_vocab(alphabet)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
