"""Evaluation library: the mismatch probe (``probe``). pass@k is in ``rlmix.metrics.passk``; the commands in ``rlmix.commands``."""
