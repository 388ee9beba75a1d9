"""The one reward of ``make bench-peer``, called by both trainers on the same rows.

rlmix calls ``reward`` itself (``task.reward=peer_reward:reward``); TRL's ``GRPOTrainer`` calls
``trl_reward``, its ``reward_funcs`` signature, which scores each completion with ``reward`` and
the row TRL passes column by column. Standard library only: it is imported in rlmix's environment
and in TRL's (scripts/bench_peer.py copies it next to the workload).

The score varies between samples of a random model, so a group's rewards are rarely all equal and
both trainers do the full work of a step (TRL and rlmix alike compute the loss of every group).
"""

from __future__ import annotations

ROW_KEYS = ("question", "answer")  # the columns of a row of the workload's prompts.jsonl


def reward(completion: str, answer, row: dict) -> float:
    """1 for exactly the answer; else 0.5 if the answer appears in the text, plus 0.25 × the share
    of the first four characters that are digits."""
    text, target = completion.strip(), str(answer)
    if text == target:
        return 1.0
    digits = sum(ch.isdigit() for ch in text[:4])
    return 0.5 * (target in text) + 0.25 * digits / 4


def completion_text(completion) -> str:
    """TRL's completion: the text, or for chat prompts the list of messages it generated."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def trl_reward(prompts: list, completions: list, **columns) -> list[float]:
    """``reward`` on each completion, with the row rebuilt from the dataset columns TRL passes."""
    rows = [{key: columns[key][i] for key in ROW_KEYS} for i in range(len(completions))]
    return [reward(completion_text(c), row["answer"], row) for c, row in zip(completions, rows)]
