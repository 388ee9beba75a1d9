"""The torch sampler's prefix cache: the KV of token sequences it has already run, reused by a later
prompt that starts with one of them.

A multi-turn episode sends, each turn, its whole context: the previous prompt, the policy's
completion, the environment's reply. Everything up to the completion is what the previous call ran,
so its keys and values are already known; the cache keeps them per sequence, and the next call
prefills only the tokens after the longest cached common prefix. A position's KV depends on the
tokens at and before it only (causal attention), so any common prefix is reusable, not only a whole
cached sequence.

Lookup is by an index of each entry's prefixes at every ``BLOCK`` tokens (hashes of the token
tuples; a candidate is then compared token by token, so a hash collision costs a comparison, never
a wrong match): a prompt walks its own block prefixes while they are indexed, and the longest common
prefix with the entries at the deepest one wins. So a lookup does not scan every entry, and a match
shorter than one block (a shared chat header) is not worth a copy and is not made.

Entries hold values in the pool's KV format (what the cache columns held after ``round_kv``), are
tagged with the weight version that computed them and are never served to another version. For a
mixture-of-experts model they also hold the experts each position was routed to when its KV was
computed, which a reusing call records for those positions (``Rollouts.routed_experts``). Memory
is bounded by ``max_bytes``: least recently used entries go first, and an entry a later prompt
extended in full is dropped once that prompt's own entry replaces it.

Shapes: P decoder layers, Hkv KV heads, n cached tokens, D head dim, M sparse layers, k experts per token.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK = 16  # tokens between indexed prefixes


@dataclass(frozen=True)
class CachedPrefix:
    tokens: tuple[int, ...]
    k: torch.Tensor  # (P, Hkv, n, D), values in the pool's KV format
    v: torch.Tensor
    version: int
    routes: torch.Tensor | None = None  # (n, M, k) int16: mixture-of-experts models only

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + (self.routes.nbytes if self.routes is not None else 0)


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
        self._index: defaultdict[int, dict[tuple[int, ...], None]] = defaultdict(dict)  # prefix hash -> entries
        self.nbytes = 0
        self.hits = self.reused_tokens = 0  # lifetime counters (benchmarks and tests read them)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    @staticmethod
    def _keys(tokens: tuple[int, ...]) -> list[int]:
        return [hash(tokens[:n]) for n in range(BLOCK, len(tokens) + 1, BLOCK)]

    def match(self, prompt: tuple[int, ...], version: int) -> tuple[CachedPrefix | None, int]:
        """The entry of ``version`` sharing the longest prefix with ``prompt`` (at least ``BLOCK`` tokens)
        and that length, at most ``len(prompt) - 1`` (the last prompt token is always fed: its logits
        start the completion)."""
        candidates: dict[tuple[int, ...], None] = {}
        for key in self._keys(prompt):
            found = self._index.get(key)
            if not found:
                break
            candidates = found
        best, best_n = None, 0
        for tokens in candidates:
            entry = self._entries[tokens]
            if entry.version != version:
                continue
            n = common_prefix(prompt, entry.tokens, len(prompt) - 1)
            if n > best_n:
                best, best_n = entry, n
        if best is not None:
            self._entries.move_to_end(best.tokens)
            self.hits += 1
            self.reused_tokens += best_n
        return best, best_n

    def discard(self, tokens: tuple[int, ...]) -> None:
        entry = self._entries.pop(tokens, None)
        if entry is None:
            return
        self.nbytes -= entry.nbytes
        for key in self._keys(tokens):
            found = self._index.get(key)
            if found is not None:
                found.pop(tokens, None)
                if not found:
                    del self._index[key]

    def store(self, entry: CachedPrefix) -> None:
        """Keep ``entry`` (replacing one of the same tokens); entries of older versions are dropped,
        then the least recently used until the cache fits ``max_bytes``. Sequences shorter than one
        block could never be matched and are not kept."""
        if self.max_bytes <= 0 or entry.nbytes > self.max_bytes or len(entry.tokens) < BLOCK:
            return
        if self._entries and next(iter(self._entries.values())).version != entry.version:
            self.clear()  # every entry holds one version: the ones before were all dropped here
        self.discard(entry.tokens)
        self._entries[entry.tokens] = entry
        for key in self._keys(entry.tokens):
            self._index[key][entry.tokens] = None
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self.discard(next(iter(self._entries)))
