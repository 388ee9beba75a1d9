"""A model directory's fast tokenizer read straight from ``tokenizer.json``, without ``transformers``.

Sampler actors and the driver only encode prompts, decode completions and read the special-token
ids. ``transformers`` costs about 3.5 core-seconds to import (measured on the 2-core machines this
project runs on), paid once per process: with six sampler actors that alone was ~10 s of a run's
start-up. ``tokenizers`` — the library that does the work inside ``PreTrainedTokenizerFast`` —
imports in milliseconds. A chat template is rendered by ``rlmix.models.chat_template``, Jinja set up
as transformers sets it up. ``load_fast_tokenizer`` falls back to ``transformers`` for any directory
whose behaviour this reader would not reproduce exactly (no ``tokenizer.json``, text clean-up after
decoding, BOS/EOS flags, a template in a form or with tags the renderer does not take), so the two
always agree (tests/test_tokenizer_file.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlmix.errors import ConfigError

SPECIAL_KEYS = ("pad_token", "eos_token", "bos_token", "unk_token")
# The files a tokenizer is read from (fast, SentencePiece, byte-level BPE, WordPiece, tiktoken): a
# directory with none of them gets a one-token tokenizer from transformers 5, not an error.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "*.tiktoken")
TEMPLATE_KEYS = SPECIAL_KEYS + ("sep_token", "cls_token", "mask_token")  # what a template may read
# A sharded checkpoint's map of parameter names to the files that hold them (safetensors, torch pickles).
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def check_model_dir(path: str | Path) -> Path:
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


def check_weight_files(model_dir: Path, path: str | Path) -> None:
    """ConfigError if a weight index (``WEIGHT_INDEXES``) is unreadable or its ``weight_map`` names a shard
    file ``model_dir`` lacks: otherwise every sampler finds parameters missing only after Ray started."""
    for name in WEIGHT_INDEXES:
        index = model_dir / name
        if not index.is_file():
            continue
        try:
            data = json.loads(index.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"model.path={str(path)!r}: {name} is not valid JSON ({type(e).__name__})") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ConfigError(f"model.path={str(path)!r}: {name} has no weight_map of parameter names to files")
        missing = sorted({f for f in weight_map.values() if not (model_dir / f).is_file()})
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise ConfigError(f"model.path={str(path)!r}: {name} names {len(missing)} weight file(s) the directory "
                              f"lacks ({shown}); copy the complete checkpoint into it")


def check_tokenizer_files(model_dir: Path, path: str | Path) -> None:
    """ConfigError if ``model_dir`` holds none of ``TOKENIZER_FILES``."""
    if not any(next(model_dir.glob(name), None) for name in TOKENIZER_FILES):
        raise ConfigError(f"model.path={str(path)!r}: the directory has no tokenizer (none of "
                          f"{', '.join(TOKENIZER_FILES)}); save the model's tokenizer into it")


def check_vocab(tokenizer, model_dir: Path, path: str | Path) -> None:
    """ConfigError if the tokenizer has more ids than the model has embeddings (``vocab_size`` of
    config.json, or of its ``text_config``): an id past them fails only inside a sampler or the
    trainer's first step. Fewer is normal (embedding tables are padded to a round size)."""
    fields = json.loads((model_dir / "config.json").read_text())
    text = fields.get("text_config") if isinstance(fields.get("text_config"), dict) else {}
    size = fields.get("vocab_size", text.get("vocab_size"))
    if isinstance(size, int) and not isinstance(size, bool) and len(tokenizer) > size:
        raise ConfigError(f"model.path={str(path)!r}: the tokenizer has {len(tokenizer)} token ids but config.json's "
                          f"vocab_size is {size}, so ids {size}..{len(tokenizer) - 1} have no embedding; "
                          "use the tokenizer the model was trained with")


@dataclass
class Encoding:
    input_ids: list[int]


class FileTokenizer:
    """The subset of ``PreTrainedTokenizerFast`` a sampler uses: call, decode, special ids, the chat
    template."""

    def __init__(self, tokenizer, special: dict[str, str | None], path: Path, chat_template: str | None = None):
        self._tok, self._path, self._hf = tokenizer, path, None
        self.chat_template = chat_template
        self._template_tokens = {key: value for key, value in special.items() if value is not None}
        self.bos_token, self.eos_token = special.get("bos_token"), special.get("eos_token")
        ids = {key: (tokenizer.token_to_id(text) if text is not None else None) for key, text in special.items()
               if key in SPECIAL_KEYS}
        self.pad_token_id = ids.get("pad_token")
        self.eos_token_id = ids.get("eos_token")
        self.bos_token_id = ids.get("bos_token")
        self.unk_token_id = ids.get("unk_token")

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return Encoding(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        return self._tok.decode_batch([list(r) for r in rows], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], chat_template: str | None = None, tokenize: bool = True,
                            add_generation_prompt: bool = False):
        """The directory's template (or ``chat_template``) rendered as transformers renders it
        (``rlmix.models.chat_template``); transformers' own renderer, loaded on first use, for a
        template that one does not take."""
        from rlmix.models import chat_template as jinja

        template = chat_template or self.chat_template
        if template is not None and jinja.supported(template):
            text = jinja.render(template, messages, add_generation_prompt, self._template_tokens)
            return self.encode(text, add_special_tokens=False) if tokenize else text
        if self._hf is None:
            from rlmix.models.io import load_tokenizer

            self._hf = load_tokenizer(self._path)
        return self._hf.apply_chat_template(messages, chat_template=chat_template, tokenize=tokenize,
                                            add_generation_prompt=add_generation_prompt)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def pad_with(self, token_id: int) -> None:
        """Pad with ``token_id`` (``pad_fallback``); a template that reads ``pad_token`` gets its text, as
        transformers' tokenizer gives it once its ``pad_token_id`` is set."""
        self.pad_token_id = token_id
        self._template_tokens["pad_token"] = self._tok.id_to_token(token_id)


def _token_text(value) -> str | None:
    """A special token as saved by transformers: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def read_chat_template(model_dir: Path, config: dict) -> tuple[bool, str | None]:
    """(whether ``rlmix.models.chat_template`` renders the directory's template as transformers
    would, the template or None). Taken: one string in ``tokenizer_config.json`` or one
    ``chat_template.jinja`` file; anything else (named templates, both places, other files) is
    left to transformers."""
    from rlmix.models.chat_template import supported

    in_config = config.get("chat_template")
    files = sorted(p.name for p in model_dir.glob("chat_template.*"))
    if (model_dir / "additional_chat_templates").exists():
        return False, None
    if not files:
        if in_config is None:
            return True, None
        return (True, in_config) if isinstance(in_config, str) and supported(in_config) else (False, None)
    if files == ["chat_template.jinja"] and in_config is None:
        text = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
        return (True, text) if supported(text) else (False, None)
    return False, None


def read_special_tokens(model_dir: Path) -> tuple[dict[str, str | None], str | None] | None:
    """The special tokens of ``tokenizer_config.json`` (and ``special_tokens_map.json``) and the chat
    template, or None when the directory configures what only ``transformers`` reproduces."""
    config_file = model_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    # Options transformers applies on top of tokenizer.json (clean-up after decoding, BOS/EOS
    # flags that rewrite the post-processor): transformers serves those.
    own = {"add_bos_token", "add_eos_token"} & config.keys()
    reproducible, template = read_chat_template(model_dir, config)
    if config.get("clean_up_tokenization_spaces", False) or own or not reproducible:
        return None
    special = {key: _token_text(config.get(key)) for key in TEMPLATE_KEYS}
    map_file = model_dir / "special_tokens_map.json"
    if map_file.is_file():
        for key, value in json.loads(map_file.read_text()).items():
            if key in special and special[key] is None:
                special[key] = _token_text(value)
    if special["pad_token"] is None:  # transformers takes the one tokenizer.json pads with
        padding = json.loads((model_dir / "tokenizer.json").read_text()).get("padding") or {}
        special["pad_token"] = padding.get("pad_token")
    return special, template


def _token_ids(value, where: str, key: str) -> list[int]:
    """An ``eos_token_id`` or ``pad_token_id`` as saved: an int, a list of ints, or absent."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if value is None:
        return []
    raise ConfigError(f"{where}: {key}={value!r} is neither a token id nor a list of them")


def _config_ids(model_dir: Path, key: str) -> list[int]:
    """``key`` of generation_config.json, then of config.json, as a list of ids."""
    ids = []
    for name in ("generation_config.json", "config.json"):
        file = model_dir / name
        if file.is_file():
            ids += _token_ids(json.loads(file.read_text()).get(key), str(file), key)
    return ids


def stop_token_ids(model_dir: str | Path, tokenizer_eos: int | None) -> tuple[int, ...]:
    """The ids that end a completion, as Hugging Face ``generate`` stops: the tokenizer's EOS and the
    ``eos_token_id`` (an int or a list) of ``generation_config.json`` and ``config.json`` (an instruct
    model's end of turn, e.g. Llama-3's ``<|eot_id|>``, is often only there). ConfigError if none."""
    ids = ([tokenizer_eos] if tokenizer_eos is not None else []) + _config_ids(Path(model_dir), "eos_token_id")
    if not ids:
        raise ConfigError(f"model.path={str(model_dir)!r}: no end-of-sequence token: none in the tokenizer "
                          "(eos_token), generation_config.json or config.json (eos_token_id)")
    return tuple(dict.fromkeys(ids))


def pad_fallback(model_dir: str | Path, tokenizer_eos: int | None, vocab: int) -> int:
    """The id that pads when the tokenizer names no pad token (Llama-3, Mistral base): the first id below
    ``vocab`` (one the tokenizer has) among the stop ids (``stop_token_ids``: the tokenizer's EOS, then the
    ``eos_token_id`` of generation_config.json and config.json) and then their ``pad_token_id``. A rollout's
    rows are right-padded and the padding masked, so any id pads; ``load_fast_tokenizer`` and
    ``io.load_tokenizer`` both take this one, so the driver, samplers, trainers and the probe pad alike.
    ConfigError naming ``model.path`` when there is none: without it the trainer's first step fails."""
    p = Path(model_dir)
    ids = ([tokenizer_eos] if tokenizer_eos is not None else []) + _config_ids(p, "eos_token_id")
    usable = [i for i in ids + _config_ids(p, "pad_token_id") if 0 <= i < vocab]
    if not usable:
        raise ConfigError(f"model.path={str(model_dir)!r}: no token to pad rows with: the tokenizer names no "
                          "pad_token or eos_token, and no eos_token_id or pad_token_id of config.json or "
                          "generation_config.json is one of its ids; add pad_token to tokenizer_config.json")
    return usable[0]


def load_fast_tokenizer(path: str | Path):
    """A ``FileTokenizer`` for ``path`` where one reproduces transformers exactly, else transformers'.

    ConfigError when ``path`` is not a causal-LM directory, or its tokenizer has ids the model lacks.
    """
    p = check_model_dir(path)
    found = read_special_tokens(p) if (p / "tokenizer.json").is_file() else None
    if found is None:
        from rlmix.models.io import load_tokenizer

        tokenizer = load_tokenizer(p)
    else:
        from tokenizers import Tokenizer

        special, template = found
        try:
            tokenizer = FileTokenizer(Tokenizer.from_file(str(p / "tokenizer.json")), special, p, template)
        except Exception as e:  # the Rust library raises its own exception type for a malformed file
            raise ConfigError(f"model.path={str(path)!r}: no loadable tokenizer ({type(e).__name__})") from None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_with(pad_fallback(p, tokenizer.eos_token_id, len(tokenizer)))
    check_vocab(tokenizer, p, path)
    return tokenizer
