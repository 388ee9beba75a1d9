"""TRL's GRPOTrainer on the workload of ``make bench-peer``, for scripts/bench_peer.py to time.

    .venv-peer/bin/python scripts/peer_trl.py --workload DIR [--steps 12] [--groups 16]
                                              [--group-size 8] [--max-new-tokens 24]

Runs inside TRL's own environment (.venv-peer/, requirements/peer.lock) and imports nothing of
rlmix. ``DIR`` is what scripts/peer_workload.py wrote: ``model/``, ``prompts.jsonl`` and
``peer_reward.py``, whose ``trl_reward`` is the reward rlmix calls as ``peer_reward:reward``.

TRL as its documentation sets it up on a CPU (``use_cpu=True``, plain ``model.generate``, no vLLM),
sized so that each optimizer step is one generation batch: ``--groups`` prompts × ``--group-size``
completions (``per_device_train_batch_size`` = ``generation_batch_size`` = 128 completions,
``gradient_accumulation_steps`` = ``steps_per_generation`` = ``num_iterations`` = 1),
``beta=0`` (no reference model), at most ``--max-new-tokens`` new tokens, no evaluation, no
checkpoints, no logging service. Its other defaults stay, bf16 autocast over fp32 weights among
them (rlmix's trainer computes the same way), except one, so that both trainers do the same work:
``activation_checkpointing=False`` (TRL turns it on, as ``gradient_checkpointing``; rlmix's
trainer keeps activations unless asked, and recomputing them would slow TRL's step).

Prints ``peer step N/M`` at the end of each optimizer step (``TrainerCallback.on_step_end``;
scripts/bench_peer.py stamps those lines with the time since launch, as it stamps rlmix's step
lines), then one JSON object: seconds from this process's start to the end of each step, the
steps' durations, and the completions the reward scored per step (a check of the sizing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil


def since_start() -> float:
    """Seconds since this process was created (its imports included)."""
    return time.time() - psutil.Process().create_time()


def load_rows(path: Path) -> list[dict]:
    """The workload's rows as TRL's conversational dataset: the question as one user message."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"prompt": [{"role": "user", "content": r["question"]}], **r} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--groups", type=int, default=16, help="prompts per optimizer step")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(args.workload))
    from peer_reward import trl_reward

    scored: list[int] = []  # completions per reward call: one call per generation batch

    def reward(prompts, completions, **columns):
        scored.append(len(completions))
        return trl_reward(prompts, completions, **columns)

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, train_args, state, control, **kwargs):
            self.ends.append(since_start())
            print(f"peer step {state.global_step}/{args.steps}", flush=True)

    completions = args.groups * args.group_size
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, seed=args.seed, max_steps=args.steps,
            per_device_train_batch_size=completions, gradient_accumulation_steps=1, num_generations=args.group_size,
            num_iterations=1, max_completion_length=args.max_new_tokens, beta=0.0, activation_checkpointing=False,
            eval_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, logging_steps=args.steps,
        )
        # One update per generation batch of exactly groups x group_size completions.
        assert (config.generation_batch_size, config.steps_per_generation) == (completions, 1), config
        clock = StepClock()
        trainer = GRPOTrainer(model=str(args.workload / "model"), reward_funcs=reward, args=config,
                              train_dataset=Dataset.from_list(load_rows(args.workload / "prompts.jsonl")),
                              callbacks=[clock])
        trainer.train()
    ends = clock.ends
    print(json.dumps({
        "first_step_s": round(ends[0], 3),
        "step_end_s": [round(t, 3) for t in ends],
        "step_s": [round(b - a, 3) for a, b in zip(ends, ends[1:])],  # steps 2..N
        "completions_per_step": scored,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "activation_checkpointing": trainer.model.is_activation_checkpointing,
    }), flush=True)


if __name__ == "__main__":
    main()
