"""The v2 embedded model: a byte-level BPE tokenizer trained in-process (``bpe``) and a small
Qwen3-MoE warm-started on minicode through its chat template (``model``). docs/embedded.md."""
