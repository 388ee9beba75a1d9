"""Unbiased pass@k (docs/math.md §7) against brute-force enumeration over subsets."""

from __future__ import annotations

import itertools
import math

import pytest

from rlmix.metrics.passk import mean_pass_at_k, pass_at_k


def _brute_force(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 2, 3) == 1.0  # n − c < k
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_inputs(n, c, k):
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_with_standard_error():
    result = mean_pass_at_k([(4, 0), (4, 4), (4, 2)], k=2)
    values = [0.0, 1.0, 1 - (1 / 6)]  # C(2,2)/C(4,2) = 1/6
    mean = sum(values) / 3
    var = sum((v - mean) ** 2 for v in values) / 3
    assert result.k == 2 and result.num_tasks == 3
    assert result.mean == pytest.approx(mean)
    assert result.stderr == pytest.approx(math.sqrt(var / 3))
    with pytest.raises(ValueError):
        mean_pass_at_k([], k=1)
