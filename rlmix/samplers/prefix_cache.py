"""The torch sampler's prefix cache: the KV of token sequences it has already run, reused by a later
prompt that starts with one of them.

A multi-turn episode sends, each turn, its whole context: the previous prompt, the policy's
completion, the environment's reply. Everything up to the completion is what the previous call ran,
so its keys and values are already known; the cache keeps them per sequence, and the next call
prefills only the tokens after the longest cached common prefix. A position's KV depends on the
tokens at and before it only (causal attention), so any common prefix is reusable, not only a whole
cached sequence.

Entries hold values in the pool's KV format (what the cache columns held after ``round_kv``), are
tagged with the weight version that computed them and are never served to another version. Memory
is bounded by ``max_bytes``: least recently used entries go first, and an entry a later prompt
extended in full is dropped once that prompt's own entry replaces it.

Shapes: P decoder layers, Hkv KV heads, n cached tokens, D head dim.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CachedPrefix:
    tokens: tuple[int, ...]
    k: torch.Tensor  # (P, Hkv, n, D), values in the pool's KV format
    v: torch.Tensor
    version: int

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit`` (binary search on
    slice equality: C-level comparisons, no per-token Python loop)."""
    hi = min(len(a), len(b), limit)
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # a[:lo] == b[:lo] holds; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """Sequences the sampler ran and their KV, least recently used first; ``max_bytes`` 0 disables it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self.nbytes = 0
        self.hits = self.reused_tokens = 0  # lifetime counters (benchmarks and tests read them)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def match(self, prompt: tuple[int, ...], version: int) -> tuple[CachedPrefix | None, int]:
        """The entry of ``version`` sharing the longest prefix with ``prompt`` and that length, at most
        ``len(prompt) - 1`` (the last prompt token is always fed: its logits start the completion)."""
        best, best_n = None, 0
        limit = len(prompt) - 1
        for entry in self._entries.values():
            if entry.version != version or not entry.tokens or entry.tokens[0] != prompt[0]:
                continue
            n = common_prefix(prompt, entry.tokens, limit)
            if n > best_n:
                best, best_n = entry, n
        if best is not None:
            self._entries.move_to_end(best.tokens)
            self.hits += 1
            self.reused_tokens += best_n
        return best, best_n

    def discard(self, tokens: tuple[int, ...]) -> None:
        entry = self._entries.pop(tokens, None)
        if entry is not None:
            self.nbytes -= entry.nbytes

    def store(self, entry: CachedPrefix) -> None:
        """Keep ``entry`` (replacing one of the same tokens); entries of older versions are dropped,
        then the least recently used until the cache fits ``max_bytes``."""
        if self.max_bytes <= 0 or entry.nbytes > self.max_bytes:
            return
        if any(e.version != entry.version for e in self._entries.values()):
            for stale in [t for t, e in self._entries.items() if e.version != entry.version]:
                self.discard(stale)
        self.discard(entry.tokens)
        self._entries[entry.tokens] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self.discard(next(iter(self._entries)))
