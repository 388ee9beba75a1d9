"""Evaluation: unbiased pass@k (light to import); ``rlmix eval`` and ``rlmix probe`` live in submodules."""

from rlmix.eval.passk import PassAtK, mean_pass_at_k, pass_at_k

__all__ = ["PassAtK", "mean_pass_at_k", "pass_at_k"]
