"""The workload of ``make bench-peer``: one model, one prompt file, one reward, shared by rlmix and TRL.

``build_workload(root)`` writes, once per benchmark run:

- ``model/``: a random tiny Qwen3 (``model_type: qwen3``; hidden 128, 2 layers, 4 query heads over
  2 KV heads of 32), saved with ``save_pretrained`` beside a fast byte-level BPE tokenizer
  (``tokenizer.json``) with a ChatML template, as Qwen3 has: an ordinary Hugging Face directory
  that rlmix (``model.path=``) and TRL (``GRPOTrainer(model=<dir>)``) each load their own way.
- ``prompts.jsonl``: rows ``{"question", "answer"}`` of small arithmetic. Each side turns the
  question into one user message and renders it with the tokenizer's template (rlmix:
  ``task.prompt_key=question``; TRL: a conversational ``prompt`` column), so both sample from the
  same prompt ids.
- ``peer_reward.py``: scripts/peer_reward.py, imported from the workload directory by both.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REWARD_MODULE = "peer_reward"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINGS = ("pens", "rats", "cups", "keys", "apples", "coins")
MODEL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=False)


@dataclass(frozen=True)
class Workload:
    root: Path  # both trainers run with this as their working directory
    model_dir: Path
    prompts: Path
    reward_spec: str  # rlmix's task.reward

    def rlmix_overrides(self) -> list[str]:
        """rlmix's task and model for this workload (the loop's sizes are the caller's)."""
        return ["task=dataset", f"model.path={self.model_dir}", f"task.train_files={self.prompts}",
                "task.prompt_key=question", "task.answer_key=answer", f"task.reward={self.reward_spec}"]


def arithmetic_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, thing = rng.randint(2, 30), rng.randint(1, 9), rng.choice(THINGS)
        if rng.random() < 0.5:
            rows.append({"question": f"{a} {thing} and {b} more {thing}: how many?", "answer": str(a + b)})
        else:
            rows.append({"question": f"{a} {thing}, {b} taken away: how many left?", "answer": str(a - b)})
    return rows


def train_tokenizer(rows: list[dict], vocab_size: int = 384):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on the prompts, with the ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [f"{r['question']} {r['answer']}" for r in rows] + ["system user assistant"]
    tok.train_from_iterator(corpus * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHATML
    return fast


def save_qwen3(path: Path, rows: list[dict], seed: int = 0) -> Path:
    """A random tiny ``Qwen3ForCausalLM`` (``MODEL``) and its tokenizer, saved to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = train_tokenizer(rows)
    config = Qwen3Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, **MODEL)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_workload(root: Path, rows: int = 256, seed: int = 0) -> Workload:
    root.mkdir(parents=True, exist_ok=True)
    data = arithmetic_rows(rows, seed)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in data))
    shutil.copy(SCRIPTS / f"{REWARD_MODULE}.py", root / f"{REWARD_MODULE}.py")
    model_dir = save_qwen3(root / "model", data, seed)
    return Workload(root, model_dir, prompts, f"{REWARD_MODULE}:reward")
