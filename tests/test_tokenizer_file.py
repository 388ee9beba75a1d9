"""The transformers-free tokenizer a sampler actor uses agrees with transformers' own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmix.errors import ConfigError
from rlmix.models.tokenizer_file import FileTokenizer, load_fast_tokenizer

TEXTS = ["", "def f(x):", "return x + 1", "abc xyz 019", "(1,2)=[3]", "é not in the vocabulary"]


@pytest.fixture(scope="module")
def char_model_dir(tmp_path_factory) -> Path:
    """The embedded model's tokenizer (BOS post-processor, four special tokens) beside a Llama config."""
    from rlmix.embedded.chartok import build_char_tokenizer
    from rlmix.embedded.minicode import ALPHABET

    out = tmp_path_factory.mktemp("chartok")
    build_char_tokenizer(ALPHABET).save_pretrained(out)
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return out


@pytest.mark.parametrize("which", ["char_model_dir", "tiny_llama_dir"])
def test_file_tokenizer_matches_transformers(which, request):
    from rlmix.models.io import load_tokenizer

    path = request.getfixturevalue(which)
    ours, theirs = load_fast_tokenizer(path), load_tokenizer(path)
    assert isinstance(ours, FileTokenizer)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert len(ours) == len(theirs)
    rows = []
    for text in TEXTS:
        assert ours(text).input_ids == theirs(text).input_ids, text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        rows.append(theirs(text).input_ids + [theirs.eos_token_id, theirs.pad_token_id])
    for skip in (True, False):
        assert ours.batch_decode(rows, skip_special_tokens=skip) == theirs.batch_decode(rows, skip_special_tokens=skip)
        assert ours.decode(rows[2], skip_special_tokens=skip) == theirs.decode(rows[2], skip_special_tokens=skip)


@pytest.mark.parametrize("which", ["char_model_dir", "tiny_llama_dir"])
def test_prompts_render_to_the_same_ids_as_with_transformers(which, request):
    from rlmix.config.dataset import ChatTemplateMode
    from rlmix.models.io import load_tokenizer
    from rlmix.tasks.chat import prompt_messages, render_ids

    path = request.getfixturevalue(which)
    ours, theirs = load_fast_tokenizer(path), load_tokenizer(path)
    conversations = [prompt_messages("def f(x):"), prompt_messages("return x", system_prompt="be brief"),
                     [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "xyz"},
                      {"role": "user", "content": "(1,2)"}]]
    for messages in conversations:
        for mode in ChatTemplateMode:
            assert render_ids(ours, messages, mode) == render_ids(theirs, messages, mode), (messages, mode)


def test_options_only_transformers_applies_fall_back_to_it(char_model_dir, tmp_path):
    import shutil

    from transformers import PreTrainedTokenizerBase

    from rlmix.tasks.chat import render_ids

    tracked = "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    named = [{"name": "default", "template": "{{ messages[0]['content'] }}"}]
    for name, option in {"clean_up": {"clean_up_tokenization_spaces": True}, "add_eos": {"add_eos_token": True},
                         "generation_tags": {"chat_template": tracked}, "named_templates": {"chat_template": named},
                         "two_places": {"chat_template": "{{ messages[0]['content'] }}", "jinja": "x"}}.items():
        path = tmp_path / name
        shutil.copytree(char_model_dir, path)
        if "jinja" in option:
            (path / "chat_template.jinja").write_text(option.pop("jinja"))
        config = json.loads((path / "tokenizer_config.json").read_text()) | option
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        tokenizer = load_fast_tokenizer(path)
        assert isinstance(tokenizer, PreTrainedTokenizerBase), name
        if tokenizer.chat_template:  # ... and a prompt renders through it (named: a dict transformers picks from)
            messages = [{"role": "user", "content": "abc"}]
            assert render_ids(tokenizer, messages) == list(tokenizer(tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids), name


LLAMA3 = ("{{- bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Whitespace control by trim_blocks / lstrip_blocks (no "-"), loop controls, namespace, tojson,
# raise_exception and the special tokens as variables: what transformers' environment provides.
QWEN_LIKE = """{% set ns = namespace(turns=0) %}
{% if messages[0]['role'] == 'system' %}
<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
    {% for message in messages %}
        {% if message['role'] == 'system' %}{% continue %}{% endif %}
        {% if message['role'] not in ['user', 'assistant'] %}{{ raise_exception('role ' + message['role']) }}{% endif %}
        {% set ns.turns = ns.turns + 1 %}
<|im_start|>{{ message['role'] }}
{{ message['content'] | trim }}<|im_end|>
    {% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}{{ {'turns': ns.turns, 'eos': eos_token, "quote": "<a & 'b'>"} | tojson }}"""


def _templates() -> dict[str, str]:
    from rlmix.embedded.minicode_agent.model import CHAT_TEMPLATE as AGENT
    from rlmix.embedded.v2.bpe import CHAT_TEMPLATE as CHATML

    return {"v2_chatml": CHATML, "agent": AGENT, "llama3": LLAMA3, "qwen_like": QWEN_LIKE}


@pytest.mark.parametrize("place", ["config", "jinja_file"])
@pytest.mark.parametrize("name", ["v2_chatml", "agent", "llama3", "qwen_like"])
def test_a_chat_template_renders_as_transformers_renders_it_without_transformers(char_model_dir, tmp_path, name,
                                                                                place):
    import shutil

    from rlmix.models.io import load_tokenizer
    from rlmix.tasks.chat import prompt_messages, render_ids

    template = _templates()[name]
    path = tmp_path / "model"
    shutil.copytree(char_model_dir, path)
    if place == "config":
        config = json.loads((path / "tokenizer_config.json").read_text()) | {"chat_template": template}
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    else:
        (path / "chat_template.jinja").write_text(template)
    ours, theirs = load_fast_tokenizer(path), load_tokenizer(path)
    assert isinstance(ours, FileTokenizer) and ours.chat_template == theirs.chat_template == template
    conversations = [prompt_messages("def f(x):"), prompt_messages("return x", system_prompt="be brief"),
                     [{"role": "user", "content": " abc "}, {"role": "assistant", "content": "xyz\n"},
                      {"role": "user", "content": "(1,2)"}]]
    for messages in conversations:
        for prompt in (True, False):
            assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt) == \
                theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt), (messages, prompt)
        assert render_ids(ours, messages) == render_ids(theirs, messages)
    if name == "qwen_like":  # the template's own error, as transformers raises it
        import jinja2

        bad = [{"role": "tool", "content": "x"}]
        for tok in (ours, theirs):
            with pytest.raises(jinja2.exceptions.TemplateError, match="role tool"):
                tok.apply_chat_template(bad, tokenize=False)


def test_a_sampler_renders_the_v2_template_without_importing_transformers(char_model_dir, tmp_path):
    """The point of the reader: a process that encodes prompts through a template never pays
    transformers' import (seconds of every sampler's start-up)."""
    import shutil
    import subprocess
    import sys

    path = tmp_path / "model"
    shutil.copytree(char_model_dir, path)
    (path / "chat_template.jinja").write_text(_templates()["v2_chatml"])
    script = ("import sys\nfrom rlmix.models.tokenizer_file import load_fast_tokenizer\n"
              "from rlmix.tasks.chat import prompt_messages, render_ids\n"
              f"tok = load_fast_tokenizer({str(path)!r})\n"
              "assert render_ids(tok, prompt_messages('def f(x):'))\n"
              "assert 'transformers' not in sys.modules, 'transformers was imported'\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_bad_tokenizer_file_and_non_model_dir_are_config_errors(char_model_dir, tmp_path):
    import shutil

    with pytest.raises(ConfigError, match="no config.json"):
        load_fast_tokenizer(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(char_model_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="no loadable tokenizer"):
        load_fast_tokenizer(broken)

