"""Unbiased pass@k (docs/math.md §7; Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), c of n correct.

    pass@k = 1 - C(n-c, k) / C(n, k), and 1 when n - c < k. Computed as a running product
    so it stays exact-ish for large n without huge binomials.
    """
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class PassAtK:
    k: int
    mean: float
    stderr: float  # sqrt(var_tasks / n_tasks), population variance over tasks
    num_tasks: int


def mean_pass_at_k(samples: Sequence[tuple[int, int]], k: int) -> PassAtK:
    """Average pass@k over tasks given (n, c) per task, with its standard error."""
    if not samples:
        raise ValueError("mean_pass_at_k needs at least one task")
    values = [pass_at_k(n, c, k) for n, c in samples]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return PassAtK(k=k, mean=mean, stderr=math.sqrt(var / len(values)), num_tasks=len(values))
