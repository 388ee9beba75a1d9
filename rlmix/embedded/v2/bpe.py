"""The v2 embedded model's tokenizer: byte-level BPE trained in-process, with a ChatML template.

Trained with the ``tokenizers`` library's ``BpeTrainer`` on two texts: the minicode prompts and
reference answers of ``CORPUS_PROBLEMS`` training problems (a fixed draw), and the plain English of
``corpus/*.txt`` shipped in this package. Nothing is downloaded.

* Pre-tokenisation splits text with ``SPLIT_PATTERN`` (Qwen2's, except that punctuation is split
  one character at a time: letters with at most one leading non-letter, every digit alone, every
  other symbol alone, whitespace), then maps bytes to the byte-level alphabet. A minicode prompt
  (digits and ``>;?``) is then one token per character, as for the character model: output digit i
  sits at a fixed distance from the input digit it comes from, and an empty example output
  (``>;``) is not fused into one token.
* The 256 byte symbols are all in the vocabulary, so every text encodes (no unknown token) and
  decodes back to itself.
* Special tokens (ids 0..2): ``<|endoftext|>`` (padding), ``<|im_start|>``, ``<|im_end|>`` (end of
  a turn: the EOS a completion stops at). No BOS: a prompt starts with the template's first token.
* ``CHAT_TEMPLATE``: ``<|im_start|>ROLE\\nCONTENT<|im_end|>`` per message and ``<|im_start|>assistant\\n``
  as the generation prompt. Nothing follows ``<|im_end|>``, so a sampled turn (which ends with that
  token) is exactly the text the template renders for it, and a conversation extends incrementally.

``save_bpe_tokenizer`` writes an ordinary Hugging Face fast-tokenizer directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, IM_START, IM_END)  # ids 0..2 in this order
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS_PROBLEMS = 4000  # minicode training problems whose prompts and answers the tokenizer sees
_CORPUS_SEED = 20261204  # the problems' draw; disjoint from the warm start's seeds 1, 2, ...


def english_corpus() -> list[str]:
    """The lines of every ``corpus/*.txt`` of this package, files in name order."""
    folder = resources.files("rlmix.embedded.v2") / "corpus"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".txt"))
    return [line for name in names for line in (folder / name).read_text(encoding="ascii").splitlines()]


def minicode_corpus(n: int = CORPUS_PROBLEMS) -> list[str]:
    """Prompts and reference answers of ``n`` minicode training problems (levels 1-3, a fixed draw)."""
    from rlmix.embedded.minicode import MiniCode

    task = MiniCode(levels=(1, 2, 3), seed=0)
    problems = task.sample(n, seed=_CORPUS_SEED)
    return [text for p in problems for text in (p.prompt, task.reference_answer(p))]


def train_bpe(vocab_size: int, texts: list[str]) -> Tokenizer:
    """A byte-level BPE ``Tokenizer`` of at most ``vocab_size`` tokens (specials and the 256 bytes
    included) trained on ``texts``; deterministic in its arguments."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size={vocab_size}: a byte-level vocabulary needs at least {len(SPECIAL_TOKENS) + 256}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a pair seen once is not worth a token
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_bpe_tokenizer(vocab_size: int):
    """The v2 tokenizer as a transformers ``PreTrainedTokenizerFast`` with ``CHAT_TEMPLATE``."""
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(vocab_size, minicode_corpus() + english_corpus())
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=IM_END,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_bpe_tokenizer(vocab_size: int, out: Path):
    """Train the v2 tokenizer and save it to ``out`` (``tokenizer.json``, ``tokenizer_config.json``
    with the chat template); returns the tokenizer."""
    hf = build_bpe_tokenizer(vocab_size)
    hf.save_pretrained(out)
    return hf
