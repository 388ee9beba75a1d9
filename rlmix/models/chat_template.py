"""A model's Jinja chat template rendered as transformers renders it, without importing transformers.

``PreTrainedTokenizerBase.apply_chat_template`` compiles the template in a sandboxed Jinja
environment with ``trim_blocks``, ``lstrip_blocks`` and the loop-control extension, a ``tojson``
filter that does not escape HTML, and the globals ``raise_exception`` and ``strftime_now``; it
renders with ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's
special tokens as variables. This module does the same for the one call rlmix makes (messages and
the generation prompt, text out), so a sampler process serving a model with a template never pays
transformers' import. ``tests/test_tokenizer_file.py`` renders a set of templates both ways.

A template this renderer would not reproduce is left to transformers (``supported``): one with
``{% generation %}`` blocks (transformers' assistant-mask extension).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def supported(template: str) -> bool:
    """Whether ``render`` reproduces transformers for ``template``."""
    return not _GENERATION_TAG.search(template)


@lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render(template: str, messages: list[dict], add_generation_prompt: bool, special_tokens: dict) -> str:
    """The text transformers' ``apply_chat_template(messages, tokenize=False, ...)`` returns.
    ``special_tokens``: the tokenizer's named special tokens (``bos_token``, ...), as it passes them."""
    return _compiled(template).render(messages=list(messages), tools=None, documents=None,
                                      add_generation_prompt=add_generation_prompt, **special_tokens)
