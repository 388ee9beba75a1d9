"""One sampler serving the turns of many concurrent episodes.

Episode threads call ``TurnBatcher.generate`` (the ``Sampler.generate`` signature, one prompt) and
block; one generation thread takes everything queued whenever the sampler is free and serves it
in one ``Sampler.generate`` call. While some episodes wait on their tools, the others' turns are
generated, so tool execution never holds the sampler, and the more episodes wait at once the
larger the batch (the torch sampler's cost grows far slower than its batch; vLLM batches anyway).

Per-row budgets differ (each episode has its own tokens left): the batch generates up to the
largest and each row is cut to its own budget, which is what sampling it alone would have drawn
up to that length (tokens are drawn left to right). A turn that brings its own seed (``ModelPolicy``
derives one per task, sample and turn) is drawn from it as the call's row seed, so which turns
happened to arrive together does not change what any of them draws, and a rerun of a request plays
the same episodes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from rlmix.rollout import FINISH_LENGTH, Rollouts, SamplingParams


def _seed(base: int | None, call: int) -> int | None:
    return None if base is None else (base * 1_000_003 + call) & ((1 << 63) - 1)


def cut_row(rollouts: Rollouts, row: int, budget: int) -> Rollouts:
    """Row ``row`` alone, its completion cut to ``budget`` tokens (finish ``length`` if that cut it)."""
    one = rollouts.rows(slice(row, row + 1))
    n = int(one.mask[0].sum())
    if n <= budget:
        return one
    mask = one.mask.clone()
    mask[0, budget:] = False
    fields = {f: getattr(one, f)[:, :budget] for f in ("completion_ids", "sampler_logprobs", "head_ids",
                                                        "head_logprobs", "support_ids", "support_probs")
              if getattr(one, f) is not None}
    return one.replace(mask=mask[:, :budget], finish_reason=(FINISH_LENGTH,), **fields)


class TurnBatcher:
    """Implements ``Sampler.generate`` for one prompt at a time, batching concurrent callers."""

    def __init__(self, sampler, seed: int | None = None):
        self.sampler = sampler
        self._seed, self._calls = seed, 0
        self._queue: list[tuple[list[int], SamplingParams, Future]] = []
        self._cond = threading.Condition()
        self._closed = False
        self.batch_sizes: list[int] = []  # one entry per sampler call (for the bench and tests)
        self._thread = threading.Thread(target=self._serve, name="turn-batcher", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.sampler.version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        if len(prompts) != 1:
            raise ValueError(f"TurnBatcher.generate takes one prompt per call, got {len(prompts)}")
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the turn batcher is closed")
            self._queue.append((list(prompts[0]), params, future))
            self._cond.notify()
        return future.result()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            self._run(batch)

    def _run(self, batch: list[tuple[list[int], SamplingParams, Future]]) -> None:
        budgets = [params.max_new_tokens for _, params, _ in batch]
        seeds = [params.seed for _, params, _ in batch]  # a seeded turn draws what it would draw alone
        params = dataclasses.replace(batch[0][1], max_new_tokens=max(budgets), seed=_seed(self._seed, self._calls),
                                     row_seeds=tuple(seeds) if None not in seeds else None)
        self._calls += 1
        self.batch_sizes.append(len(batch))
        try:
            out = self.sampler.generate([prompt for prompt, _, _ in batch], params)
            rows = [cut_row(out, row, budgets[row]) for row in range(len(batch))]
        except BaseException as err:  # every waiting episode learns of it, none hangs
            for _, _, future in batch:
                future.set_exception(err)
            return
        for row, (_, _, future) in zip(rows, batch):
            future.set_result(row)
