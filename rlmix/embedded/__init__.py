"""The built-in toy: what a run trains on when it names no model and no dataset (docs/embedded.md).

``minicode`` and ``minicode_lang`` (the task and its language), ``chartok`` (the character
tokenizer), ``model`` (the embedded model's build and cache), ``warmstart`` (the one supervised
warm-start loop, and the single-turn warm start), ``sample`` (plain HF sampling for its reward), and
``minicode_agent`` (minicode as a sandboxed agentic task, and the agent model warm-started on it),
and ``v2`` (the v2 embedded model: a byte-level BPE tokenizer and a small Qwen3-MoE, own cache key).
Generic model I/O stays in ``rlmix.models``; the schemas in ``rlmix.config.embedded``.
"""
