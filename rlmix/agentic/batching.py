"""One sampler serving the turns of many concurrent episodes.

Episode threads call ``TurnBatcher.generate`` (the ``Sampler.generate`` signature, one prompt) and
block; one generation thread serves them. While some episodes wait on their tools, the others'
turns are generated, so tool execution never holds the sampler, and the more episodes wait at once
the larger the batch (the torch sampler's cost grows far slower than its batch; vLLM batches anyway).

Two ways to serve, by what the sampler offers:
- **continuous** (a sampler with ``decode_batch``: the torch sampler; ``rlmix.samplers.continuous``):
  a turn joins the running decode batch at the next step and leaves it when it is done, so every
  waiting episode decodes in every step and a finished turn returns at once;
- **whole calls** (any other sampler, or ``continuous=False``): everything queued whenever the
  sampler is free, in one ``Sampler.generate`` call that returns when its longest turn is done.

Per-row budgets differ (each episode has its own tokens left): a whole call generates up to the
largest and each row is cut to its own budget, which is what sampling it alone would have drawn
up to that length (tokens are drawn left to right); a continuous row stops at its own. A turn that brings its own seed (``ModelPolicy``
derives one per task, sample and turn) is drawn from it as its row's seed, so which turns happened
to arrive together does not change what any of them draws, and a rerun of a request plays the same
episodes: exactly under the exact view, and with one episode at a time (``task.concurrent_episodes=1``)
under every view. (Kernels that sum keys in fixed column blocks see other block edges when a row
shares a batch with longer ones, in a whole call and in a continuous batch alike.)
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
    if one.routed_experts is not None:  # the cut tokens' positions were routed, and the last kept one is never fed
        routes = one.routed_experts[:, : one.prompt_ids.shape[1] + budget].clone()
        routes[:, int(one.prompt_lens[0]) + budget - 1 :] = -1
        fields["routed_experts"] = routes
    return one.replace(mask=mask[:, :budget], finish_reason=(FINISH_LENGTH,), **fields)


class TurnBatcher:
    """Implements ``Sampler.generate`` for one prompt at a time, batching concurrent callers."""

    def __init__(self, sampler, seed: int | None = None, continuous: bool = True):
        self.sampler = sampler
        self.continuous = continuous and hasattr(sampler, "decode_batch")
        self._seed, self._calls = seed, 0
        self._queue: list[tuple[list[int], SamplingParams, Future]] = []
        self._cond = threading.Condition()
        self._closed = False
        # For the bench and tests: turns per sampler call (whole calls) or per join (continuous), and
        # live rows per decode step (continuous).
        self.batch_sizes: list[int] = []
        self.step_rows: list[int] = []
        serve = self._serve_continuous if self.continuous else self._serve
        self._thread = threading.Thread(target=serve, name="turn-batcher", daemon=True)
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

    def _take(self, busy: bool = False) -> list | None:
        """Everything queued; waits for a turn unless ``busy``; None once closed and drained."""
        with self._cond:
            while not self._queue and not self._closed and not busy:
                self._cond.wait()
            if not self._queue and not busy:
                return None
            batch, self._queue = self._queue, []
            return batch

    def _call_params(self, batch: list[tuple[list[int], SamplingParams, Future]]) -> SamplingParams:
        """The first turn's params for the whole batch, with the longest budget; a seeded turn draws
        what it would draw alone (its seed becomes its row's)."""
        seeds = [params.seed for _, params, _ in batch]
        params = dataclasses.replace(batch[0][1], max_new_tokens=max(p.max_new_tokens for _, p, _ in batch),
                                     seed=_seed(self._seed, self._calls),
                                     row_seeds=tuple(seeds) if None not in seeds else None)
        self._calls += 1
        self.batch_sizes.append(len(batch))
        return params

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            self._run(batch)

    def _run(self, batch: list[tuple[list[int], SamplingParams, Future]]) -> None:
        budgets = [params.max_new_tokens for _, params, _ in batch]
        params = self._call_params(batch)
        try:
            out = self.sampler.generate([prompt for prompt, _, _ in batch], params)
            rows = [cut_row(out, row, budgets[row]) for row in range(len(batch))]
        except BaseException as err:  # every waiting episode learns of it, none hangs
            for _, _, future in batch:
                future.set_exception(err)
            return
        for row, (_, _, future) in zip(rows, batch):
            future.set_result(row)

    def _serve_continuous(self) -> None:
        running = None
        while (batch := self._take(busy=running is not None and len(running) > 0)) is not None:
            try:
                if batch:
                    running = self._join(running, batch)
                self.step_rows.append(len(running))
                for future, row in running.step():
                    future.set_result(row)
            except BaseException as err:  # every waiting episode learns of it, none hangs
                failed = [future for _, _, future in batch] + (running.handles if running is not None else [])
                for future in failed:
                    if not future.done():
                        future.set_exception(err)
                running = None

    def _join(self, running, batch: list[tuple[list[int], SamplingParams, Future]]):
        params = self._call_params(batch)
        if running is None or len(running) == 0:
            running = self.sampler.decode_batch(params)
        running.join([prompt for prompt, _, _ in batch], [p for _, p, _ in batch],
                     self.sampler.uniforms(len(batch), params), [future for _, _, future in batch])
        return running
